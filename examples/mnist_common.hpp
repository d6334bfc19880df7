// The MNIST MLP of the classic Keras-versus-PyTorch comparison, in both modes, and MNIST loading for the examples:
// Flatten -> Dense 128 ReLU -> Dense 10, pixels scaled to [0, 1] then normalised with MNIST's mean and deviation.
#pragma once

#include <cstdio>
#include <string>

#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::examples {

using mnist_static_mlp = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;

// The same layers as dynamic modules; after manual_seed(seed) they hold mnist_static_mlp(_, seed)'s weights.
inline nn::Sequential mnist_dynamic_mlp(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
}

struct mnist_data {
  data::tensor_dataset<float, std::int64_t> train, test;
  std::string dir;
};

// Finds and loads MNIST (or Fashion-MNIST with subdir "fashion-mnist"); explains where it looked when it can't.
inline mnist_data load_mnist_data(const std::string& data_flag, const std::string& subdir = "mnist") {
  auto dir = data::find_data_dir(subdir, data_flag);
  data::mnist_options normalise{.scale = true, .mean = data::mnist_mean, .std = data::mnist_std};
  if (subdir == "fashion-mnist") normalise.mean = data::fashion_mnist_mean, normalise.std = data::fashion_mnist_std;
  return {data::load_mnist(dir, data::split::train, normalise), data::load_mnist(dir, data::split::test, normalise),
          dir.string()};
}

}  // namespace kiln::examples
