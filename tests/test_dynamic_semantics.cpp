// Dynamic-mode behaviour checked against PyTorch's: nn::Sequential re-draws only modules fresh from their
// constructors (never weights the caller set), leaky_relu's negative slope, log_softmax and cross_entropy for large
// logits, and recurrent initial-state errors in the caller's terms.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

std::vector<float> values_of(const nn::Variable& v) {
  const Tensor<float> t = v.tensor();
  return std::vector<float>(t.data(), t.data() + t.numel());
}
std::vector<float> grad_of(const nn::Variable& v) {
  auto g = v.grad();
  return std::vector<float>(g.data(), g.data() + g.numel());
}

}  // namespace

TEST_CASE("Sequential puts fresh children's init streams in positional order, as a static Sequential") {
  manual_seed(9);
  nn::Linear first(4, 3);  // one statement each: drawn in positional order whatever the compiler's
  nn::Linear second(3, 2);
  manual_seed(9);
  nn::Sequential model(nn::Linear(4, 3), nn::ReLU(), nn::Sequential(nn::Linear(3, 2)));
  auto params = model.parameters();
  REQUIRE(params.size() == 4);
  CHECK(values_of(params[0]) == values_of(first.weight));
  CHECK(values_of(params[1]) == values_of(first.bias));
  CHECK(values_of(params[2]) == values_of(second.weight));
  CHECK(values_of(params[3]) == values_of(second.bias));
}

TEST_CASE("Sequential never re-draws weights the caller set or a module made before the others") {
  SUBCASE("weights written after construction (e.g. by load_state_dict)") {
    manual_seed(4);
    auto pretrained = std::make_shared<nn::Linear>(2, 2);
    auto w = pretrained->weight.value();
    for (index_t i = 0; i < w.numel(); ++i) w[i] = 7.0f;
    const auto bias = values_of(pretrained->bias);
    auto head = std::make_shared<nn::Linear>(2, 2);
    const auto head_weight = values_of(head->weight);
    nn::Sequential model(head, pretrained);  // streams out of position order, but one module is not fresh
    CHECK(values_of(pretrained->weight) == std::vector<float>(4, 7.0f));
    CHECK(values_of(pretrained->bias) == bias);
    CHECK(values_of(head->weight) == head_weight);
  }
  SUBCASE("an untouched module drawn before another model's") {
    manual_seed(4);
    auto shared = std::make_shared<nn::Linear>(3, 3);
    nn::Sequential elsewhere(shared, nn::Linear(3, 1));
    const auto weight = values_of(shared->weight);
    nn::Sequential model(nn::Linear(3, 3), shared);  // its stream is not among the ones drawn last
    CHECK(values_of(shared->weight) == weight);
  }
}

TEST_CASE("leaky_relu: negative slopes are rejected, others give PyTorch's gradient") {
  nn::Variable x(Tensor<float>(shape{5}, {-2.0f, -0.5f, 0.0f, 0.5f, 2.0f}), true);
  // The backward tells x's sign from y's, which a negative slope breaks: the gradient for x < 0 came out as 1.
  CHECK_THROWS_WITH_AS(nn::leaky_relu(x, -0.5f), doctest::Contains("expected negative_slope >= 0, found -0.5"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(nn::LeakyReLU(-0.5f), doctest::Contains("LeakyReLU: expected negative_slope >= 0"),
                       kiln::error);
  CHECK_THROWS_AS(nn::leaky_relu(x, std::numeric_limits<float>::quiet_NaN()), kiln::error);
  CHECK(nn::tape_size() == 0);
  // torch.nn.functional.leaky_relu(x, 0.2).sum().backward(): x.grad = [0.2, 0.2, 0.2, 1, 1] (0.2 at x = 0).
  nn::sum(nn::LeakyReLU(0.2f)(x)).backward();
  CHECK(grad_of(x) == std::vector<float>{0.2f, 0.2f, 0.2f, 1.0f, 1.0f});
  x.zero_grad();
  nn::sum(nn::leaky_relu(x, 0.0f)).backward();
  CHECK(grad_of(x) == std::vector<float>{0.0f, 0.0f, 0.0f, 1.0f, 1.0f});
}

TEST_CASE("log_softmax and cross_entropy keep their precision for large logits") {
  // torch.log_softmax(torch.tensor([[1e4, 1e4 + 1, 1e4 - 1]]), 1) in float32: [-1.40760589, -0.407605946,
  // -2.40760589]; F.cross_entropy(same, [0]) = 1.40760589. x - (log(sum) + max) lost them to the rounding of the sum
  // (-1.4072266...).
  const std::vector<float> expected{-1.40760589f, -0.407605946f, -2.40760589f};
  nn::Variable x(Tensor<float>(shape{1, 3}, {1e4f, 1e4f + 1, 1e4f - 1}), true);
  const auto y = values_of(nn::log_softmax(x, 1));
  // The same logits down the columns of a (3, 2) value, for a softmax over a dimension that is not the last.
  nn::Variable columns(Tensor<float>(shape{3, 2}, {1e4f, 1e4f, 1e4f + 1, 1e4f + 1, 1e4f - 1, 1e4f - 1}));
  const auto z = values_of(nn::log_softmax(columns, 0));
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(y[i] == doctest::Approx(expected[i]).epsilon(1e-6));
    CHECK(z[2 * i] == doctest::Approx(expected[i]).epsilon(1e-6));
    CHECK(z[2 * i + 1] == doctest::Approx(expected[i]).epsilon(1e-6));
  }
  CHECK(nn::cross_entropy(x, Tensor<std::int64_t>(shape{1}, {0})).item() == doctest::Approx(1.40760589).epsilon(1e-6));
  CHECK(nn::cross_entropy(x, Tensor<std::int64_t>(shape{1}, {2})).item() == doctest::Approx(2.40760589).epsilon(1e-6));
  nn::clear_tape();
}

TEST_CASE("recurrent modules name a wrong initial state's shape as the caller gave it") {
  nn::LSTM lstm(3, 4);
  nn::Variable x(shape{5, 2, 3});
  nn::Variable h0(shape{1, 3, 4}), c0(shape{1, 3, 4});  // batch 3, the input's is 2
  try {
    lstm(x, {h0, c0});
    FAIL("expected an error");
  } catch (const kiln::error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("LSTM: expected h_0 and c_0 of shape (num_layers * num_directions, batch, hidden_size) = "
                 "[1, 2, 4], found [1, 3, 4]") != std::string::npos);
    CHECK(m.find("[2, 1, 3, 4]") == std::string::npos);  // the internal stacked shape
  }
  nn::GRU gru(3, 4);
  CHECK_THROWS_WITH_AS(gru(x, nn::Variable(shape{2, 2, 4})),
                       doctest::Contains("GRU: expected h_0 of shape (num_layers * num_directions, batch, hidden_size) "
                                         "= [1, 2, 4], found [2, 2, 4]"),
                       kiln::error);
}
