// Dynamic mode: finite-difference gradient checks in double for every op, module and loss; Module bookkeeping
// (parameters, buffers, state_dict, train/eval, freezing); error messages; training; agreement with static mode.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using V = nn::basic_variable<double>;

namespace {

// A leaf of the given shape with values from N(0, 1) (scaled), requiring grad.
V random_leaf(const shape& s, std::uint64_t seed, double scale = 1.0, bool requires_grad = true) {
  random_generator rng(seed);
  Tensor<double> t(s);
  for (auto& v : t.span()) v = scale * rng.normal<double>();
  return V(t, requires_grad);
}

// Checks d f() / d leaf against central differences for every element of every leaf. f builds a one-element value
// from the leaves (it is called again for each perturbation, under no_grad).
void check_gradients(const std::vector<V>& leaves, const std::function<V()>& f, double tolerance = 1e-6) {
  for (const auto& leaf : leaves) leaf.zero_grad();
  V loss = f();
  loss.backward();
  CHECK(nn::tape_size<double>() == 0);
  const double eps = 1e-6;
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    const V& leaf = leaves[l];
    REQUIRE(leaf.has_grad());
    auto value = leaf.value();
    auto grad = leaf.grad();
    for (index_t i = 0; i < leaf.numel(); ++i) {
      double saved = value[i];
      double plus, minus;
      {
        nn::no_grad guard;
        value[i] = saved + eps;
        plus = f().item();
        value[i] = saved - eps;
        minus = f().item();
        value[i] = saved;
      }
      double numeric = (plus - minus) / (2 * eps);
      double analytic = grad[i];
      double scale = std::max({1.0, std::abs(numeric), std::abs(analytic)});
      INFO("leaf ", l, " element ", i, ": analytic ", analytic, ", numeric ", numeric);
      CHECK(std::abs(analytic - numeric) <= tolerance * scale);
    }
  }
}

// sum(y * weights) for fixed random weights: a scalar whose gradient reaches every element of y differently.
V weighted_sum(const V& y, std::uint64_t seed = 99) {
  V w = random_leaf(y.shape(), seed, 1.0, false);
  return nn::sum(nn::mul(y, w));
}

}  // namespace

TEST_CASE("gradient check: linear and matmul") {
  V x = random_leaf({3, 4}, 1), w = random_leaf({5, 4}, 2), b = random_leaf({5}, 3);
  check_gradients({x, w, b}, [&] { return weighted_sum(nn::linear(x, w, b)); });
  check_gradients({x, w}, [&] { return weighted_sum(nn::linear(x, w)); });
  V x3 = random_leaf({2, 3, 4}, 4);
  check_gradients({x3, w, b}, [&] { return weighted_sum(nn::linear(x3, w, b)); });
  V a = random_leaf({3, 4}, 5), m = random_leaf({4, 2}, 6);
  check_gradients({a, m}, [&] { return weighted_sum(nn::matmul(a, m)); });
}

TEST_CASE("gradient check: arithmetic") {
  V a = random_leaf({3, 4}, 1), b = random_leaf({3, 4}, 2), row = random_leaf({4}, 3);
  check_gradients({a, b}, [&] { return weighted_sum(nn::add(a, b)); });
  check_gradients({a, row}, [&] { return weighted_sum(a + row); });
  check_gradients({a, row}, [&] { return weighted_sum(row + a); });
  check_gradients({a, b}, [&] { return weighted_sum(a - b); });
  check_gradients({a, row}, [&] { return weighted_sum(nn::sub(a, row)); });
  check_gradients({a, b}, [&] { return weighted_sum(a * b); });
  check_gradients({a, row}, [&] { return weighted_sum(a * row); });
  check_gradients({a, row}, [&] { return weighted_sum(row * a); });
  check_gradients({a}, [&] { return weighted_sum(a * 2.5); });
  check_gradients({a}, [&] { return weighted_sum(-0.5 * a); });
  check_gradients({a}, [&] { return weighted_sum(-a); });
}

