// Must NOT compile: the fused step takes one hidden layer, and this MLP has two.
#include "kiln/policy_cuda.cuh"
#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.cuh"

int main() {
  using Net = kiln::Sequential<kiln::policy::cuda, kiln::Input<784>, kiln::Dense<128, kiln::ReLU>,
                               kiln::Dense<64, kiln::ReLU>, kiln::Dense<10>>;
  Net net(64);
  kiln::fused_mlp_trainer<Net> trainer(net);
  return 0;
}
