// Graph blocks: static mode's Residual, Shortcut, Chain, Add and Concat (static/blocks.hpp) and dynamic mode's
// nn::Residual, nn::Add and nn::Concat (dynamic/modules/blocks.hpp). Each static block trains with the bits of its
// dynamic twin built after manual_seed with the same seed (the same initial weights, losses and parameters over 20
// steps), under PyTorch's state_dict names; the dynamic blocks' gradients are checked by finite differences; a static
// step with blocks allocates nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "allocation_counter.hpp"
#include "fixture.hpp"
#include "gradient_check.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// Trains the static net and its dynamic twin side by side with SGD on one random batch: the same loss every step,
// the same parameters under the same names at the end.
template <class Net>
void check_twins(Net& net, nn::Module& model, index_t batch, int steps = 20) {
  using In = typename Net::input_shape;
  random_generator rng(17);
  Tensor<float> x(In::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels({batch});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(Net::output_shape::size));
  // The same names (a block lists all its parameters before its buffers, PyTorch module by module: compared by name)
  // and the same initial values.
  auto same_state = [&] {
    const auto static_state = net.state_dict();
    std::map<std::string, Tensor<float>> dynamic_state;
    for (auto& [name, tensor] : model.state_dict()) dynamic_state.emplace(name, tensor);
    REQUIRE(static_state.size() == dynamic_state.size());
    for (const auto& [name, tensor] : static_state) {
      CAPTURE(name);
      const auto found = dynamic_state.find(name);
      REQUIRE(found != dynamic_state.end());
      REQUIRE(tensor.shape() == found->second.shape());
      for (index_t k = 0; k < tensor.numel(); ++k) REQUIRE(tensor.data()[k] == found->second.data()[k]);
    }
  };
  same_state();
  optim::SGD static_opt({.lr = 0.05, .momentum = 0.9});
  optim::SGD dynamic_opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::Variable input(x);
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const float s = net.train_step(x, labels, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), labels);
    l.backward();
    dynamic_opt.step();
    REQUIRE(s == l.item());
  }
  same_state();
}

using V = nn::basic_variable<double>;
using kiln::test::check_gradients;
using kiln::test::random_leaf;
using kiln::test::weighted_sum;

}  // namespace

TEST_CASE("static Residual trains as nn::Residual, with PyTorch's names") {
  using Net = Sequential<policy::cpu, Input<8>, Dense<16>, Residual<Dense<16, ReLU>, Dense<16>>, Dense<3>>;
  Net net(6, 42);
  manual_seed(42);
  auto model = nn::Sequential(nn::Linear(8, 16),
                              nn::Residual(nn::Sequential(nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 16))),
                              nn::Linear(16, 3));
  const auto names = net.state_dict();
  CHECK(names[2].first == "1.body.0.weight");
  CHECK(names[4].first == "1.body.2.weight");
  CHECK(names[6].first == "2.weight");
  check_twins(net, model, 6);
}

TEST_CASE("static Residual with a Shortcut, nested in a Chain, trains as its dynamic twin") {
  using Block = Residual<Shortcut<Dense<6>>, Dense<6, Tanh>, Dense<6>>;
  using Net = Sequential<policy::cpu, Input<4>, Block, Chain<Residual<Dense<6, ReLU>, Dense<6>>, ReLU>, Dense<3>>;
  Net net(5, 7);
  manual_seed(7);
  auto model = nn::Sequential(
      nn::Residual(nn::Sequential(nn::Linear(4, 6), nn::Tanh(), nn::Linear(6, 6)), nn::Sequential(nn::Linear(4, 6))),
      nn::Sequential(nn::Residual(nn::Sequential(nn::Linear(6, 6), nn::ReLU(), nn::Linear(6, 6))), nn::ReLU()),
      nn::Linear(6, 3));
  const auto names = net.state_dict();
  CHECK(names[4].first == "0.shortcut.0.weight");
  CHECK(names[6].first == "1.0.body.0.weight");
  check_twins(net, model, 5);
}

TEST_CASE("static Add and Concat train as nn::Add and nn::Concat") {
  using Net = Sequential<policy::cpu, Input<5>, Concat<1, Dense<4>, Chain<Dense<3, ReLU>, Dense<2>>>,
                         Add<Dense<7, Tanh>, Chain<Dense<7>>>, Dense<3>>;
  Net net(4, 3);
  manual_seed(3);
  auto model = nn::Sequential(
      nn::Concat(1, nn::Sequential(nn::Linear(5, 4)), nn::Sequential(nn::Linear(5, 3), nn::ReLU(), nn::Linear(3, 2))),
      nn::Add(nn::Sequential(nn::Linear(6, 7), nn::Tanh()), nn::Sequential(nn::Linear(6, 7))), nn::Linear(7, 3));
  CHECK(net.state_dict()[0].first == "0.0.0.weight");
  CHECK(net.state_dict()[4].first == "0.1.2.weight");
  check_twins(net, model, 4);
}

