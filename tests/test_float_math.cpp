// The branch-free float exp, tanh and sigmoid (kernels/float_math.hpp) against double-precision libm, in units in the
// last place of the float result, over a sample of every float bit pattern; plus their edge cases: saturation,
// infinities, NaN and signed zero. Also the softmax and cross-entropy kernels, which take their exponentials from
// exp_value: against a double-precision reference, with extreme logits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/softmax.hpp"
#include "kiln/kernels/float_math.hpp"

using namespace kiln;

namespace {

// |got - want| in units of the spacing of floats at want (the smallest subnormal spacing for tiny values).
double ulp_error(float got, double want) {
  const float nearest = static_cast<float>(want);
  double spacing = std::fabs(double(std::nextafter(nearest, std::numeric_limits<float>::infinity())) - nearest);
  if (!(spacing > 0) || std::isinf(spacing)) spacing = std::numeric_limits<float>::denorm_min();
  return std::fabs(double(got) - want) / spacing;
}

// Calls check(x) for finite floats spread over every exponent and sign: every 65,521st bit pattern (a prime step, so
// the low mantissa bits vary too).
template <class Check>
void for_sampled_floats(Check check) {
  for (std::uint64_t bits = 0; bits < (std::uint64_t(1) << 32); bits += 65521) {
    const auto pattern = static_cast<std::uint32_t>(bits);
    float x;
    std::memcpy(&x, &pattern, sizeof x);
    if (std::isfinite(x)) check(x);
  }
}

}  // namespace

