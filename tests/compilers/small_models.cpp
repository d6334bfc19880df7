// A program a compiler must build to be one kiln supports (scripts/check_compilers): every public header, one small
// static model and one dynamic model, each trained a few steps. It exits with 0 when both losses fall.
#include <cstdio>

#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

int main() {
  random_generator rng(1);
  Tensor<float> x(shape{64, 8}), y(shape{64, 1});
  for (float& v : x.span()) v = rng.normal<float>();
  for (index_t i = 0; i < 64; ++i) y.span()[i] = x.span()[i * 8] - 0.5f * x.span()[i * 8 + 1];

  Sequential<policy::cpu, Input<8>, Dense<16, ReLU>, Dense<1>> net(64, 2);
  optim::Adam static_opt({.lr = 1e-2});
  const float static_first = net.train_step(x, y, loss::mse{}, static_opt);
  float static_last = static_first;
  for (int i = 0; i < 50; ++i) static_last = net.train_step(x, y, loss::mse{}, static_opt);

  manual_seed(2);
  auto model = nn::Sequential(nn::Linear(8, 16), nn::Tanh(), nn::Linear(16, 1));
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-2});
  nn::Variable input(x), target(y);
  float dynamic_first = 0, dynamic_last = 0;
  for (int i = 0; i < 51; ++i) {
    dynamic_opt.zero_grad();
    auto loss = nn::mse_loss(model(input), target);
    loss.backward();
    dynamic_opt.step();
    (i == 0 ? dynamic_first : dynamic_last) = loss.item();
  }
  std::printf("static mse %.4f -> %.4f, dynamic mse %.4f -> %.4f\n", static_first, static_last, dynamic_first,
              dynamic_last);
  return static_last < static_first && dynamic_last < dynamic_first ? 0 : 1;
}
