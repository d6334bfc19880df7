// Must NOT compile: dropout between stacked LSTM layers must be a probability below 1 (1.5 made the keep factor -2).
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<5, 3>,
                               kiln::LSTM<4, 2, false, kiln::rnn_options{.dropout = 1.5f}>, kiln::Dense<2>>;
  Net net(8);
  return 0;
}