TEST_CASE("a convolutional residual block with BatchNorm and a strided shortcut trains as its dynamic twin") {
  using Block = Residual<Shortcut<Conv2D<6, 1, conv_options{.stride = 2}>, BatchNorm2d<>>,
                         Conv2D<6, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, ReLU,
                         Conv2D<6, 3, conv_options{.padding = 1}>, BatchNorm2d<>>;
  using Net = Sequential<policy::cpu, Input<3, 8, 8>, Block, ReLU, Flatten, Dense<3>>;
  Net net(4, 5);
  manual_seed(5);
  auto model = nn::Sequential(
      nn::Residual(nn::Sequential(nn::Conv2d(3, 6, 3, 2, 1), nn::BatchNorm2d(6), nn::ReLU(), nn::Conv2d(6, 6, 3, 1, 1),
                                  nn::BatchNorm2d(6)),
                   nn::Sequential(nn::Conv2d(3, 6, 1, 2), nn::BatchNorm2d(6))),
      nn::ReLU(), nn::Flatten(), nn::Linear(6 * 4 * 4, 3));
  check_twins(net, model, 4, 10);
}

TEST_CASE("Dropout inside blocks draws as in its dynamic twin") {
  // Generators in module order: the body's Dropout, the shortcut's, then the Add's branches in order.
  using Block = Residual<Shortcut<Dense<12>, Dropout<0.3>>, Dense<12, ReLU>, Dropout<0.5>, Dense<12>>;
  using Net = Sequential<policy::cpu, Input<8>, Dropout<0.1>, Block, Add<Chain<Dropout<0.2>, Dense<5>>, Dense<5, Tanh>>,
                         Dense<3>>;
  static_assert(Net::plan::runtime_generator_count == 4);
  Net net(6, 11);
  manual_seed(11);
  auto model = nn::Sequential(
      nn::Dropout(0.1),
      nn::Residual(nn::Sequential(nn::Linear(8, 12), nn::ReLU(), nn::Dropout(0.5), nn::Linear(12, 12)),
                   nn::Sequential(nn::Linear(8, 12), nn::Dropout(0.3))),
      nn::Add(nn::Sequential(nn::Dropout(0.2), nn::Linear(12, 5)), nn::Sequential(nn::Linear(12, 5), nn::Tanh())),
      nn::Linear(5, 3));
  check_twins(net, model, 6);
}

TEST_CASE("a static step through blocks allocates nothing") {
  using Net = Sequential<policy::cpu, Input<8>, Residual<Dense<8, ReLU>, Dense<8>>,
                         Concat<1, Dense<4>, Add<Dense<4>, Dense<4>>>, Dense<2>>;
  Net net(4, 1);
  optim::Adam adam({.lr = 1e-3});
  Tensor<float> x({4, 8}, 0.5f);
  Tensor<std::int64_t> labels({4}, std::int64_t{1});
  net.train_step(x, labels, loss::cross_entropy{}, adam);  // warm-up: the optimizer's state
  const long long before = kiln_test::heap_allocations.load();
  net.train_step(x, labels, loss::cross_entropy{}, adam);
  CHECK(kiln_test::heap_allocations.load() - before == 0);
}

TEST_CASE("dynamic blocks: gradients by finite differences, and the shape errors") {
  manual_seed(11);
  auto residual = nn::basic_residual<double>(
      nn::basic_sequential<double>(nn::basic_linear<double>(3, 4), nn::basic_tanh<double>()),
      nn::basic_sequential<double>(nn::basic_linear<double>(3, 4)));
  auto concat = nn::basic_concat<double>(-1, nn::basic_linear<double>(4, 2), nn::basic_linear<double>(4, 3));
  auto sum = nn::basic_add<double>(nn::basic_linear<double>(5, 2), nn::basic_linear<double>(5, 2));
  V x = random_leaf({2, 3}, 1);
  std::vector<V> leaves{x};
  for (auto* m : std::vector<nn::basic_module<double>*>{&residual, &concat, &sum})
    for (auto& p : m->parameters()) leaves.push_back(p);
  check_gradients(leaves, [&] { return weighted_sum(sum(concat(residual(x)))); });

  nn::Residual changes(nn::Linear(3, 4));
  CHECK_THROWS_WITH_AS(changes(nn::Variable(Tensor<float>({2, 3}))), doctest::Contains("add a shortcut"), kiln::error);
  nn::Concat mismatched(0, nn::Linear(3, 4), nn::Linear(3, 2));
  CHECK_THROWS_WITH_AS(mismatched(nn::Variable(Tensor<float>({2, 3}))), doctest::Contains("Concat(dim=0)"),
                       kiln::error);
}