TEST_CASE("gradient check: activations") {
  V x = random_leaf({4, 5}, 7);
  check_gradients({x}, [&] { return weighted_sum(nn::relu(x)); });
  check_gradients({x}, [&] { return weighted_sum(nn::leaky_relu(x, 0.1)); });
  check_gradients({x}, [&] { return weighted_sum(nn::gelu(x)); });
  check_gradients({x}, [&] { return weighted_sum(nn::sigmoid(x)); });
  check_gradients({x}, [&] { return weighted_sum(nn::tanh(x)); });
}

TEST_CASE("gradient check: softmax and log_softmax over every dim") {
  V x = random_leaf({3, 4}, 8);
  for (int dim : {0, 1, -1, -2}) {
    check_gradients({x}, [&] { return weighted_sum(nn::softmax(x, dim)); });
    check_gradients({x}, [&] { return weighted_sum(nn::log_softmax(x, dim)); });
  }
  V x3 = random_leaf({2, 3, 4}, 9);
  check_gradients({x3}, [&] { return weighted_sum(nn::softmax(x3, 1)); });
  check_gradients({x3}, [&] { return weighted_sum(nn::log_softmax(x3, 2)); });
  CHECK_THROWS_AS(nn::softmax(x, 2), kiln::error);
  CHECK_THROWS_AS(nn::log_softmax(x, -3), kiln::error);
}

TEST_CASE("gradient check: reshape, flatten, sum, mean") {
  V x = random_leaf({2, 3, 4}, 10);
  check_gradients({x}, [&] { return weighted_sum(nn::reshape(x, {6, -1})); });
  check_gradients({x}, [&] { return weighted_sum(nn::flatten(x)); });
  check_gradients({x}, [&] { return weighted_sum(nn::flatten(x, 0, 1)); });
  // Of an intermediate value, whose first gradient is the reshape's output gradient handed over, not copied; then
  // added to by its other use, or added to that use's gradient, in either order on the tape.
  check_gradients({x}, [&] { return weighted_sum(nn::flatten(nn::tanh(x))); });
  check_gradients({x}, [&] {
    V h = nn::tanh(x);
    return weighted_sum(nn::reshape(h, {6, -1})) + nn::sum(h);
  });
  check_gradients({x}, [&] {
    V h = nn::tanh(x);
    V direct = nn::sum(h);
    return direct + weighted_sum(nn::reshape(h, {-1}));
  });
  check_gradients({x}, [&] { return nn::sum(nn::reshape(nn::reshape(nn::tanh(x), {4, 6}), {-1})); });
  check_gradients({x}, [&] { return nn::sum(nn::tanh(x)); });
  check_gradients({x}, [&] { return nn::mean(nn::tanh(x)); });
  CHECK(nn::flatten(x).shape() == shape{2, 12});
  CHECK(nn::flatten(x, 0, 1).shape() == shape{6, 4});
  CHECK(nn::reshape(x, {-1}).shape() == shape{24});
  CHECK_THROWS_AS(nn::reshape(x, {5, -1}), kiln::error);
  CHECK_THROWS_AS(nn::reshape(x, {5, 5}), kiln::error);
}

