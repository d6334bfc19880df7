// The small ResNet of examples/resnet_fashion and of the ladder's resnet workload (bench/ladder.cpp), in both modes:
// the CIFAR ResNets' layout with two blocks a stage at 28x28, PyTorch's conventions (no bias in a convolution that a
// BatchNorm follows, PyTorch's default initialisation):
//   stem:    Conv 16 3x3 pad 1 - BatchNorm - ReLU                                                    16 x 28 x 28
//   stage 1: 2 basic blocks of 16 channels                                                           16 x 28 x 28
//   stage 2: 2 basic blocks of 32 channels, the first with stride 2                                  32 x 14 x 14
//   stage 3: 2 basic blocks of 64 channels, the first with stride 2                                  64 x  7 x  7
//   global average pooling - Dense 10
// A basic block is Conv 3x3 - BatchNorm - ReLU - Conv 3x3 - BatchNorm, added to its input, then ReLU; a block with
// stride 2 changes the shape, so its input comes through a Shortcut of a 1x1 convolution with stride 2 and a
// BatchNorm (torchvision's "downsample").
#pragma once

#include <cstdint>
#include <utility>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::examples {

namespace resnet_detail {
constexpr conv_options conv3x3{.padding = 1, .bias = false};
constexpr conv_options conv3x3_stride2{.stride = 2, .padding = 1, .bias = false};
constexpr conv_options conv1x1_stride2{.stride = 2, .bias = false};
template <index_t C>
using block = Residual<Conv2D<C, 3, conv3x3>, BatchNorm2d<>, ReLU, Conv2D<C, 3, conv3x3>, BatchNorm2d<>>;
template <index_t C>
using downsampling_block = Residual<Shortcut<Conv2D<C, 1, conv1x1_stride2>, BatchNorm2d<>>,
                                    Conv2D<C, 3, conv3x3_stride2>, BatchNorm2d<>, ReLU, Conv2D<C, 3, conv3x3>,
                                    BatchNorm2d<>>;

inline nn::Residual dynamic_block(index_t in, index_t out, index_t stride) {
  auto body = nn::Sequential(nn::Conv2d(in, out, 3, stride, 1, 1, 1, false), nn::BatchNorm2d(out), nn::ReLU(),
                             nn::Conv2d(out, out, 3, 1, 1, 1, 1, false), nn::BatchNorm2d(out));
  if (stride == 1 && in == out) return nn::Residual(std::move(body));
  return nn::Residual(std::move(body),
                      nn::Sequential(nn::Conv2d(in, out, 1, stride, 0, 1, 1, false), nn::BatchNorm2d(out)));
}
}  // namespace resnet_detail

// Static mode: the network is a type, every shape checked by the compiler.
template <class Policy = policy::cpu>
using static_resnet =
    Sequential<Policy, Input<1, 28, 28>, Conv2D<16, 3, resnet_detail::conv3x3>, BatchNorm2d<>, ReLU,  //
               resnet_detail::block<16>, ReLU, resnet_detail::block<16>, ReLU,                         //
               resnet_detail::downsampling_block<32>, ReLU, resnet_detail::block<32>, ReLU,            //
               resnet_detail::downsampling_block<64>, ReLU, resnet_detail::block<64>, ReLU,            //
               GlobalAvgPool2D, Dense<10>>;

// Dynamic mode: the same layers as modules, in the same order, so that after manual_seed(seed) they draw
// static_resnet's initial weights for that seed.
inline nn::Sequential dynamic_resnet(std::uint64_t seed) {
  using resnet_detail::dynamic_block;
  manual_seed(seed);
  return nn::Sequential(nn::Conv2d(1, 16, 3, 1, 1, 1, 1, false), nn::BatchNorm2d(16), nn::ReLU(),
                        dynamic_block(16, 16, 1), nn::ReLU(), dynamic_block(16, 16, 1), nn::ReLU(),
                        dynamic_block(16, 32, 2), nn::ReLU(), dynamic_block(32, 32, 1), nn::ReLU(),
                        dynamic_block(32, 64, 2), nn::ReLU(), dynamic_block(64, 64, 1), nn::ReLU(),
                        nn::GlobalAvgPool2d(), nn::Linear(64, 10));
}

}  // namespace kiln::examples
