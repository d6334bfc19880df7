// Must NOT compile: the fused step takes one hidden layer, and this MLP has two.
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<784>, kiln::Dense<128, kiln::ReLU>,
                               kiln::Dense<64, kiln::ReLU>, kiln::Dense<10>>;
  Net net(64);
  kiln::fused_mlp_trainer<Net> trainer(net);
  return 0;
}
