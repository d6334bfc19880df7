// Dynamic mode with more than one graph on the tape: backward() frees only the graph of its loss, as PyTorch without
// retain_graph, so other graphs keep their gradients (the GAN pattern); a backward that would need a freed graph
// raises an error instead of losing a gradient; the tape stays bounded when a graph outlives many steps; a very long
// recorded chain is released without recursion; and backward({.retain_graph = true}) keeps a graph for another
// backward, which gives the same gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

nn::Variable leaf(const shape& s, float start, float step, bool requires_grad = true) {
  Tensor<float> t(s);
  float v = start;
  for (auto& x : t.span()) {
    x = v;
    v += step;
  }
  return nn::Variable(t, requires_grad);
}

std::vector<float> gradient_of(const nn::Variable& v) {
  auto g = v.grad();
  return std::vector<float>(g.data(), g.data() + g.numel());
}

// A small generator and discriminator with fixed parameters.
struct gan {
  nn::Linear g{2, 3}, d{3, 1};
  gan() {
    float v = -0.3f;
    for (auto& p : {g.weight, g.bias, d.weight, d.bias}) {
      auto values = p.value();
      for (index_t i = 0; i < values.numel(); ++i) values[i] = (v += 0.13f);
    }
  }
};

}  // namespace

TEST_CASE("backward frees only its loss's graph: the GAN pattern keeps the generator's gradients") {
  const nn::Variable z = leaf(shape{4, 2}, -0.7f, 0.2f, false);
  // Reference: the generator's loss alone, with no other graph on the tape.
  gan reference;
  nn::sum(nn::sigmoid(reference.d(reference.g(z)))).backward();
  const auto expected_weight = gradient_of(reference.g.weight), expected_bias = gradient_of(reference.g.bias);

  gan m;
  nn::Variable fake = m.g(z);
  // The discriminator's step on a detached copy: its backward must leave the generator's graph alone.
  nn::sum(nn::sigmoid(m.d(fake.detach()))).backward();
  CHECK(nn::tape_size() > 0);  // the generator's entries, still differentiable
  m.d.zero_grad();
  nn::sum(nn::sigmoid(m.d(fake))).backward();
  CHECK(gradient_of(m.g.weight) == expected_weight);
  CHECK(gradient_of(m.g.bias) == expected_bias);
  for (float g : expected_weight) CHECK(g != 0.0f);
  CHECK(nn::tape_size() == 0);
}

TEST_CASE("two losses over one input, back-propagated in either order, each see their own graph") {
  nn::Variable x = leaf(shape{4}, -0.3f, 0.25f);
  nn::Variable first = nn::sum(nn::tanh(x) * 2.0f);
  nn::Variable second = nn::sum(x * x);
  second.backward();  // recorded last, walked first: `first`'s graph lies below it on the tape
  const auto from_second = gradient_of(x);
  x.zero_grad();
  first.backward();
  const auto xs = x.tensor();
  for (index_t i = 0; i < 4; ++i) {
    const float t = std::tanh(xs[i]);
    CHECK(from_second[static_cast<std::size_t>(i)] == doctest::Approx(2 * xs[i]));
    CHECK(x.grad()[i] == doctest::Approx(2 * (1 - t * t)));
  }
  CHECK(nn::tape_size() == 0);
}

TEST_CASE("a backward that needs a graph an earlier backward freed raises an error and leaves no gradient behind") {
  nn::Variable x = leaf(shape{4}, 0.1f, 0.2f);
  nn::Variable w = leaf(shape{4}, 0.3f, -0.1f);
  nn::Variable h = nn::tanh(x);
  nn::sum(h).backward();
  const auto after_first = gradient_of(x);
  // PyTorch: "Trying to backward through the graph a second time". Before, h's gradient stopped there silently.
  nn::Variable second = nn::sum(h * w);
  CHECK_THROWS_WITH_AS(second.backward(), doctest::Contains("freed by an earlier backward()"), kiln::error);
  CHECK(gradient_of(x) == after_first);
  CHECK_FALSE(h.has_grad());  // the aborted walk's gradients on intermediate values are dropped
  // The same after clear_tape().
  nn::Variable y = nn::sigmoid(x);
  nn::clear_tape();
  CHECK_THROWS_WITH_AS(nn::sum(y * w).backward(), doctest::Contains("freed by an earlier backward()"), kiln::error);
  // Detached, the value is a constant and the backward goes through.
  x.zero_grad();
  w.zero_grad();
  nn::sum(h.detach() * w).backward();
  for (index_t i = 0; i < 4; ++i) CHECK(w.grad()[i] == h.tensor()[i]);
  CHECK(nn::tape_size() == 0);
  // The tape is usable afterwards: a fresh graph back-propagates as usual.
  x.zero_grad();
  nn::sum(nn::tanh(x)).backward();
  CHECK(gradient_of(x) == after_first);
}

TEST_CASE("a graph kept alive across many steps does not make the tape grow") {
  nn::Linear model(3, 3);
  const nn::Variable input = leaf(shape{2, 3}, -0.5f, 0.1f, false);
  nn::Variable kept;  // an evaluation result kept from one step to the next, without no_grad
  std::size_t largest = 0;
  for (int step = 0; step < 2000; ++step) {
    model.zero_grad();
    nn::sum(nn::tanh(model(input))).backward();
    kept = nn::relu(model(input));  // its entries sit above the dead ones of the step before
    largest = std::max(largest, nn::tape_size());
  }
  CHECK(largest < 600);
  kept = nn::Variable();
  CHECK(nn::tape_size() == 0);
}

