// Must NOT compile: a Concat along the channels whose branches give images of different sizes (26x26 and 28x28).
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<1, 28, 28>,
                               kiln::Concat<1, kiln::Conv2D<4, 3>, kiln::Conv2D<4, 3, kiln::conv_options{.padding = 1}>>,
                               kiln::Flatten, kiln::Dense<2>>;
  Net net(4);
  return 0;
}