TEST_CASE("gradient check: losses") {
  V x = random_leaf({4, 3}, 11), t = random_leaf({4, 3}, 12);
  for (auto r : {reduction::mean, reduction::sum}) {
    check_gradients({x, t}, [&] { return nn::mse_loss(x, t, r); });
    Tensor<std::int64_t> labels(shape{4}, {2, 0, 1, 2});
    check_gradients({x}, [&] { return nn::cross_entropy(x, labels, r); });
    V probabilities = nn::sigmoid(random_leaf({4, 3}, 13, 1.0, false));
    check_gradients({x}, [&] { return nn::binary_cross_entropy_with_logits(x, probabilities, r); });
  }
  // nll after log_softmax, cross-entropy with every option, and the L1 family away from its kinks (d = 0, |d| = beta).
  const std::vector<double> weight = {0.5, 2, 1.25};
  const std::vector<std::int64_t> some_ignored = {2, -1, 1, 0};
  for (auto r : {reduction::mean, reduction::sum}) {
    check_gradients({x}, [&] {
      return nn::nll_loss(nn::log_softmax(x, 1), some_ignored, {.reduce = r, .weight = weight, .ignore_index = -1});
    });
    check_gradients({x}, [&] {
      return nn::cross_entropy(x, some_ignored, {.reduce = r, .weight = weight, .ignore_index = -1,
                                                 .label_smoothing = 0.2});
    });
    check_gradients({x, t}, [&] { return nn::l1_loss(x, t, r); });
    check_gradients({x, t}, [&] { return nn::smooth_l1_loss(x, t, r, 0.6); });
    check_gradients({x, t}, [&] { return nn::huber_loss(x, t, r, 0.8); });
  }
  // A scaled loss: the saved gradient is scaled by the upstream gradient.
  Tensor<std::int64_t> labels(shape{4}, {1, 1, 0, 2});
  check_gradients({x}, [&] { return nn::cross_entropy(x, labels) * 0.25 + nn::mse_loss(x, t) * 3.0; });
}

TEST_CASE("gradient check: losses with reduction::none, weighted element by element (or row by row)") {
  V x = random_leaf({4, 3}, 21), t = random_leaf({4, 3}, 22);
  const auto none = reduction::none;
  check_gradients({x, t}, [&] { return weighted_sum(nn::mse_loss(x, t, none)); });
  check_gradients({x, t}, [&] { return weighted_sum(nn::l1_loss(x, t, none)); });
  check_gradients({x, t}, [&] { return weighted_sum(nn::smooth_l1_loss(x, t, none, 0.6)); });
  check_gradients({x, t}, [&] { return weighted_sum(nn::huber_loss(x, t, none, 0.8)); });
  V probabilities = nn::sigmoid(random_leaf({4, 3}, 23, 1.0, false));
  check_gradients({x}, [&] { return weighted_sum(nn::binary_cross_entropy_with_logits(x, probabilities, none)); });
  Tensor<std::int64_t> labels(shape{4}, {2, 0, 1, 2});
  check_gradients({x}, [&] { return weighted_sum(nn::cross_entropy(x, labels, none)); });
  const std::vector<double> weight = {0.5, 2, 1.25};
  const std::vector<std::int64_t> some_ignored = {2, -1, 1, 0};
  check_gradients({x}, [&] {
    return weighted_sum(nn::cross_entropy(
        x, some_ignored, {.reduce = none, .weight = weight, .ignore_index = -1, .label_smoothing = 0.2}));
  });
  check_gradients({x}, [&] {
    return weighted_sum(
        nn::nll_loss(nn::log_softmax(x, 1), some_ignored, {.reduce = none, .weight = weight, .ignore_index = -1}));
  });
  // Per-row losses feed on into other ops, and their gradient adds to another loss's in one leaf.
  check_gradients({x}, [&] {
    return nn::mean(nn::cross_entropy(x, labels, none) * 0.5) + nn::cross_entropy(x, labels);
  });
}

TEST_CASE("gradient check: a value used twice accumulates both gradients") {
  V x = random_leaf({3, 4}, 14), w = random_leaf({4, 4}, 15), b = random_leaf({4}, 16);
  check_gradients({x}, [&] { return weighted_sum(x * x); });
  check_gradients({x}, [&] { return weighted_sum(x + x); });
  check_gradients({x, w, b}, [&] {
    V h = nn::linear(x, w, b);
    return weighted_sum(nn::tanh(h) * nn::sigmoid(h) + nn::linear(h, w, b) + x);
  });
  // A leaf's gradient accumulates over two backward() calls, as in PyTorch.
  x.zero_grad();
  nn::sum(x * 2.0).backward();
  nn::sum(x * 3.0).backward();
  for (index_t i = 0; i < x.numel(); ++i) CHECK(x.grad()[i] == 5.0);
}

