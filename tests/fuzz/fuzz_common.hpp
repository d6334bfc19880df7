// What the fuzz targets share. Each target is a libFuzzer entry point over one reader: a kiln::error is the reader
// refusing the input, which is correct; anything else (a crash, a sanitizer report, another exception, a leak, a
// timeout) is a bug that libFuzzer reports. Readers that take a path get the input written to a file of this
// process's own, in /dev/shm where there is one (no disk write per input).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln_fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                     : std::filesystem::temp_directory_path();
    auto d = base / ("kiln_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write the scratch file %s\n", path.c_str());
    std::abort();
  }
}
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The input written to scratch_dir()/name.
inline std::filesystem::path input_file(const std::string& name, const std::uint8_t* data, std::size_t size) {
  auto path = scratch_dir() / name;
  write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  return path;
}

// Runs f; true when it refused its input with kiln::error. Other exceptions propagate, and libFuzzer reports them.
template <class F>
bool refused(F&& f) {
  try {
    f();
    return false;
  } catch (const kiln::error&) {
    return true;
  }
}

// A property the target checks: a failure is a bug, reported as a crash with the reason.
inline void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace kiln_fuzz
