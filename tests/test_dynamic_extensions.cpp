// What a user builds on dynamic mode's tensor ops: a Function of their own (nn::Function), nn::Embedding and
// nn::Unflatten, static mode's Embedding with dynamic mode's bits, a self-attention block written by hand, the
// refusal of value() on a temporary, and the error messages of the broadcasting ops. The ops themselves are checked
// one by one in test_tensor_ops.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradient_check.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using V = nn::basic_variable<double>;
using kiln::test::check_gradients;
using kiln::test::random_leaf;
using kiln::test::weighted_sum;

namespace {

// y = tanh(x) * scale, with a backward of its own from the saved output.
struct ScaledTanh : nn::basic_function<ScaledTanh, double> {
  static V forward(nn::basic_function_context<double>& ctx, const V& x, double scale) {
    auto y = nn::tanh(x);
    ctx.save_for_backward({y});
    ctx.saved_data["scale"] = scale;
    return y * scale;
  }
  static std::vector<V> backward(nn::basic_function_context<double>& ctx, const V& grad) {
    const V& y = ctx.saved_variables()[0];
    return {grad * (1.0 - y * y) * ctx.saved_data["scale"]};
  }
};

// a * b with a hand-written backward that skips the inputs that need none.
struct Product : nn::basic_function<Product, double> {
  static inline int b_gradients = 0;
  static V forward(nn::basic_function_context<double>& ctx, const V& a, const V& b) {
    ctx.save_for_backward({a, b});
    return a * b;
  }
  static std::vector<V> backward(nn::basic_function_context<double>& ctx, const V& grad) {
    const auto& saved = ctx.saved_variables();
    V db;
    if (ctx.needs_input_grad(1)) {
      ++b_gradients;
      db = grad * saved[0];
    }
    return {grad * saved[1], db};
  }
};

struct WrongCount : nn::basic_function<WrongCount, double> {
  static V forward(nn::basic_function_context<double>&, const V& a, const V& b) { return a + b; }
  static std::vector<V> backward(nn::basic_function_context<double>&, const V& grad) { return {grad}; }
};

// The self-attention block of the README's dynamic-mode section, for double: causal multi-head attention over
// [batch, length, width], one line per step of the formula.
struct SelfAttention : nn::basic_module<double> {
  SelfAttention(index_t width, index_t heads) : heads(heads) {
    qkv = register_module("qkv", nn::basic_linear<double>(width, 3 * width));
    out = register_module("out", nn::basic_linear<double>(width, width));
  }
  V forward(const V& x) override {
    const index_t B = x.shape()[0], L = x.shape()[1], W = x.shape()[2], D = W / heads;
    auto parts = nn::chunk((*qkv)(x), 3, -1);  // q, k, v: [B, L, W] each
    auto split_heads = [&](const V& t) { return nn::transpose(nn::view(t, {B, L, heads, D}), 1, 2); };
    auto q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);  // [B, H, L, D]
    auto scores = nn::matmul(q, nn::transpose(k, -2, -1)) / std::sqrt(double(D));        // [B, H, L, L]
    Tensor<double> later({L, L});                                                         // 1 above the diagonal
    for (index_t i = 0; i < L; ++i)
      for (index_t j = i + 1; j < L; ++j) later.at(i, j) = 1;
    auto weights = nn::softmax(nn::masked_fill(scores, V(later), -1e9), -1);
    auto heads_out = nn::matmul(weights, v);                                              // [B, H, L, D]
    return (*out)(nn::reshape(nn::transpose(heads_out, 1, 2), {B, L, W}));
  }
  index_t heads;
  std::shared_ptr<nn::basic_linear<double>> qkv, out;
};

}  // namespace

TEST_CASE("Function: a hand-written backward, checked by finite differences") {
  V x = random_leaf({2, 3}, 1);
  check_gradients({x}, [&] { return weighted_sum(ScaledTanh::apply(x, 2.5)); });
  V a = random_leaf({4}, 2), b = random_leaf({4}, 3);
  check_gradients({a, b}, [&] { return weighted_sum(Product::apply(nn::exp(a), b) + a); });
}