namespace {

// A parameter gradient against PyTorch's. A convolution's bias before a BatchNorm has a gradient of exactly 0 (the
// normalisation removes it), which both libraries give as rounding noise of order 1e-8: there, both must be that
// small, rather than agree in their noise.
void check_gradient(std::span<const float> actual, const Tensor<float>& expected, const std::string& what) {
  double scale = 0;
  for (index_t i = 0; i < expected.numel(); ++i) scale = std::max(scale, double(std::abs(expected.data()[i])));
  if (scale < 1e-6) {
    for (float a : actual) CHECK_MESSAGE(std::abs(a) < 1e-6, (what + ": expected a gradient of 0 up to rounding"));
    return;
  }
  kiln::test::check_close(actual, expected, what.c_str(), 1e-5);
}

// PyTorch's state_dict, batch and results for a model of blocks (tests/fixtures/generate_blocks.py): the state loads
// by name into the static and the dynamic twin, and both give PyTorch's logits, loss, parameter gradients and
// running statistics.
template <class Net>
void check_against_pytorch(const std::string& case_name, nn::Module& model) {
  kiln::test::fixture f(case_name);
  std::vector<std::pair<std::string, Tensor<float>>> state;
  for (const std::string& name : f.names())
    if (name.starts_with("state.")) state.emplace_back(name.substr(6), f.f32(name));
  const Tensor<float> x = f.f32("x");
  const std::vector<std::int64_t> labels_list = f.i64("labels");
  const Tensor<std::int64_t> labels(shape{index_t(labels_list.size())}, std::span<const std::int64_t>(labels_list));

  Net net(x.extent(0), 1);
  net.load_state_dict(state);
  const float static_loss = net.forward_backward(x, labels, loss::cross_entropy{});
  kiln::test::check_close(Tensor<float>(net.last_output()), f.f32("y"), "static y", 1e-5);
  CHECK(static_loss == doctest::Approx(f.scalar("loss")).epsilon(1e-5));
  const auto grads = net.gradient_values();
  for (const auto& info : Net::named_parameter_infos())
    check_gradient(std::span<const float>(grads.data() + info.offset, std::size_t(info.shape.numel())),
                   f.f32("grad." + info.name), "static grad." + info.name);

  model.load_state_dict(state);
  model.train();
  auto y = model(nn::Variable(x));
  auto l = nn::cross_entropy(y, labels);
  l.backward();
  kiln::test::check_close(y.tensor(), f.f32("y"), "dynamic y", 1e-5);
  CHECK(l.item() == static_loss);
  for (const auto& [name, p] : model.named_parameters())
    check_gradient(p.grad().span(), f.f32("grad." + name), "dynamic grad." + name);
  std::map<std::string, Tensor<float>> dynamic_after;
  for (auto& [name, t] : model.state_dict()) dynamic_after.emplace(name, t);
  for (const auto& [name, t] : net.state_dict()) {
    if (!f.has("after." + name)) continue;
    kiln::test::check_close(t, f.f32("after." + name), ("static " + name).c_str(), 1e-5);
    kiln::test::check_close(dynamic_after.at(name), f.f32("after." + name), ("dynamic " + name).c_str(), 1e-5);
  }
}

}  // namespace

TEST_CASE("blocks against PyTorch: a residual MLP") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<6>, Residual<Dense<6, ReLU>, Dense<6>>, Dense<3>>;
  auto model = nn::Sequential(nn::Linear(4, 6),
                              nn::Residual(nn::Sequential(nn::Linear(6, 6), nn::ReLU(), nn::Linear(6, 6))),
                              nn::Linear(6, 3));
  check_against_pytorch<Net>("blocks_residual_mlp", model);
}

TEST_CASE("blocks against PyTorch: a strided convolutional residual block with BatchNorm and a shortcut") {
  using Block = Residual<Shortcut<Conv2D<4, 1, conv_options{.stride = 2}>, BatchNorm2d<>>,
                         Conv2D<4, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, ReLU,
                         Conv2D<4, 3, conv_options{.padding = 1}>, BatchNorm2d<>>;
  using Net = Sequential<policy::cpu, Input<2, 6, 6>, Block, ReLU, Flatten, Dense<3>>;
  auto model = nn::Sequential(
      nn::Residual(nn::Sequential(nn::Conv2d(2, 4, 3, 2, 1), nn::BatchNorm2d(4), nn::ReLU(), nn::Conv2d(4, 4, 3, 1, 1),
                                  nn::BatchNorm2d(4)),
                   nn::Sequential(nn::Conv2d(2, 4, 1, 2), nn::BatchNorm2d(4))),
      nn::ReLU(), nn::Flatten(), nn::Linear(4 * 3 * 3, 3));
  check_against_pytorch<Net>("blocks_residual_conv_shortcut", model);
}

TEST_CASE("blocks against PyTorch: Concat and Add with a nested Residual") {
  using Net = Sequential<policy::cpu, Input<5>, Concat<1, Dense<4>, Chain<Dense<3, Tanh>, Dense<2>>>,
                         Add<Residual<Dense<6, ReLU>, Dense<6>>, Dense<6>>, Dense<3>>;
  auto model = nn::Sequential(
      nn::Concat(1, nn::Sequential(nn::Linear(5, 4)), nn::Sequential(nn::Linear(5, 3), nn::Tanh(), nn::Linear(3, 2))),
      nn::Add(nn::Sequential(nn::Residual(nn::Sequential(nn::Linear(6, 6), nn::ReLU(), nn::Linear(6, 6)))),
              nn::Sequential(nn::Linear(6, 6))),
      nn::Linear(6, 3));
  check_against_pytorch<Net>("blocks_concat_add_nested", model);
}
