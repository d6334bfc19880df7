// Static mode in double precision: every layer's backward checked against central finite differences through whole
// models, fused and unfused epilogues giving the same numbers (a Conv2D taking over the activation after it
// included), and flat versus per-tensor parameter slots.
#include <doctest/doctest.h>

#include <cmath>

#include "kiln/kiln.hpp"
#include "same_training.hpp"

using namespace kiln;

namespace {

// Checks d(loss)/d(parameter) for every parameter of a static model against (L(p + h) - L(p - h)) / 2h.
template <class Net, class Loss, class Target>
void check_parameter_gradients(Net& net, const Tensor<double>& x, const Tensor<Target>& target, const Loss& loss) {
  net.forward_backward(x, target, loss);
  std::vector<double> analytic(net.gradient_values().begin(), net.gradient_values().end());
  auto params = net.parameter_values();
  const double h = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    double saved = params[i];
    params[i] = saved + h;
    double up = net.loss_value(x, target, loss);
    params[i] = saved - h;
    double down = net.loss_value(x, target, loss);
    params[i] = saved;
    double numeric = (up - down) / (2 * h);
    double error = std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, error);
  }
  CHECK(worst < 1e-6);
}

template <class Net>
Tensor<double> random_input(index_t batch, std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<double> x(Net::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<double>();
  return x;
}

}  // namespace

TEST_CASE("gradients of Dense with every fused activation, Flatten, and MSE") {
  using Net = Sequential<policy::cpu, InputOf<double, 2, 3>, Flatten, Dense<5, Tanh>, Dense<4, GELU>,
                         Dense<4, LeakyReLU<0.1>>, Dense<4, Sigmoid>, Dense<3, ReLU>, Dense<2>>;
  for (bool fuse : {true, false}) {
    Net net(4, 11, {.fuse_epilogues = fuse});
    auto x = random_input<Net>(4, 2);
    Tensor<double> y(shape{4, 2}, 0.25);
    check_parameter_gradients(net, x, y, loss::mse{});
    check_parameter_gradients(net, x, y, loss::mse{.reduce = reduction::sum});
  }
}

TEST_CASE("gradients of standalone activations, softmax over both dims, and every loss") {
  using Net = Sequential<policy::cpu, InputOf<double, 3>, Dense<4>, Tanh, Dense<4>, GELU, Dense<4>, Sigmoid,
                         Dense<4>, LeakyReLU<0.2>, Dense<4>, ReLU, Dense<5>, Softmax<1>, Dense<3>, Softmax<0>,
                         Dense<3>, LogSoftmax<0>, Dense<3>, LogSoftmax<1>, Dense<3>>;
  Net net(3, 5);
  auto x = random_input<Net>(3, 3);
  Tensor<std::int64_t> labels(shape{3}, {2, 0, 1});
  check_parameter_gradients(net, x, labels, loss::cross_entropy{});
  check_parameter_gradients(net, x, labels, loss::cross_entropy{.reduce = reduction::sum});
  Tensor<double> probabilities(shape{3, 3}, {0.1, 0.9, 0.5, 1, 0, 0.3, 0.7, 0.2, 0.4});
  check_parameter_gradients(net, x, probabilities, loss::bce_with_logits{});
  // nll is linear in its input: it need not be log-probabilities for the check.
  Tensor<std::int64_t> some_ignored(shape{3}, {2, 7, 0});
  for (auto r : {reduction::mean, reduction::sum}) {
    check_parameter_gradients(net, x, some_ignored, loss::nll{.reduce = r, .weight = {0.5, 2, 1.5}, .ignore_index = 7});
    check_parameter_gradients(
        net, x, some_ignored,
        loss::cross_entropy{.reduce = r, .weight = {0.5, 2, 1.5}, .ignore_index = 7, .label_smoothing = 0.3f});
    check_parameter_gradients(net, x, probabilities, loss::l1{.reduce = r});
    check_parameter_gradients(net, x, probabilities, loss::smooth_l1{.reduce = r, .beta = 0.3f});
    check_parameter_gradients(net, x, probabilities, loss::huber{.reduce = r, .delta = 0.4f});
  }
}

TEST_CASE("fused and unfused epilogues give bit-identical training") {
  using Net = Sequential<policy::cpu, Input<20>, Dense<32, ReLU>, Dense<16, LeakyReLU<>>, Dense<3>>;
  Net fused(16, 3, {.fuse_epilogues = true}), unfused(16, 3, {.fuse_epilogues = false, .flat_parameters = false});
  optim::Adam opt_fused({.lr = 1e-2}), opt_unfused({.lr = 1e-2});
  require_same_training(fused, opt_fused, unfused, opt_unfused, 16, 9, 20);
  CHECK(opt_unfused.slots().size() == 6);
  CHECK(opt_fused.slots().size() == 1);
}

