// The scalar formulas of scaled dot-product attention: how a score is masked (causal, boolean, additive), the online
// softmax's exponentials (FlashAttention's running maximum and sum), and the dropout draw of one attention weight.
// KILN_HOST_DEVICE, so the CPU kernel (kernels/cpu/attention.hpp) and a GPU kernel written later apply the same
// arithmetic and draw the same dropout masks.
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::kernels {

// What attn_mask holds: nothing, a boolean mask (nonzero: the query attends to the key, as a torch bool mask's True
// in F.scaled_dot_product_attention), or float values added to the scaled scores (-inf excludes).
enum class attention_mask_kind : int { none, boolean, additive };

// Whether query i may attend to key j under is_causal. PyTorch's causal mask is aligned to the upper left
// (torch.ones(L, S).tril()): key j takes part for j <= i, whatever L and S.
KILN_HOST_DEVICE KILN_ALWAYS_INLINE bool attention_causal_keeps(index_t i, index_t j) { return j <= i; }

// The score of a query and a key: scale * (q . k), then the mask (-inf where a boolean mask is zero, or the additive
// mask's value added), in the order of PyTorch's reference implementation.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T attention_masked_score(T scaled_dot, attention_mask_kind kind, T mask) {
  if (kind == attention_mask_kind::boolean) return mask != T(0) ? scaled_dot : T(-INFINITY);
  if (kind == attention_mask_kind::additive) return scaled_dot + mask;
  return scaled_dot;
}

// e^(s - m) of the online softmax, for a score s under the running maximum m; 0 while every score so far is masked
// (m = -inf), where s - m would be NaN.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T attention_exp(T s, T m) {
  return m == T(-INFINITY) ? T(0) : tensor_exp(s - m);
}

// attention_exp over a row of n scores in place, the test on m taken once so that the loop vectorises.
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE void attention_exp_row(T* row, index_t n, T m) {
  if (m == T(-INFINITY)) {
    for (index_t c = 0; c < n; ++c) row[c] = T(0);
  } else {
    for (index_t c = 0; c < n; ++c) row[c] = tensor_exp(row[c] - m);
  }
}

// The per-row log-sum-exp the forward saves for the backward: m + log(l) for the maximum m and the sum l of
// e^(s - m); -inf for a row whose every key is masked (its output is 0, as in PyTorch).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T attention_logsumexp(T m, T l) {
  return m == T(-INFINITY) || !(l > T(0)) ? T(-INFINITY) : m + std::log(l);
}

// Dropout of attention weight (b, i, j) of a [B, L, S] problem: the weight is kept with probability 1 - p and then
// scaled by 1 / (1 - p). The draw is number (b L + i) S + j of the generator's stream from where it stood when the op
// began, with the test of nn::dropout's kernel (kernels/cpu/dropout.hpp: keep when the top 24 bits, as a fraction of
// 2^24, reach p), so the masks are nn::dropout's over the [B, L, S] weights in order, and the backward draws them
// again instead of storing them.
struct attention_dropout {
  random_stream_position start;
  double p = 0;                 // the drop probability, already rounded to the op's element type
  std::uint32_t threshold = 0;  // ceil(p 2^24): keep when (bits >> 8) >= threshold
  bool active = false;          // p > 0 in training

  static attention_dropout make(double p, const random_stream_position& start) {
    attention_dropout d;
    d.start = start;
    d.p = p;
    d.active = p > 0;
    if (!d.active) return d;
    const double scaled = std::ceil(p * 16777216.0);
    d.threshold = scaled >= 16777216.0 ? (1u << 24) : static_cast<std::uint32_t>(scaled > 0 ? scaled : 0);
    return d;
  }
};

// 1 / (1 - p) in T, as nn::dropout's kernel computes it (0 for p = 1).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T attention_keep_scale(const attention_dropout& d) {
  return d.p < 1 ? T(1) / (T(1) - T(d.p)) : T(0);
}

// The factor attention weight number `element` is multiplied by: keep_scale or 0 (dropout active only).
template <class T>
KILN_HOST_DEVICE KILN_ALWAYS_INLINE T attention_dropout_factor(const attention_dropout& d, T keep_scale,
                                                               std::uint64_t element) {
  return (random_draw(d.start, element) >> 8) >= d.threshold ? keep_scale : T(0);
}

}  // namespace kiln::kernels