namespace {
// The residual block of the brief: y = relu(fc2(relu(fc1(x)))) + x.
struct residual_block : nn::basic_module<double> {
  std::shared_ptr<nn::basic_linear<double>> fc1, fc2;
  explicit residual_block(index_t n) {
    fc1 = register_module("fc1", nn::basic_linear<double>(n, n));
    fc2 = register_module("fc2", nn::basic_linear<double>(n, n));
  }
  V forward(const V& x) override { return nn::relu((*fc2)(nn::relu((*fc1)(x)))) + x; }
  std::string name() const override { return "ResidualBlock"; }
};
}  // namespace

TEST_CASE("gradient check: modules, a residual block and a Sequential") {
  manual_seed(3);
  residual_block block(5);
  V x = random_leaf({3, 5}, 17);
  std::vector<V> leaves{x};
  for (auto& p : block.parameters()) leaves.push_back(p);
  CHECK(leaves.size() == 5);
  check_gradients(leaves, [&] { return weighted_sum(block(x)); });

  nn::basic_sequential<double> net(nn::basic_flatten<double>(), nn::basic_linear<double>(6, 5),
                                   nn::basic_tanh<double>(), nn::basic_linear<double>(5, 4), nn::basic_gelu<double>(),
                                   nn::basic_leaky_relu<double>(0.2), nn::basic_sigmoid<double>(),
                                   nn::basic_relu<double>(), nn::basic_identity<double>(),
                                   nn::basic_log_softmax<double>(1));
  V image = random_leaf({3, 2, 3}, 18);
  leaves = {image};
  for (auto& p : net.parameters()) leaves.push_back(p);
  check_gradients(leaves, [&] { return weighted_sum(net(image)); });
  nn::basic_sequential<double> soft(nn::basic_linear<double>(6, 4, false), nn::basic_softmax<double>(-1));
  V flat = random_leaf({3, 6}, 19);
  leaves = {flat};
  for (auto& p : soft.parameters()) leaves.push_back(p);
  CHECK(leaves.size() == 2);
  check_gradients(leaves, [&] { return nn::mse_loss(soft(flat), nn::softmax(random_leaf({3, 4}, 20, 1, false), 1)); });
}

TEST_CASE("Variable basics") {
  nn::Variable v(Tensor<float>(shape{2, 2}, {1, 2, 3, 4}));
  CHECK(v.shape() == shape{2, 2});
  CHECK(v.is_leaf());
  CHECK_FALSE(v.requires_grad());
  CHECK_THROWS_AS(v.item(), kiln::error);
  CHECK_THROWS_AS(v.backward(), kiln::error);
  nn::Variable s = nn::sum(v);
  CHECK(s.item() == 10.0f);
  CHECK_THROWS_AS(s.backward(), kiln::error);  // nothing requires grad
  v.set_requires_grad(true);
  nn::Variable y = nn::sum(v * v);
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  nn::Variable d = y.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.item() == 30.0f);
  y.backward();
  CHECK(v.grad()[3] == 8.0f);
  CHECK_THROWS_AS(y.backward(), kiln::error);  // the graph is gone
  CHECK_THROWS_AS(nn::Variable().shape(), kiln::error);
}