TEST_CASE("Function: needs_input_grad, no recording under no_grad, and a wrong gradient count") {
  V a = random_leaf({3}, 4), c(Tensor<double>({3}, {1.0, 2.0, 3.0}));
  Product::b_gradients = 0;
  nn::sum(Product::apply(a, c)).backward();
  CHECK(Product::b_gradients == 0);
  for (index_t i = 0; i < 3; ++i) CHECK(a.grad()[i] == c.value()[i]);
  {
    nn::no_grad guard;
    CHECK_FALSE(Product::apply(a, c).requires_grad());
  }
  CHECK(nn::tape_size<double>() == 0);
  V b = random_leaf({3}, 5);
  auto y = nn::sum(WrongCount::apply(a, b));
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("expected 2 gradients"), kiln::error);
}

TEST_CASE("a self-attention block written with the tensor ops: gradients by finite differences") {
  manual_seed(7);
  SelfAttention attention(8, 2);
  V x = random_leaf({2, 5, 8}, 6);
  std::vector<V> leaves{x};
  for (auto& p : attention.parameters()) leaves.push_back(p);
  check_gradients(leaves, [&] { return weighted_sum(attention(x)); });
  // Causal: the first position's output does not depend on the later ones.
  V changed(x.tensor());
  changed.value()[8 * 4] += 1.0;  // batch 0, position 4
  nn::no_grad guard;
  const auto before = attention(x).tensor(), after = attention(changed).tensor();
  for (index_t j = 0; j < 8; ++j) CHECK(before.at(0, 0, j) == after.at(0, 0, j));
  CHECK(before.at(0, 4, 0) != after.at(0, 4, 0));
}

TEST_CASE("nn::Embedding: PyTorch's initialisation and padding row, ids as a Tensor or a Variable") {
  manual_seed(3);
  nn::Embedding table(10, 4, {.padding_idx = 2});
  CHECK(table.describe() == "Embedding(10, 4, padding_idx=2)");
  CHECK(table.weight.shape() == shape{10, 4});
  for (index_t j = 0; j < 4; ++j) CHECK(table.weight.value()[2 * 4 + j] == 0.0f);
  Tensor<std::int64_t> ids({2, 3}, {1, 2, 9, 2, 0, 1});
  auto y = table(ids);
  CHECK(y.shape() == shape{2, 3, 4});
  for (index_t j = 0; j < 4; ++j) CHECK(y.value()[2 * 4 + j] == table.weight.value()[9 * 4 + j]);
  nn::sum(y).backward();
  for (index_t j = 0; j < 4; ++j) {
    CHECK(table.weight.grad()[1 * 4 + j] == 2.0f);  // id 1 appears twice
    CHECK(table.weight.grad()[2 * 4 + j] == 0.0f);  // the padding row learns nothing
    CHECK(table.weight.grad()[3 * 4 + j] == 0.0f);
  }
  auto same = table(nn::Variable(Tensor<float>({2, 3}, {1, 2, 9, 2, 0, 1})));
  CHECK(same.tensor().span()[5] == y.tensor().span()[5]);
  CHECK_THROWS_WITH_AS(table(Tensor<std::int64_t>({1}, {10})), doctest::Contains("Embedding(10, 4"), kiln::error);
  CHECK_THROWS_WITH_AS(table(nn::Variable(Tensor<float>({1}, {1.5f}))), doctest::Contains("whole-number ids"),
                       kiln::error);
  nn::Unflatten unflatten(1, {2, -1});
  CHECK(unflatten(nn::Variable(Tensor<float>({3, 6}))).shape() == shape{3, 2, 3});
}