TEST_CASE("a Dense layer over a Dense with a fused ReLU takes that ReLU's backward in, with the unfused bits") {
  // With fused epilogues the upper layer's two backward products and the ReLU's backward run in one pass
  // (policy::cpu::dense_backward_through_relu): here for every layer over a ReLU, the head (no activation of its own)
  // over a layer whose own ReLU the head took in, which then runs no pass of its own over the one below.
  const auto precision = kernels::cpu::default_product_precision();
  REQUIRE(policy::cpu::dense_backward_through_relu_applies(64, 32, 24, precision));
  REQUIRE(policy::cpu::dense_backward_through_relu_applies(64, 24, 3, precision));
  using Net = Sequential<policy::cpu, Input<20>, Dense<32, ReLU>, Dense<24, ReLU>, Dense<3>>;
  Net fused(64, 4, {.fuse_epilogues = true}), unfused(64, 4, {.fuse_epilogues = false});
  optim::Adam opt_fused({.lr = 1e-2}), opt_unfused({.lr = 1e-2});
  require_same_training(fused, opt_fused, unfused, opt_unfused, 64, 10, 20);
  // The same on a batch of 4, whose small products gemm runs another way: the pass does not apply, and each layer
  // takes its ReLU's backward itself.
  CHECK_FALSE(policy::cpu::dense_backward_through_relu_applies(4, 24, 3, precision));
  Net fused_small(4, 5, {.fuse_epilogues = true}), unfused_small(4, 5, {.fuse_epilogues = false});
  optim::Adam opt_fused_small({.lr = 1e-2}), opt_unfused_small({.lr = 1e-2});
  require_same_training(fused_small, opt_fused_small, unfused_small, opt_unfused_small, 4, 11, 20);
}

TEST_CASE("a Conv2D takes over the activation layer after it: gradients, and training bit-identical to unfused") {
  // Fused epilogues let each Conv2D apply the ReLU, LeakyReLU, Sigmoid or Tanh that follows it; GELU, whose backward
  // needs its input, stays a layer of its own. The gradients must still match finite differences, fused or not, and
  // training must give the unfused model's bits (the activation is the same arithmetic in either place).
  using Net = Sequential<policy::cpu, InputOf<double, 2, 7, 7>, Conv2D<3, 3>, LeakyReLU<0.2>,
                         Conv2D<4, 2, conv_options{.padding = 1}>, Sigmoid, Conv2D<3, 3>, GELU, Conv2D<2, 2>, Tanh,
                         Flatten, Dense<3>, ReLU>;
  for (bool fuse : {true, false}) {
    CAPTURE(fuse);
    Net net(3, 19, {.fuse_epilogues = fuse});
    auto x = random_input<Net>(3, 6);
    Tensor<double> y(shape{3, 3}, 0.25);
    check_parameter_gradients(net, x, y, loss::mse{});
  }
  using Cnn = Sequential<policy::cpu, Input<1, 10, 10>, Conv2D<6, 3>, ReLU, Conv2D<4, 3>, LeakyReLU<0.1>,
                         MaxPool2D<2>, Flatten, Dense<3>>;
  Cnn fused(8, 5, {.fuse_epilogues = true}), unfused(8, 5, {.fuse_epilogues = false});
  optim::Adam opt_fused({.lr = 1e-2}), opt_unfused({.lr = 1e-2});
  require_same_training(fused, opt_fused, unfused, opt_unfused, 8, 12, 10);
  // Evaluation runs the same fused forward: predictions agree too.
  random_generator rng(12);
  Tensor<float> x(shape{8, 1, 10, 10});
  for (auto& v : x.span()) v = rng.normal<float>();
  const Tensor<float> p = fused.predict(x), q = unfused.predict(x);
  for (index_t i = 0; i < p.numel(); ++i) CHECK(p[i] == q[i]);
}

TEST_CASE("state_dict round trip and load errors leave the model unchanged") {
  using Net = Sequential<policy::cpu, Input<3>, Dense<4, ReLU>, Dense<2>>;
  Net a(2, 1), b(2, 2);
  b.load_state_dict(a.state_dict());
  for (std::size_t i = 0; i < a.parameter_values().size(); ++i) CHECK(a.parameter_values()[i] == b.parameter_values()[i]);
  auto dict = a.state_dict();
  CHECK(dict[0].first == "0.weight");
  CHECK(dict[2].first == "2.weight");
  Net c(2, 3);
  std::vector<float> before(c.parameter_values().begin(), c.parameter_values().end());
  auto wrong = dict;
  wrong[3].second = Tensor<float>(shape{3});
  CHECK_THROWS_WITH_AS(c.load_state_dict(wrong), doctest::Contains("2.bias"), kiln::error);
  wrong = dict;
  wrong.pop_back();
  CHECK_THROWS_AS(c.load_state_dict(wrong), kiln::error);
  wrong = dict;
  wrong.emplace_back("9.weight", Tensor<float>(shape{1}));
  CHECK_THROWS_WITH_AS(c.load_state_dict(wrong), doctest::Contains("unexpected"), kiln::error);
  wrong = dict;  // a name twice: the last one silently won
  wrong.emplace_back(dict[0].first, Tensor<float>(dict[0].second.shape(), 7.0f));
  CHECK_THROWS_WITH_AS(c.load_state_dict(wrong), doctest::Contains("'0.weight' twice"), kiln::error);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(c.parameter_values()[i] == before[i]);
}
