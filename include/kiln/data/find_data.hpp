// find_data_dir: where the data sets live. Examples, tests and benches take --data DIR, but should also just work from
// a checkout whose data was fetched by scripts/fetch_data, and say exactly where they looked when it was not.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/switches.hpp"

namespace kiln::data {

namespace detail {
KILN_LIBRARY_FUNCTION std::filesystem::path executable_dir();
// find_data_dir's search, with the source tree to look in (nullptr: none), which the program's definition gives.
KILN_LIBRARY_FUNCTION std::filesystem::path find_data_dir(const std::string& subdir,
                                                          const std::filesystem::path& explicit_path,
                                                          const char* source_dir);
}  // namespace detail

// Returns the directory holding data set `subdir` (e.g. "mnist"), looking in this order:
//   1. explicit_path/subdir, or explicit_path itself when its last component is `subdir` (the --data option)
//   2. $KILN_DATA/subdir
//   3. ./data/subdir
//   4. ../shared/data/subdir
//   5. <source>/data/subdir and <source>/../shared/data/subdir when the program was built with KILN_SOURCE_DIR defined
//   6. data/subdir and ../shared/data/subdir next to the executable and up to three directories above it
// Throws kiln::error listing every place tried and how to get the data (scripts/fetch_data).
inline std::filesystem::path find_data_dir(const std::string& subdir, const std::filesystem::path& explicit_path = {}) {
#ifdef KILN_SOURCE_DIR
  return detail::find_data_dir(subdir, explicit_path, KILN_SOURCE_DIR);
#else
  return detail::find_data_dir(subdir, explicit_path, nullptr);
#endif
}

#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION std::filesystem::path detail::executable_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);  // Linux; elsewhere this step is skipped
  return ec ? std::filesystem::path() : exe.parent_path();
}

KILN_LIBRARY_FUNCTION std::filesystem::path detail::find_data_dir(const std::string& subdir,
                                                                  const std::filesystem::path& explicit_path,
                                                                  const char* source_dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, fs::path>> tried;  // (why, where)
  auto try_dir = [&](std::string why, const fs::path& dir) -> bool {
    std::error_code ec;
    // The walk up from the executable can reach the same place twice (at the root): list it once.
    const fs::path normal = dir.lexically_normal();
    for (const auto& [earlier_why, earlier] : tried)
      if (earlier.lexically_normal() == normal) return false;
    tried.emplace_back(std::move(why), dir);
    return fs::is_directory(dir, ec);
  };
  if (!explicit_path.empty()) {
    if (try_dir("--data", explicit_path / subdir)) return explicit_path / subdir;
    if (explicit_path.filename() == subdir && try_dir("--data", explicit_path)) return explicit_path;
  } else {
    tried.emplace_back("--data", fs::path("(not given)"));
  }
  if (const char* env = environment_setting("KILN_DATA"); env && *env) {
    if (try_dir("$KILN_DATA", fs::path(env) / subdir)) return fs::path(env) / subdir;
  } else {
    tried.emplace_back("$KILN_DATA", fs::path("(not set)"));
  }
  if (try_dir("./data", fs::path("data") / subdir)) return fs::path("data") / subdir;
  if (try_dir("../shared/data", fs::path("..") / "shared" / "data" / subdir))
    return fs::path("..") / "shared" / "data" / subdir;
  if (source_dir) {
    fs::path source(source_dir);
    if (try_dir("source tree", source / "data" / subdir)) return source / "data" / subdir;
    if (try_dir("source tree", source.parent_path() / "shared" / "data" / subdir))
      return source.parent_path() / "shared" / "data" / subdir;
  }
  fs::path dir = executable_dir();
  for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
    if (try_dir("near the executable", dir / "data" / subdir)) return dir / "data" / subdir;
    if (try_dir("near the executable", dir.parent_path() / "shared" / "data" / subdir))
      return dir.parent_path() / "shared" / "data" / subdir;
    if (dir == dir.parent_path()) break;
  }

  std::string message = "find_data_dir: data set '" + subdir + "' not found. Places tried, in order:";
  std::error_code ec;
  for (const auto& [why, where] : tried) {
    fs::path shown = where.is_relative() && where.string().front() != '(' ? fs::absolute(where, ec) : where;
    message += "\n  " + why + ": " + (ec ? where.string() : shown.string());
  }
  message += "\nDownload the data sets with `scripts/fetch_data [DIR]` (MNIST and Fashion-MNIST from public mirrors, "
             "MD5-checked; default DIR ./data), then pass --data DIR or set KILN_DATA=DIR.";
  throw error(message);
}
#endif

}  // namespace kiln::data