TEST_CASE("static Embedding trains with the bits of dynamic nn::Embedding") {
  using Net = Sequential<policy::cpu, Input<6>, Embedding<20, 4>, Flatten, Dense<3>>;
  Net net(8, 11);
  manual_seed(11);
  auto model = nn::Sequential(nn::Embedding(20, 4), nn::Flatten(), nn::Linear(24, 3));
  const auto state = net.state_dict();
  CHECK(state.front().first == "0.weight");
  random_generator rng(5);
  Tensor<float> ids({8, 6});
  for (auto& v : ids.span()) v = static_cast<float>(rng.below(20));
  Tensor<std::int64_t> labels({8});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(3));
  optim::SGD static_opt({.lr = 0.5});
  optim::SGD dynamic_opt(model.parameters(), {.lr = 0.5});
  nn::Variable input(ids);
  for (int step = 0; step < 20; ++step) {
    CAPTURE(step);
    const float s = net.train_step(ids, labels, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), labels);
    l.backward();
    dynamic_opt.step();
    REQUIRE(s == l.item());
  }
  const auto params = model.parameters();
  const auto values = net.parameter_values();
  for (index_t i = 0; i < 20 * 4; ++i) REQUIRE(values[static_cast<std::size_t>(i)] == params[0].value()[i]);
  Tensor<float> bad({8, 6});
  bad.data()[3] = 20;
  CHECK_THROWS_WITH_AS(net.forward(bad.view()), doctest::Contains("whole numbers in [0, 20)"), kiln::error);
}

template <class Handle>
concept views_of_a_temporary = requires { std::declval<Handle>().value(); } ||
                               requires { std::declval<Handle>().data(); } ||
                               requires { std::declval<Handle>().grad(); };
template <class Handle>
concept views_of_a_name = requires(const Handle& v) {
  v.value();
  v.data();
  v.grad();
};

TEST_CASE("value(), data() and grad() are refused on a temporary Variable") {
  static_assert(!views_of_a_temporary<nn::Variable>);
  static_assert(!views_of_a_temporary<const nn::Variable>);
  static_assert(views_of_a_name<nn::Variable>);
  // What stays allowed on a temporary: copies.
  nn::Variable x(Tensor<float>({2}, {1.0f, 2.0f}));
  CHECK(nn::sum(x).item() == 3.0f);
  CHECK(nn::exp(x).tensor().span()[0] == doctest::Approx(std::exp(1.0f)));
}

TEST_CASE("broadcasting and matmul errors name the op, both shapes and the rule") {
  nn::Variable a(Tensor<float>({2, 3})), b(Tensor<float>({4, 3})), c(Tensor<float>({2, 4}));
  CHECK_THROWS_WITH_AS(nn::div(a, b), doctest::Contains("div: shapes [2, 3] and [4, 3] do not broadcast"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::add(a, c), doctest::Contains("must be equal or one of them 1"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::matmul(a, c), doctest::Contains("matmul: the inner extents differ: [2, 3] x [2, 4]"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(nn::cat(std::vector<nn::Variable>{a, c}, 0), doctest::Contains("cat: tensor 1 has shape [2, 4]"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(nn::einsum("ij,jk->ik", {a, b}), doctest::Contains("subscript 'j'"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::gather(a, 1, Tensor<std::int64_t>({2, 1}, {0, 3})),
                       doctest::Contains("index 3 at position 1"), kiln::error);
}

TEST_CASE("a cat of many inputs keeps them alive for its backward, and frees them with its graph") {
  std::vector<nn::Variable> parts;
  for (int i = 0; i < 7; ++i) parts.emplace_back(Tensor<float>({1, 2}, {float(i), float(i)}), true);
  auto y = nn::sum(nn::cat(parts, 0) * nn::Variable(Tensor<float>({7, 1}, {1, 2, 3, 4, 5, 6, 7})));
  std::vector<nn::Variable> leaves = parts;
  parts.clear();
  y.backward();
  for (int i = 0; i < 7; ++i) CHECK(leaves[static_cast<std::size_t>(i)].grad()[1] == float(i + 1));
  CHECK(nn::tape_size() == 0);
}
