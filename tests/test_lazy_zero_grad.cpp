// Dynamic mode's lazy zero_grad: a parameter's gradient cleared by zero_grad is only marked, and must still behave
// exactly as a zero-filled one: the next backward writes it (equal to a first backward's), a second adds, reading it
// gives zeros, an optimizer steps on zeros where no gradient reached it, and a weight cleared beside a bias that was
// not gets written while the bias is added to.
#include <doctest/doctest.h>

#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

nn::Variable input_batch(std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<float> t(shape{5, 6});
  for (auto& v : t.span()) v = rng.normal<float>();
  return nn::Variable(t);
}

// Two Linear layers with a ReLU between them: 6 -> 8 -> 3.
nn::Sequential small_mlp() {
  manual_seed(3);
  return nn::Sequential(nn::Linear(6, 8), nn::ReLU(), nn::Linear(8, 3));
}

std::vector<Tensor<float>> gradients_of(nn::Module& model) {
  std::vector<Tensor<float>> grads;
  for (auto& p : model.parameters()) grads.emplace_back(tensor_view<const float>(p.grad()));
  return grads;
}

void check_equal(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b, float scale_b = 1.0f) {
  REQUIRE(a.size() == b.size());
  for (std::size_t t = 0; t < a.size(); ++t)
    for (index_t i = 0; i < a[t].numel(); ++i) CHECK(a[t][i] == scale_b * b[t][i]);
}

}  // namespace

TEST_CASE("after zero_grad a backward writes the gradients (equal to a first backward's) and the next one adds") {
  for (int way = 0; way < 3; ++way) {  // the optimizer's zero_grad, the module's, each variable's
    CAPTURE(way);
    auto fresh = small_mlp();
    nn::sum(fresh(input_batch(2))).backward();
    const auto expected = gradients_of(fresh);

    auto model = small_mlp();
    optim::Adam opt(model.parameters(), {.lr = 0.1});
    nn::sum(model(input_batch(1))).backward();  // gradients of another batch, to be cleared
    if (way == 0) opt.zero_grad();
    if (way == 1) model.zero_grad();
    if (way == 2)
      for (auto& p : model.parameters()) p.zero_grad();
    nn::sum(model(input_batch(2))).backward();
    check_equal(gradients_of(model), expected);
    nn::sum(model(input_batch(2))).backward();
    check_equal(gradients_of(model), expected, 2.0f);
  }
}

TEST_CASE("a gradient cleared by zero_grad reads as zeros") {
  auto model = small_mlp();
  optim::Adam opt(model.parameters(), {.lr = 0.1});
  nn::sum(model(input_batch(1))).backward();
  opt.zero_grad();
  for (auto& p : model.parameters()) {
    REQUIRE(p.has_grad());
    for (index_t i = 0; i < p.numel(); ++i) CHECK(p.grad()[i] == 0.0f);
  }
}

TEST_CASE("a parameter that no gradient reaches after zero_grad is stepped as with a zero gradient") {
  // The second layer is left out of the second step's graph: Adam must see zeros there, not the first step's
  // gradient that still sits in the buffer. The reference optimizer sees the same parameters through slots that
  // have no pending-zero flag, so its zero_grad fills.
  auto model = small_mlp();
  auto reference_model = small_mlp();
  auto slots_of = [](nn::Module& m) {
    std::vector<optim::parameter_slot<float>> slots;
    for (auto& p : m.parameters()) slots.push_back({p.data(), p.grad().data(), p.numel(), nullptr, nullptr});
    return slots;
  };
  optim::Adam opt(model.parameters(), {.lr = 0.1});
  optim::Adam reference(slots_of(reference_model), {.lr = 0.1});
  auto first_layer_only = [](nn::Sequential& m, const nn::Variable& x) { return nn::sum(m[0](x)); };
  for (auto* m : {&model, &reference_model}) nn::sum((*m)(input_batch(1))).backward();
  opt.step();
  reference.step();
  opt.zero_grad();
  reference.zero_grad();
  first_layer_only(model, input_batch(2)).backward();
  first_layer_only(reference_model, input_batch(2)).backward();
  opt.step();
  reference.step();
  auto params = model.parameters(), reference_params = reference_model.parameters();
  for (std::size_t t = 0; t < params.size(); ++t) {
    CAPTURE(t);
    for (index_t i = 0; i < params[t].numel(); ++i) CHECK(params[t].value()[i] == reference_params[t].value()[i]);
  }
}

TEST_CASE("a weight cleared beside a bias that was not, or the reverse: the cleared one is written, the other added") {
  auto fresh = small_mlp();
  nn::sum(fresh(input_batch(2))).backward();
  const auto expected = gradients_of(fresh);  // weight, bias of layer 0, then layer 2

  for (std::size_t cleared : {0u, 1u}) {  // layer 0's weight, or its bias
    CAPTURE(cleared);
    auto model = small_mlp();
    nn::sum(model(input_batch(2))).backward();
    model.parameters()[cleared].zero_grad();
    nn::sum(model(input_batch(2))).backward();
    const auto grads = gradients_of(model);
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (index_t i = 0; i < grads[t].numel(); ++i)
        CHECK(grads[t][i] == (t == cleared ? 1.0f : 2.0f) * expected[t][i]);
  }
}

TEST_CASE("backward from a one-element leaf after zero_grad seeds its gradient with 1") {
  nn::Variable leaf(Tensor<float>(shape{1}, 3.0f), true);
  leaf.backward();
  leaf.backward();
  CHECK(leaf.grad()[0] == 2.0f);
  leaf.zero_grad();
  leaf.backward();
  CHECK(leaf.grad()[0] == 1.0f);
}

TEST_CASE("a recurrent module's parameters (views into one flat array) clear with zero_grad as well") {
  auto run = [](nn::LSTM& lstm, std::uint64_t seed) {
    random_generator rng(seed);
    Tensor<float> t(shape{2, 4, 3});
    for (auto& v : t.span()) v = rng.normal<float>();
    nn::sum(lstm.forward(nn::Variable(t))).backward();
  };
  manual_seed(4);
  nn::LSTM fresh(3, 5, {.batch_first = true});
  run(fresh, 2);
  const auto expected = gradients_of(fresh);
  manual_seed(4);
  nn::LSTM lstm(3, 5, {.batch_first = true});
  optim::Adam opt(lstm.parameters(), {.lr = 0.1});
  run(lstm, 1);
  opt.zero_grad();
  run(lstm, 2);
  check_equal(gradients_of(lstm), expected);
}
