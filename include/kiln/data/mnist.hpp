// MNIST and Fashion-MNIST: the same four IDX files (plain or .gz) in a directory, loaded as float images and int64
// class labels ready for a loader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/idx.hpp"

namespace kiln::data {

// Which half of the data set: 60,000 training or 10,000 test images.
enum class split { train, test };

// Mean and standard deviation of the MNIST training pixels after scaling to [0, 1] (the usual constants).
inline constexpr float mnist_mean = 0.1307f;
inline constexpr float mnist_std = 0.3081f;
inline constexpr float fashion_mnist_mean = 0.2860f;
inline constexpr float fashion_mnist_std = 0.3530f;

// How pixels become floats: x/255 when `scale`, then (x - mean) / std. The defaults give [0, 1].
struct mnist_options {
  bool scale = true;
  float mean = 0.0f;
  float std = 1.0f;
  index_t limit = 0;  // keep only the first `limit` samples (0: all), for quick runs
};

// Loads `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] as images (N, 28, 28) float and labels (N) int64.
// Works for MNIST and Fashion-MNIST alike (same files, same format). Throws kiln::error for a missing file, counts
// that disagree between images and labels, images that are not 28x28 or labels outside 0-9.
KILN_LIBRARY_FUNCTION tensor_dataset<float, std::int64_t> load_mnist(const std::filesystem::path& dir,
                                                                     split which = split::train,
                                                                     const mnist_options& options = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION tensor_dataset<float, std::int64_t> load_mnist(const std::filesystem::path& dir, split which,
                                                                     const mnist_options& options) {
  const std::string prefix = which == split::train ? "train" : "t10k";
  auto locate = [&](const std::string& stem) {
    std::error_code ec;
    for (const char* suffix : {".gz", ""}) {
      auto p = dir / (prefix + stem + suffix);
      if (std::filesystem::is_regular_file(p, ec)) return p;
    }
    fail("load_mnist: ", (dir / (prefix + stem + ".gz")).string(), " not found (nor without .gz); fetch the data with "
         "scripts/fetch_data, or point --data / KILN_DATA at the directory that holds it");
  };
  const auto image_path = locate("-images-idx3-ubyte"), label_path = locate("-labels-idx1-ubyte");
  Tensor<std::uint8_t> pixels = read_idx_images(image_path);
  Tensor<std::uint8_t> bytes = read_idx_labels(label_path);
  if (pixels.extent(1) != 28 || pixels.extent(2) != 28)
    fail(image_path.string(), ": at byte offset 8: expected 28x28 images, found ", pixels.extent(1), "x",
         pixels.extent(2));
  if (pixels.extent(0) != bytes.extent(0))
    fail(label_path.string(), ": at byte offset 4: holds ", bytes.extent(0), " labels but ", image_path.string(),
         " holds ", pixels.extent(0), " images");
  index_t n = pixels.extent(0);
  if (options.limit < 0) fail("load_mnist: expected mnist_options::limit >= 0 (0: all samples), found ", options.limit);
  if (options.limit > 0 && options.limit < n) n = options.limit;
  if (options.std == 0.0f) fail("load_mnist: mnist_options::std must not be zero");

  Tensor<float> images(shape{n, 28, 28});
  Tensor<std::int64_t> labels(shape{n});
  const float scale = options.scale ? 1.0f / 255.0f : 1.0f, inv_std = 1.0f / options.std;
  const std::uint8_t* src = pixels.data();
  float* dst = images.data();
  for (index_t i = 0; i < n * 28 * 28; ++i) dst[i] = (static_cast<float>(src[i]) * scale - options.mean) * inv_std;
  for (index_t i = 0; i < n; ++i) {
    if (bytes[i] > 9) fail(label_path.string(), ": at byte offset ", 8 + i, ": label ", int{bytes[i]}, " is not 0-9");
    labels[i] = bytes[i];
  }
  return {std::move(images), std::move(labels)};
}
#endif

}  // namespace kiln::data
