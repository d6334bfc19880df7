// Helpers shared by the data-layer tests: a private temporary directory, file writers and error-message checks.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"

namespace test_data {

namespace fs = std::filesystem;
using bytes = std::vector<unsigned char>;

// A fresh directory under the system temp dir, removed when the test process ends.
inline const fs::path& temp_dir() {
  static struct holder {
    fs::path path;
    holder() {
      path = fs::temp_directory_path() / ("kiln_test_data_" + std::to_string(::getpid()));
      fs::remove_all(path);
      fs::create_directories(path);
    }
    ~holder() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

inline fs::path write_file(const std::string& name, const bytes& content) {
  fs::path p = temp_dir() / name;
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(content.data()),
                                           static_cast<std::streamsize>(content.size()));
  return p;
}
inline fs::path write_text(const std::string& name, const std::string& content) {
  return write_file(name, bytes(content.begin(), content.end()));
}
inline bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), {});
}
// Writes `content` to `path` as a gzip stream.
inline void write_gzip(const fs::path& path, const bytes& content) {
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f);
  REQUIRE(gzwrite(f, content.data(), static_cast<unsigned>(content.size())) == static_cast<int>(content.size()));
  gzclose(f);
}
inline bytes gzip(const bytes& content) {
  fs::path p = temp_dir() / "gzip_scratch.gz";
  write_gzip(p, content);
  return read_bytes(p);
}

// An IDX file: header for `dims` then `payload` bytes (which need not agree with the header).
inline bytes idx(std::initializer_list<std::uint32_t> dims, std::size_t payload, unsigned char type = 0x08) {
  bytes b{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<unsigned char>(d >> shift));
  for (std::size_t i = 0; i < payload; ++i) b.push_back(static_cast<unsigned char>(i * 7 + 3));
  return b;
}

// Runs `f`, which must throw kiln::error whose message contains every one of `parts`.
inline void check_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL("expected kiln::error containing '", *parts.begin(), "'");
  } catch (const kiln::error& e) {
    std::string message = e.what();
    for (const auto& part : parts) {
      INFO("message: ", message);
      CHECK_MESSAGE(message.find(part) != std::string::npos, "missing '", part, "'");
    }
  }
}

}  // namespace test_data