TEST_CASE("Variable::borrowing reads the data in place and gives the results of a copy") {
  manual_seed(3);
  nn::Sequential model(nn::Linear(6, 8), nn::ReLU(), nn::Linear(8, 3));
  random_generator rng(4);
  Tensor<float> x(shape{5, 6});
  for (auto& v : x.span()) v = rng.normal<float>();
  auto loss_and_grads = [&](const nn::Variable& input) {
    model.zero_grad();
    nn::Variable loss = nn::sum(model(input));
    loss.backward();
    std::vector<float> out{loss.item()};
    for (auto& p : model.parameters())
      for (index_t i = 0; i < p.numel(); ++i) out.push_back(p.grad()[i]);
    return out;
  };
  const Tensor<float> saved(tensor_view<const float>(x.view()));
  const auto copied = loss_and_grads(nn::Variable(x));
  {
    auto borrowed = nn::Variable::borrowing(x);
    CHECK(borrowed.data() == x.data());
    CHECK(borrowed.is_leaf());
    CHECK_FALSE(borrowed.requires_grad());
    CHECK(loss_and_grads(borrowed) == copied);
  }
  // The borrowed variable is gone, and the data it read is the caller's as it was (neither written nor freed: the
  // sanitizer build would report a free of memory the variable does not own).
  for (index_t i = 0; i < x.numel(); ++i) CHECK(x[i] == saved[i]);
  CHECK(loss_and_grads(nn::Variable::borrowing(x.view())) == copied);
}

TEST_CASE("no_grad records nothing; dropped results leave nothing on the tape") {
  nn::Variable x(shape{2, 3}, true);
  {
    nn::no_grad guard;
    auto y = nn::relu(x * 2.0f);
    CHECK_FALSE(y.requires_grad());
    CHECK(nn::tape_size() == 0);
  }
  CHECK(nn::is_grad_enabled());
  {
    auto y = nn::relu(x * 2.0f);
    CHECK(nn::tape_size() == 2);
  }
  CHECK(nn::tape_size() == 0);
  nn::Variable frozen(shape{2, 3});  // requires no grad: nothing to record
  auto z = nn::tanh(frozen);
  CHECK(nn::tape_size() == 0);
}

TEST_CASE("parameters, buffers, names, train/eval, zero_grad") {
  struct encoder : nn::Module {
    std::shared_ptr<nn::Linear> fc1;
    nn::Variable running;
    encoder() {
      fc1 = register_module("fc1", nn::Linear(3, 4));
      running = register_buffer("running_mean", Tensor<float>(shape{4}, 0.5f));
    }
    nn::Variable forward(const nn::Variable& x) override { return (*fc1)(x); }
    std::string name() const override { return "Encoder"; }
  };
  struct model_t : nn::Module {
    std::shared_ptr<encoder> enc;
    nn::Variable scale;
    model_t() {
      enc = register_module("encoder", encoder());
      scale = register_parameter("scale", Tensor<float>(shape{4}, 1.0f));
    }
    nn::Variable forward(const nn::Variable& x) override { return (*enc)(x) * scale; }
  } model;
  auto named = model.named_parameters();
  REQUIRE(named.size() == 3);
  CHECK(named[0].first == "scale");
  CHECK(named[1].first == "encoder.fc1.weight");
  CHECK(named[2].first == "encoder.fc1.bias");
  CHECK(model.parameters().size() == 3);
  CHECK(model.parameter_count() == 4 + 12 + 4);
  auto buffers = model.named_buffers();
  REQUIRE(buffers.size() == 1);
  CHECK(buffers[0].first == "encoder.running_mean");
  auto dict = model.state_dict();
  REQUIRE(dict.size() == 4);
  // PyTorch's order: a module's parameters, its buffers, then its children.
  CHECK(dict[0].first == "scale");
  CHECK(dict[1].first == "encoder.running_mean");
  CHECK(dict[2].first == "encoder.fc1.weight");
  CHECK(dict[3].first == "encoder.fc1.bias");
  CHECK_THROWS_AS(model.register_parameter("scale", Tensor<float>(shape{1})), kiln::error);
  CHECK_THROWS_AS(model.register_buffer("a.b", Tensor<float>(shape{1})), kiln::error);

  CHECK(model.is_training());
  model.eval();
  CHECK_FALSE(model.is_training());
  CHECK_FALSE(model.enc->is_training());
  CHECK_FALSE(model.enc->fc1->is_training());
  model.train();
  CHECK(model.enc->fc1->is_training());

  nn::Variable x(Tensor<float>(shape{2, 3}, 1.0f));
  nn::sum(model(x)).backward();
  CHECK(model.scale.grad()[0] != 0.0f);
  model.zero_grad();
  for (auto& p : model.parameters())
    for (index_t i = 0; i < p.numel(); ++i) CHECK(p.grad()[i] == 0.0f);
  CHECK(model.to_string().find("(encoder): Encoder(") != std::string::npos);
}

