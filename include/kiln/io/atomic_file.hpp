// write_file_atomically: writes a file through a temporary next to it and renames it into place, so a failed or
// interrupted write never destroys the file that was there.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln::io {

inline void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  std::filesystem::path temporary = path;
  temporary += ".tmp-kiln";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot open '", temporary.string(), "' for writing (writing '", path.string(), "')");
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      fail("writing '", temporary.string(), "' failed after ", contents.size(), " bytes were requested");
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    fail("cannot rename '", temporary.string(), "' to '", path.string(), "'");
  }
}

}  // namespace kiln::io