TEST_CASE("saturating_exp is within 1 ulp inside its range and saturates outside") {
  double worst = 0;
  for_sampled_floats([&](float x) {
    if (x > -87.3f && x < 88.3f) worst = std::max(worst, ulp_error(kernels::saturating_exp(x), std::exp(double(x))));
  });
  CHECK(worst <= 1.0);
  CHECK(kernels::saturating_exp(0.0f) == 1.0f);
  CHECK(kernels::saturating_exp(-1000.0f) == kernels::saturating_exp(-87.3f));
  CHECK(kernels::saturating_exp(-1000.0f) > 0.0f);
  CHECK(kernels::saturating_exp(std::numeric_limits<float>::infinity()) == kernels::saturating_exp(88.3f));
  CHECK(std::isfinite(kernels::saturating_exp(88.3f)));
  CHECK(std::isnan(kernels::saturating_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("saturating_tanh is within 2 ulp everywhere, odd, and keeps NaN") {
  double worst = 0;
  for_sampled_floats([&](float x) { worst = std::max(worst, ulp_error(kernels::saturating_tanh(x), std::tanh(double(x)))); });
  CHECK(worst <= 2.0);
  for (float x : {1e-30f, 1e-3f, 0.3f, 0.5499f, 0.55f, 0.56f, 1.0f, 4.0f, 9.5f, 30.0f})
    CHECK(kernels::saturating_tanh(-x) == -kernels::saturating_tanh(x));
  CHECK(kernels::saturating_tanh(10.0f) == 1.0f);
  CHECK(kernels::saturating_tanh(-std::numeric_limits<float>::infinity()) == -1.0f);
  CHECK(std::signbit(kernels::saturating_tanh(-0.0f)));
  CHECK(std::isnan(kernels::saturating_tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("the float sigmoid and tanh activations use them and stay within 3 ulp") {
  double worst_sigmoid = 0, worst_tanh = 0;
  for_sampled_floats([&](float x) {
    if (x > -80.0f)
      worst_sigmoid = std::max(worst_sigmoid, ulp_error(kernels::activate(activation::sigmoid, x, 0.0f),
                                                        1.0 / (1.0 + std::exp(-double(x)))));
    worst_tanh = std::max(worst_tanh, ulp_error(kernels::activate(activation::tanh, x, 0.0f), std::tanh(double(x))));
  });
  CHECK(worst_sigmoid <= 3.0);
  CHECK(worst_tanh <= 2.0);
  CHECK(kernels::activate(activation::sigmoid, -200.0f, 0.0f) >= 0.0f);
  CHECK(kernels::activate(activation::sigmoid, -200.0f, 0.0f) < 1e-37f);
  CHECK(kernels::activate(activation::sigmoid, 200.0f, 0.0f) == 1.0f);
  // double keeps libm's functions.
  CHECK(kernels::activate(activation::tanh, 0.3, 0.0) == std::tanh(0.3));
}

TEST_CASE("saturating_erfc is within 8 ulp where erfc is a normal float; GELU and its derivative follow it") {
  double worst = 0;
  for_sampled_floats([&](float z) {
    const double want = std::erfc(double(z));
    if (want >= double(std::numeric_limits<float>::min())) worst = std::max(worst, ulp_error(kernels::saturating_erfc(z), want));
  });
  CHECK(worst <= 8.0);
  CHECK(kernels::saturating_erfc(0.0f) == doctest::Approx(1.0).epsilon(1e-7));
  CHECK(kernels::saturating_erfc(20.0f) == 0.0f);
  CHECK(kernels::saturating_erfc(-20.0f) == 2.0f);
  CHECK(kernels::saturating_erfc(std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(kernels::saturating_erfc(std::numeric_limits<float>::quiet_NaN())));
  // GELU (x Phi(x)) and its derivative (Phi(x) + x phi(x)) against double over [-5, 5], where GELU's values are above
  // 1e-6 (further out the float argument x / sqrt 2's own rounding, magnified by erfc's steepness, dominates any
  // formula); the derivative relative to 0.1 at least (near its zero at x = -0.75 its two terms cancel in float).
  double worst_gelu = 0, worst_grad = 0;
  for (double x = -5; x <= 5; x += 1.0 / 4096) {
    const float xf = float(x);
    const double xd = double(xf), cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * std::acos(-1.0));
    const double gelu = xd * cdf, grad = cdf + xd * pdf;
    const double scale = std::max(std::fabs(gelu), 1e-30);
    worst_gelu = std::max(worst_gelu, std::fabs(kernels::activate(activation::gelu, xf, 0.0f) - gelu) / scale);
    worst_grad = std::max(worst_grad, std::fabs(kernels::activate_backward(activation::gelu, xf, 0.0f, 1.0f, 0.0f) -
                                                grad) / std::max(std::fabs(grad), 0.1));
  }
  CHECK(worst_gelu < 2e-6);
  CHECK(worst_grad < 2e-6);
  // double keeps libm's erfc.
  CHECK(kernels::activate(activation::gelu, 0.3, 0.0) == 0.5 * 0.3 * std::erfc(-0.3 / std::sqrt(2.0)));
}

TEST_CASE("cross-entropy and softmax on exp_value match a double reference, with and without the gradient") {
  using kernels::cpu::loss_kernels;
  using kernels::cpu::softmax_kernels;
  const index_t rows = 5, classes = 13;  // 13: a vectorised body and a scalar tail per row
  std::vector<float> logits(rows * classes);
  for (index_t i = 0; i < rows * classes; ++i) logits[i] = float((i * 37) % 23) * 0.41f - 4.0f;
  logits[2 * classes + 3] = 300.0f;   // one class dominates: the others' e^(x - max) fall below e^-87.3
  logits[3 * classes + 0] = -1e30f;   // far below the rest
  const std::int64_t labels[rows] = {0, 12, 3, 0, 7};
  std::vector<float> grad(rows * classes), probabilities(rows * classes);
  const float upstream = 0.5f;
  const float loss = loss_kernels::softmax_cross_entropy(logits.data(), labels, rows, classes, reduction::mean,
                                                         grad.data(), upstream);
  // The loss is the same value whether or not the gradient is asked for (evaluation and training agree).
  CHECK(loss == loss_kernels::softmax_cross_entropy(logits.data(), labels, rows, classes, reduction::mean,
                                                    static_cast<float*>(nullptr)));
  softmax_kernels::softmax_forward(logits.data(), probabilities.data(), rows, classes, 1, false);
  double expected_loss = 0;
  for (index_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * classes;
    const double max_value = *std::max_element(x, x + classes);
    double sum = 0;
    for (index_t c = 0; c < classes; ++c) sum += std::exp(double(x[c]) - max_value);
    expected_loss += std::log(sum) + max_value - x[labels[r]];
    double row_grad_sum = 0;
    for (index_t c = 0; c < classes; ++c) {
      const double p = std::exp(double(x[c]) - max_value) / sum;
      const double g = (p - (c == labels[r] ? 1.0 : 0.0)) * upstream / rows;
      // Within a few float roundings: of x - max, of the exponential (0.93 ulp) and of the scaling.
      CHECK(std::abs(grad[r * classes + c] - g) <= 1e-7 + 1e-6 * std::abs(g));
      CHECK(std::abs(probabilities[r * classes + c] - p) <= 1e-37 + 1e-6 * p);
      row_grad_sum += grad[r * classes + c];
    }
    CHECK(std::abs(row_grad_sum) < 1e-7);
  }
  expected_loss /= rows;
  CHECK(std::abs(loss - expected_loss) <= 2e-7 * std::abs(expected_loss));
  // softmax in place (y aliasing x) gives the same values.
  std::vector<float> in_place = logits;
  softmax_kernels::softmax_forward(in_place.data(), in_place.data(), rows, classes, 1, false);
  CHECK(in_place == probabilities);
}
