// Must NOT compile: 3 input channels cannot be split into 2 groups.
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<3, 8, 8>,
                               kiln::Conv2D<4, 3, kiln::conv_options{.groups = 2}>, kiln::Flatten, kiln::Dense<10>>;
  Net net(64);
  return 0;
}