TEST_CASE("load_state_dict: round trip, and errors leave the module unchanged") {
  manual_seed(1);
  nn::Sequential a(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  manual_seed(2);
  nn::Sequential b(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  auto before = b.state_dict();
  CHECK(before[0].first == "0.weight");
  CHECK(before[3].first == "2.bias");

  auto bad = a.state_dict();
  bad[2].second = Tensor<float>(shape{2, 5});
  try {
    b.load_state_dict(bad);
    FAIL("expected an error");
  } catch (const kiln::error& e) {
    std::string m = e.what();
    CHECK(m.find("2.weight") != std::string::npos);
    CHECK(m.find("[2, 4]") != std::string::npos);
    CHECK(m.find("[2, 5]") != std::string::npos);
  }
  auto missing = a.state_dict();
  missing.pop_back();
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing), doctest::Contains("missing key '2.bias'"), kiln::error);
  auto extra = a.state_dict();
  extra.emplace_back("3.weight", Tensor<float>(shape{1}));
  CHECK_THROWS_WITH_AS(b.load_state_dict(extra), doctest::Contains("unexpected key '3.weight'"), kiln::error);
  auto after = b.state_dict();
  for (std::size_t i = 0; i < before.size(); ++i)
    for (index_t j = 0; j < before[i].second.numel(); ++j) CHECK(after[i].second[j] == before[i].second[j]);

  b.load_state_dict(missing, /*strict=*/false);  // loads what is there
  b.load_state_dict(a.state_dict());
  std::map<std::string, Tensor<float>> as_map;
  for (auto& [k, t] : a.state_dict()) as_map.emplace(k, t);
  b.load_state_dict(as_map);
  auto loaded = b.state_dict();
  auto source = a.state_dict();
  for (std::size_t i = 0; i < source.size(); ++i)
    for (index_t j = 0; j < source[i].second.numel(); ++j) CHECK(loaded[i].second[j] == source[i].second[j]);
}

