// Must NOT compile: LogSoftmax over dimension 3 of a (batch, 10) output.
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<4>, kiln::Dense<10>, kiln::LogSoftmax<3>>;
  Net net(8);
  return 0;
}
