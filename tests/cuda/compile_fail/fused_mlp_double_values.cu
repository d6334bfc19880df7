// Must NOT compile: the fused step's kernel computes in float, and this model holds doubles.
#include "kiln/policy_cuda.cuh"
#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.cuh"

int main() {
  using Net = kiln::Sequential<kiln::policy::cuda, kiln::InputOf<double, 784>, kiln::Dense<128, kiln::ReLU>,
                               kiln::Dense<10>>;
  Net net(64);
  kiln::fused_mlp_trainer<Net> trainer(net);
  return 0;
}