TEST_CASE("shape mismatch errors name the module, its index and both shapes") {
  nn::Sequential model(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
  nn::Variable x(shape{64, 100});
  try {
    model(x);
    FAIL("expected an error");
  } catch (const kiln::error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(m.find("Sequential[1] Linear(in_features=784, out_features=128)") != std::string::npos);
    CHECK(m.find("[*, 784]") != std::string::npos);
    CHECK(m.find("[64, 100]") != std::string::npos);
  }
  nn::Sequential soft(nn::Linear(4, 3), nn::Softmax(2));
  CHECK_THROWS_WITH_AS(soft(nn::Variable(shape{2, 4})), doctest::Contains("Sequential[1] Softmax(dim=2)"),
                       kiln::error);
  nn::Variable logits(shape{3, 4}, true);
  Tensor<std::int64_t> labels(shape{3}, {0, 4, 1});
  CHECK_THROWS_WITH_AS(nn::cross_entropy(logits, labels), doctest::Contains("found 4 at row 1"), kiln::error);
  CHECK_THROWS_AS(nn::cross_entropy(logits, Tensor<std::int64_t>(shape{2})), kiln::error);
  CHECK(nn::tape_size() == 0);
  CHECK_THROWS_AS(nn::add(logits, nn::Variable(shape{3})), kiln::error);
  CHECK_THROWS_AS(nn::matmul(logits, logits), kiln::error);
  CHECK(model.to_string().find("(1): Linear(in_features=784, out_features=128)") != std::string::npos);
}

TEST_CASE("Sequential is editable at run time") {
  nn::Sequential s(nn::Linear(2, 3), nn::ReLU());
  s.push_back(nn::Linear(3, 1));
  CHECK(s.size() == 3);
  s.insert(1, std::make_shared<nn::Tanh>());
  CHECK(s.size() == 4);
  CHECK(s[1].name() == "Tanh");
  auto names = s.named_parameters();
  CHECK(names[2].first == "3.weight");
  s.erase(1);
  CHECK(s.named_parameters()[2].first == "2.weight");
  CHECK(s(nn::Variable(shape{5, 2})).shape() == shape{5, 1});
  CHECK_THROWS_AS(s.erase(7), kiln::error);
}

TEST_CASE("freezing a parameter: Adam leaves it unchanged") {
  manual_seed(5);
  // (The last layer has 2 outputs: kiln::optim's Adam skips allocating moments for a one-element parameter.)
  nn::Sequential model(nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2));
  auto params = model.parameters();
  params[0].set_requires_grad(false);  // 0.weight
  Tensor<float> frozen(tensor_view<const float>(params[0].value()));
  Tensor<float> other(tensor_view<const float>(params[2].value()));
  optim::Adam opt(model.parameters(), {.lr = 0.1});
  nn::Variable x(Tensor<float>(shape{2, 3}, {1, 2, 3, -1, 0, 2}));
  nn::Variable t(Tensor<float>(shape{2, 2}, {0.5f, -0.5f, 1, 0}));
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    nn::mse_loss(model(x), t).backward();
    opt.step();
  }
  for (index_t i = 0; i < frozen.numel(); ++i) CHECK(params[0].value()[i] == frozen[i]);
  bool changed = false;
  for (index_t i = 0; i < other.numel(); ++i) changed = changed || params[2].value()[i] != other[i];
  CHECK(changed);
}

TEST_CASE("a small MLP trained with Adam lowers its loss") {
  manual_seed(7);
  nn::Sequential model(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  optim::Adam opt(model.parameters(), {.lr = 1e-2});
  random_generator rng(11);
  Tensor<float> x(shape{32, 4});
  Tensor<std::int64_t> y(shape{32});
  for (index_t i = 0; i < 32; ++i) {
    float s = 0;
    for (int j = 0; j < 4; ++j) s += (x.at(i, j) = rng.normal<float>()) * float(j - 1);
    y[i] = s < -0.5f ? 0 : (s < 0.5f ? 1 : 2);
  }
  nn::Variable input(x);
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    auto loss = nn::cross_entropy(model(input), y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  CHECK(last < 0.3f * first);
}

TEST_CASE("static and dynamic mode: same seed, same weights, bit-identical losses") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Dense<3>>;
  Net net(16, 21);
  manual_seed(21);
  nn::Sequential model(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
  auto static_dict = net.state_dict();
  auto dynamic_dict = model.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  for (std::size_t i = 0; i < static_dict.size(); ++i) {
    CHECK(static_dict[i].first == dynamic_dict[i].first);
    REQUIRE(static_dict[i].second.shape() == dynamic_dict[i].second.shape());
    for (index_t j = 0; j < static_dict[i].second.numel(); ++j)
      CHECK(static_dict[i].second[j] == dynamic_dict[i].second[j]);
  }
  random_generator rng(4);
  Tensor<float> x(shape{16, 4});
  Tensor<std::int64_t> y(shape{16});
  for (auto& v : x.span()) v = rng.normal<float>();
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(3));
  optim::Adam static_opt({.lr = 1e-2});
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-2});
  nn::Variable input(x);
  for (int step = 0; step < 5; ++step) {
    float s = net.train_step(x, y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    dynamic_opt.step();
    CHECK(s == l.item());
  }
}