TEST_CASE("a long recorded chain is released without recursion") {
  nn::Variable x = leaf(shape{1}, 0.5f, 0.0f);
  {
    nn::Variable acc = x;
    for (int i = 0; i < 1000000; ++i) acc = acc + x;  // e.g. total = total + loss, without no_grad or detach
    CHECK(nn::tape_size() == 1000000);
  }  // dropping acc released the chain one node after another (this overflowed the stack)
  CHECK(nn::tape_size() == 0);
  nn::Variable acc = x;
  for (int i = 0; i < 100000; ++i) acc = acc + x;
  acc.backward();  // the backward and the release of what it freed
  CHECK(x.grad()[0] == 100001.0f);
  CHECK(nn::tape_size() == 0);
}

namespace {
// Every parameter's gradient and the input's, in order.
std::vector<std::vector<float>> gradients_of(const nn::Module& m, const nn::Variable& input) {
  std::vector<std::vector<float>> out;
  for (const auto& p : m.parameters()) out.push_back(gradient_of(p));
  out.push_back(gradient_of(input));
  return out;
}

// A second backward through a retained graph must give the first one's gradients bit for bit: no op's backward may
// consume what it saved (an activation overwritten in place, a mask, a recurrent cell's states).
void check_retained_backward_repeats(nn::Module& model, const nn::Variable& input,
                                     const std::function<nn::Variable(const nn::Variable&)>& loss_of) {
  nn::Variable loss = loss_of(model(input));
  loss.backward({.retain_graph = true});
  const auto first = gradients_of(model, input);
  CHECK(nn::tape_size() > 0);
  model.zero_grad();
  input.zero_grad();
  loss.backward();
  CHECK(gradients_of(model, input) == first);
  CHECK(nn::tape_size() == 0);
  // Without retain_graph the second backward freed it.
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("already freed"), kiln::error);
  for (const auto& g : first) CHECK(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; }));
}
}  // namespace

TEST_CASE("backward with retain_graph keeps the graph: a second backward repeats every layer's gradients") {
  SUBCASE("convolution, batch norm, pooling, layer norm, dropout and the activations") {
    kiln::manual_seed(11);
    nn::Sequential model(nn::Conv2d(1, 4, 3), nn::BatchNorm2d(4), nn::ReLU(), nn::MaxPool2d(2), nn::Conv2d(4, 3, 3),
                         nn::GELU(), nn::AvgPool2d(2), nn::Flatten(), nn::Linear(3, 16), nn::LayerNorm(16),
                         nn::LeakyReLU(0.1f), nn::Dropout(0.3f), nn::Linear(16, 8), nn::Sigmoid(), nn::Linear(8, 3),
                         nn::Tanh());
    model.train();
    const nn::Variable x = leaf(shape{4, 1, 10, 10}, -1.0f, 0.005f);
    Tensor<std::int64_t> labels(shape{4});
    for (index_t i = 0; i < 4; ++i) labels[i] = i % 3;
    check_retained_backward_repeats(model, x, [&](const nn::Variable& out) { return nn::cross_entropy(out, labels); });
  }
  SUBCASE("a stacked bidirectional LSTM and a GRU") {
    kiln::manual_seed(12);
    nn::Sequential model(nn::AllSteps(nn::LSTM(5, 6, {.num_layers = 2, .batch_first = true, .bidirectional = true})),
                         nn::LastStep(nn::GRU(12, 4, {.batch_first = true})), nn::Linear(4, 2));
    const nn::Variable x = leaf(shape{3, 7, 5}, -0.8f, 0.015f);
    const nn::Variable target = leaf(shape{3, 2}, 0.5f, -0.2f, false);
    check_retained_backward_repeats(model, x, [&](const nn::Variable& out) { return nn::mse_loss(out, target); });
  }
  SUBCASE("softmax and log-softmax along either dimension, products, reshapes and a binary cross-entropy") {
    kiln::manual_seed(14);
    nn::Linear model(5, 6);
    const nn::Variable x = leaf(shape{4, 5}, -0.6f, 0.07f);
    const nn::Variable project = leaf(shape{4, 3}, 0.3f, -0.05f, false);
    const nn::Variable target = leaf(shape{6, 3}, 0.0f, 0.05f, false);
    check_retained_backward_repeats(model, x, [&](const nn::Variable& out) {
      nn::Variable mixed = nn::mul(nn::softmax(out, 1), out);
      nn::Variable moved = nn::reshape(nn::log_softmax(mixed, 0), shape{6, 4});
      nn::Variable logits = nn::neg(nn::sub(nn::matmul(moved, project), target));
      return nn::binary_cross_entropy_with_logits(logits, target);
    });
  }
}

TEST_CASE("two losses over one graph: the first backward retains it, and the gradients add up as for their sum") {
  kiln::manual_seed(13);
  nn::Linear trunk(4, 8), head_a(8, 2), head_b(8, 1);
  const nn::Variable x = leaf(shape{5, 4}, -1.0f, 0.1f, false);
  auto losses = [&] {
    nn::Variable h = nn::relu(trunk(x));
    return std::pair{nn::sum(nn::sigmoid(head_a(h))), nn::mean(nn::tanh(head_b(h)))};
  };
  auto [sum_a, sum_b] = losses();
  (sum_a + sum_b).backward();
  const auto expected = gradient_of(trunk.weight);
  trunk.zero_grad();
  auto [a, b] = losses();
  a.backward({.retain_graph = true});
  b.backward();
  const auto got = gradient_of(trunk.weight);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  // Without retain_graph, the second loss would have needed the trunk's freed graph.
  auto [c, d] = losses();
  c.backward();
  CHECK_THROWS_WITH_AS(d.backward(), doctest::Contains("freed"), kiln::error);
}
