// Must NOT compile: a 7x7 kernel on a 4x4 feature map (the pooled 8x8 input).
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<1, 8, 8>, kiln::MaxPool2D<2>, kiln::Conv2D<8, 7>,
                               kiln::Flatten, kiln::Dense<10>>;
  Net net(64);
  return 0;
}
