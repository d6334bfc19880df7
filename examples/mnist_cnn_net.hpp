// The CNN of examples/mnist_cnn and of bench/memory_soak, in both modes:
//   Conv 32 3x3 - ReLU - Conv 64 3x3 - ReLU - MaxPool 2 - Dropout 0.5 - Flatten - Dense 128 ReLU - Dense 10
// One Dropout layer keeps both modes' masks identical (they draw from one stream); from one seed both modes start from
// the same weights and run the same kernels.
#pragma once

#include <cstdint>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::examples {

using static_mnist_cnn = Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3>, ReLU, Conv2D<64, 3>, ReLU,
                                    MaxPool2D<2>, Dropout<0.5>, Flatten, Dense<128, ReLU>, Dense<10>>;

inline nn::Sequential dynamic_mnist_cnn(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Conv2d(1, 32, 3), nn::ReLU(), nn::Conv2d(32, 64, 3), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Dropout(0.5), nn::Flatten(), nn::Linear(9216, 128), nn::ReLU(), nn::Linear(128, 10));
}

}  // namespace kiln::examples
