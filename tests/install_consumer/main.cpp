// Trains a tiny static model through an installed kiln; exits non-zero if the loss does not fall.
#include <kiln/kiln.hpp>

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<2>, kiln::Dense<8, kiln::Tanh>, kiln::Dense<1>>;
  Net net(4, 1);
  kiln::Tensor<float> x(kiln::shape{4, 2}, {0, 0, 0, 1, 1, 0, 1, 1});
  kiln::Tensor<float> y(kiln::shape{4, 1}, {0, 1, 1, 0});
  kiln::optim::Adam opt({.lr = 0.05});
  float first = net.train_step(x, y, kiln::loss::mse{}, opt), last = first;
  for (int i = 0; i < 500; ++i) last = net.train_step(x, y, kiln::loss::mse{}, opt);
  return last < 0.1f * first ? 0 : 1;
}
