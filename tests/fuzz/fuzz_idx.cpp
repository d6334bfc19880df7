// libFuzzer target: read_idx over an arbitrary file, plain or gzip (the reader sniffs the gzip magic), and the images
// and labels readers over the same file.
#include <cstdint>

#include "fuzz_common.hpp"
#include "kiln/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kiln_fuzz::input_file("input.idx", data, size);
  const kiln::data::read_limits limits{.max_bytes = 1 << 24};
  kiln::Tensor<std::uint8_t> t;
  if (!kiln_fuzz::refused([&] { t = kiln::data::read_idx(path, limits); })) {
    std::uint64_t sum = 0;
    for (kiln::index_t i = 0; i < t.numel(); ++i) sum += t[i];  // every element was written: ASan sees it read
    (void)sum;
  }
  kiln_fuzz::refused([&] { (void)kiln::data::read_idx_images(path, limits); });
  kiln_fuzz::refused([&] { (void)kiln::data::read_idx_labels<std::int64_t>(path, limits); });
  return 0;
}
