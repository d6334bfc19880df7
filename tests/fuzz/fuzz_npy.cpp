// libFuzzer target: the .npy reader over an arbitrary file (plain or gzip): the header alone, then the data as each
// element type kiln reads. What is read is written back out and read again to the same values.
#include <cstdint>
#include <cstring>

#include "fuzz_common.hpp"
#include "kiln/data/npy.hpp"

namespace {
template <class T>
void read_as(const std::filesystem::path& path) {
  kiln::Tensor<T> t;
  if (kiln_fuzz::refused([&] { t = kiln::data::read_npy<T>(path, {.max_bytes = 1 << 24}); })) return;
  const auto copy = kiln_fuzz::scratch_dir() / "written.npy";
  kiln::data::write_npy(copy, t);
  const auto back = kiln::data::read_npy<T>(copy);
  // An empty array may have no storage at all, and memcmp must not be given a null pointer even for zero bytes.
  const auto bytes = static_cast<std::size_t>(t.numel()) * sizeof(T);
  kiln_fuzz::require(back.shape() == t.shape() && (bytes == 0 || std::memcmp(back.data(), t.data(), bytes) == 0),
                     "an array written back by write_npy reads back the same");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kiln_fuzz::input_file("input.npy", data, size);
  kiln_fuzz::refused([&] { (void)kiln::data::read_npy_header(path); });
  read_as<std::uint8_t>(path);
  read_as<std::int64_t>(path);
  read_as<float>(path);
  read_as<double>(path);
  return 0;
}
