// The workloads of bench/distributed/ddp_bench, each a static network, the same network in dynamic mode drawn from
// the same seed, and the global batch that the ranks split:
//   wide_mlp   784 -> 1024 ReLU -> 1024 ReLU -> 10 on [784] inputs, batch 256;
//   mnist_mlp  the ladder's MNIST MLP (bench::mnist_mlp_net: Flatten, 784 -> 128 ReLU -> 10) on [28, 28], batch 64;
//   resnet     the ladder's ResNet (bench::resnet_net, examples/resnet_net.hpp) on [1, 28, 28], batch 64.
// bench/distributed/torch_ddp_bench.py builds the same three networks in PyTorch.
#pragma once

#include <cstdint>

#include "../mnist_nets.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln::bench::ddp {

struct wide_mlp {
  static constexpr const char* name = "wide_mlp";
  static constexpr const char* description = "wide MLP 784-1024-1024-10";
  static constexpr index_t global_batch = 256;
  using static_net = Sequential<policy::cpu, Input<784>, Dense<1024, ReLU>, Dense<1024, ReLU>, Dense<10>>;
  static nn::Sequential dynamic_net(std::uint64_t seed) {
    manual_seed(seed);
    return nn::Sequential(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 10));
  }
};

struct mnist_mlp {
  static constexpr const char* name = "mnist_mlp";
  static constexpr const char* description = "MNIST MLP 784-128-10";
  static constexpr index_t global_batch = 64;
  using static_net = mnist_mlp_net;
  static nn::Sequential dynamic_net(std::uint64_t seed) {
    manual_seed(seed);
    return nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
  }
};

struct resnet {
  static constexpr const char* name = "resnet";
  static constexpr const char* description = "ResNet 16-32-64 (2 blocks a stage, BatchNorm) on 1x28x28";
  static constexpr index_t global_batch = 64;
  using static_net = resnet_net;
  static nn::Sequential dynamic_net(std::uint64_t seed) { return examples::dynamic_resnet(seed); }
};

}  // namespace kiln::bench::ddp
