// Dynamic mode with more than one graph on the tape: backward() frees only the graph of its loss, as PyTorch without
// retain_graph, so other graphs keep their gradients (the GAN pattern); a backward that would need a freed graph
// raises an error instead of losing a gradient; the tape stays bounded when a graph outlives many steps; and a very
// long recorded chain is released without recursion.
#include <doctest/doctest.h>

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
