// libFuzzer target: load_mnist over a directory of two arbitrary files. The input's first two bytes say how many of
// the rest are the images file; the remainder is the labels file.
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "fuzz_common.hpp"
#include "kiln/data/mnist.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::size_t split = static_cast<std::size_t>(data[0]) | (static_cast<std::size_t>(data[1]) << 8);
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if (split > rest.size()) split = rest.size();
  const auto dir = kiln_fuzz::scratch_dir() / "mnist";
  std::filesystem::create_directories(dir);
  kiln_fuzz::write_file(dir / "train-images-idx3-ubyte", rest.substr(0, split));
  kiln_fuzz::write_file(dir / "train-labels-idx1-ubyte", rest.substr(split));
  kiln::data::tensor_dataset<float, std::int64_t> set;
  if (!kiln_fuzz::refused([&] { set = kiln::data::load_mnist(dir, kiln::data::split::train); }))
    kiln_fuzz::require(set.size() >= 0, "a loaded set has a size");
  kiln_fuzz::refused([&] { (void)kiln::data::load_mnist(dir, kiln::data::split::train, {.limit = 1}); });
  return 0;
}
