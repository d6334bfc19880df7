// Branch-free float exp and tanh for the host. libm's expf and tanhf are scalar calls with special-case branches, so
// a loop applying them cannot be vectorised, and the recurrent cells' gate loops apply them to every element. These are
// straight-line arithmetic and bit operations that GCC and Clang vectorise inside the callers' loops. Measured over
// every 7th float: exp within 0.93 ulp of the exact value, tanh within 1.55 ulp, and the sigmoid 1 / (1 + exp(-x))
// within 2.5 ulp (tests/test_float_math.cpp checks sampled bounds). The CUDA kernels keep the device's own functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "kiln/core/config.hpp"

namespace kiln::kernels {

// condition ? a : b by bit masks. A float ?: whose arms do arithmetic is not if-converted by GCC under its default
// -ftrapping-math (it will not evaluate the unselected arm's division speculatively), which stops vectorisation;
// masks vectorise under any flags.
KILN_ALWAYS_INLINE float select_float(bool condition, float a, float b) {
  const std::int32_t mask = -static_cast<std::int32_t>(condition);
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(a) & mask) | (std::bit_cast<std::int32_t>(b) & ~mask));
}

// e^x for a float x, saturating: arguments below -87.3 give e^-87.3 (1.2e-38, the smallest normal float's order) and
// above 88.3 give e^88.3 (2.2e38), so the result is finite and 2^n below stays a normal float. NaN gives NaN.
KILN_ALWAYS_INLINE float saturating_exp(float x) {
  // NaN fails both comparisons and passes through.
  x = select_float(x < -87.3f, -87.3f, x);
  x = select_float(x > 88.3f, 88.3f, x);
  // x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2. Adding 1.5 * 2^23 rounds to an integer in the low
  // mantissa bits, which are also n's two's-complement bits.
  constexpr float round_shift = 0x1.8p23f;
  const float shifted = x * 0x1.715476p+0f + round_shift;
  const float n = shifted - round_shift;
  // ln2 in two parts (Cody and Waite): n * ln2_high is exact for |n| <= 128, so r keeps full precision.
  float r = x - n * 0x1.62e4p-1f;
  r = r - n * 0x1.7f7d1cp-20f;
  // e^r by its Taylor series to r^7: the first term left out, r^8 / 8!, is below 5.3e-9 relative for |r| <= ln2 / 2.
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n built from its exponent bits; n lies in [-126, 127] after the clamp.
  const std::int32_t n_bits = std::bit_cast<std::int32_t>(shifted) - std::bit_cast<std::int32_t>(round_shift);
  return p * std::bit_cast<float>((n_bits + 127) << 23);
}

// erfc(z) for a float z, branch-free. For a = |z| and t = 1 / (1 + a / 2), erfc(a) = t e^(-a^2) e^(P(t)) (the form of
// Numerical Recipes' erfcc), P kiln's own degree-10 least-squares fit of ln(erfc(a) e^(a^2) / t) over a in [0, 9.3]
// (error below 6e-9), as a polynomial in u = 2.4301076 t - 1.4301075 (t's range mapped onto [-1, 1], where float
// evaluation keeps its accuracy); e^(-a^2) from a^2 split into its float value hi and the rest lo (exact, by fma) as
// e^-hi (1 - lo); erfc(z) = 2 - erfc(-z) below 0. Within about 4e-7 relative (a few ulp) wherever erfc is a normal
// float, 0 from a = 9.3, where erfc leaves the normal floats. NaN gives NaN.
KILN_ALWAYS_INLINE float saturating_erfc(float z) {
  const float a = std::fabs(z);
  const float t = 1.0f / (1.0f + 0.5f * a);
  const float u = t * 2.4301076f - 1.4301075f;
  float p = -2.103154634813986e-05f;
  p = p * u + 4.688202668959119e-05f;
  p = p * u + 0.00012490487515375254f;
  p = p * u - 0.0004783698477130444f;
  p = p * u - 0.00030011638528188567f;
  p = p * u + 0.003463070388496859f;
  p = p * u - 0.0007763321393560583f;
  p = p * u - 0.028433062218954513f;
  p = p * u + 0.0142880374689405f;
  p = p * u + 0.5636132590951064f;
  p = p * u - 0.5515272403156212f;
  const float hi = a * a;
  const float lo = std::fma(a, a, -hi);
  const float e = t * saturating_exp(-hi) * (1.0f - lo) * saturating_exp(p);
  const float tail = select_float(a > 9.3f, 0.0f, e);
  return select_float(z < 0.0f, 2.0f - tail, tail);
}

// tanh(x) for a float x. Near zero, where 1 - 2 / (e^2x + 1) would cancel, its odd Taylor series to x^17 (exact
// coefficients 2^2k (2^2k - 1) B_2k / (2k)!; the first left out is below 2e-9 relative for |x| < 0.55). Both
// branches are computed and one selected, so the function has no branch to stop vectorisation.
inline float saturating_tanh(float x) {
  const float s = x * x;
  float p = 0x1.355824p-11f;
  p = p * s - 0x1.7da364p-10f;
  p = p * s + 0x1.d6d3d0p-9f;
  p = p * s - 0x1.226e36p-7f;
  p = p * s + 0x1.664f48p-6f;
  p = p * s - 0x1.ba1ba2p-5f;
  p = p * s + 0x1.111112p-3f;
  p = p * s - 0x1.555556p-2f;
  const float near_zero = x + x * s * p;
  const std::int32_t sign_bit = std::bit_cast<std::int32_t>(x) & std::int32_t(0x80000000u);
  const float magnitude = std::bit_cast<float>(std::bit_cast<std::int32_t>(x) ^ sign_bit);
  // tanh(10) rounds to 1 in float (tanh(9) does not); the clamp keeps e^2x finite. NaN fails the comparison and
  // passes through.
  const float e = saturating_exp(2.0f * select_float(magnitude > 10.0f, 10.0f, magnitude));
  const float away = 1.0f - 2.0f / (e + 1.0f);
  // Both branches have x's sign except the series at -0, which rounds to +0; taking the magnitude and x's sign
  // keeps tanh odd there too.
  const float chosen = select_float(magnitude < 0.55f, near_zero, away);
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(chosen) & 0x7fffffff) | sign_bit);
}

}  // namespace kiln::kernels
