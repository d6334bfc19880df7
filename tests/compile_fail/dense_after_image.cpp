// Must NOT compile: a Dense layer fed a 28x28 image without a Flatten before it.
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<28, 28>, kiln::Dense<128, kiln::ReLU>, kiln::Dense<10>>;
  Net net(64);
  return 0;
}
