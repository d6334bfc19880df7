// Must NOT compile: a residual block whose body changes the sample's shape (8 to 16 values) without a Shortcut.
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<8>, kiln::Residual<kiln::Dense<16, kiln::ReLU>>,
                               kiln::Dense<2>>;
  Net net(4);
  return 0;
}
