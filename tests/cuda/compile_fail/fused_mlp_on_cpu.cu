// Must NOT compile: the fused step is a CUDA kernel, and this model's parameters live in host memory.
#include "kiln/policy_cuda.cuh"
#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.cuh"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<784>, kiln::Dense<128, kiln::ReLU>, kiln::Dense<10>>;
  Net net(64);
  kiln::fused_mlp_trainer<Net> trainer(net);
  return 0;
}
