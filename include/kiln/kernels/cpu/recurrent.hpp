// Recurrent-cell CPU kernels: the element-wise half of one LSTM or GRU time step, forward and backward, plus the
// (batch, seq) <-> (seq, batch) transposes and the dropout mask between stacked layers. The matrix products of a step
// (the input projection of all steps at once, and the recurrent product h W_hh^T) are GEMMs that layers/recurrent.hpp
// issues around these kernels. Gate orders are PyTorch's: LSTM (i, f, g, o), GRU (r, z, n).
#pragma once

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::kernels::cpu {

// The cell kernels are never inlined: GCC contracts a*b + c into FMAs differently in each place a body is inlined
// into (-ffp-contract=fast is its GNU default), so a static layer and a dynamic module calling the same kernel could
// round differently. One out-of-line body per type keeps the two modes bit-identical; a call per time step costs
// nothing beside the step's GEMM.
struct recurrent_kernels {
  // LSTM step, element-wise half. gates (batch x 4H, row stride 4H) holds the pre-activations
  // x W_ih^T + b_ih + h W_hh^T + b_hh on entry and the activations (i, f, g, o) on exit (kept for the backward).
  // c_prev (row stride ld_c_prev; null: zeros) -> c (batch x H, contiguous); h (row stride ld_h) = o * tanh(c).
  template <class T>
  KILN_NOINLINE KILN_WIDE_VECTOR_LOOPS static void lstm_cell_forward(index_t batch, index_t hidden, T* gates,
                                                                     const T* c_prev, index_t ld_c_prev, T* c, T* h,
                                                                     index_t ld_h) {
    const index_t H = hidden;
    for (index_t b = 0; b < batch; ++b) {
      T* g = gates + b * 4 * H;
      lstm_row_forward(H, g, g + H, g + 2 * H, g + 3 * H, c_prev ? c_prev + b * ld_c_prev : nullptr, c + b * H,
                       h + b * ld_h);
    }
  }

  // One batch row of lstm_cell_forward, over pointers that do not alias, so that the compiler vectorises the loop
  // (sigmoid_value and tanh_value are branch-free for float) without run-time overlap checks.
  template <class T>
  KILN_ALWAYS_INLINE static void lstm_row_forward(index_t H, T* KILN_RESTRICT gi, T* KILN_RESTRICT gf,
                                                  T* KILN_RESTRICT gc, T* KILN_RESTRICT go,
                                                  const T* KILN_RESTRICT cp, T* KILN_RESTRICT cr,
                                                  T* KILN_RESTRICT hr) {
    for (index_t j = 0; j < H; ++j) {
      const T i = sigmoid_value(gi[j]), f = sigmoid_value(gf[j]), gg = tanh_value(gc[j]), o = sigmoid_value(go[j]);
      gi[j] = i;
      gf[j] = f;
      gc[j] = gg;
      go[j] = o;
      const T cpv = cp ? cp[j] : T(0);
      const T cv = i * gg + f * cpv;
      cr[j] = cv;
      hr[j] = o * tanh_value(cv);
    }
  }

  // LSTM step backward. gates holds the activations from the forward and receives dL/d(pre-activations) (the
  // gradient of both projections and both biases). dy (row stride ld_dy; null: zeros) is the gradient reaching h
  // from the layer's output, dh (batch x H) the gradient reaching h from the next time step; dc (batch x H) holds
  // dL/dc from the next step on entry and dL/dc_prev on exit.
  template <class T>
  KILN_NOINLINE KILN_WIDE_VECTOR_LOOPS static void lstm_cell_backward(index_t batch, index_t hidden, T* gates,
                                                                      const T* c_prev, index_t ld_c_prev, const T* c,
                                                                      const T* dy, index_t ld_dy, const T* dh, T* dc) {
    const index_t H = hidden;
    with_flags(c_prev != nullptr, dy != nullptr, [&](auto has_prev, auto has_dy) KILN_WIDE_VECTOR_LOOPS {
      for (index_t b = 0; b < batch; ++b) {
        T* g = gates + b * 4 * H;
        lstm_row_backward<has_prev, has_dy>(H, g, g + H, g + 2 * H, g + 3 * H,
                                            has_prev ? c_prev + b * ld_c_prev : nullptr, c + b * H,
                                            has_dy ? dy + b * ld_dy : nullptr, dh + b * H, dc + b * H);
      }
    });
  }

  template <bool HasPrev, bool HasDy, class T>
  KILN_ALWAYS_INLINE static void lstm_row_backward(index_t H, T* KILN_RESTRICT gi, T* KILN_RESTRICT gf,
                                                   T* KILN_RESTRICT gc, T* KILN_RESTRICT go,
                                                   const T* KILN_RESTRICT cp, const T* KILN_RESTRICT cr,
                                                   const T* KILN_RESTRICT dyr, const T* KILN_RESTRICT dhr,
                                                   T* KILN_RESTRICT dcr) {
    for (index_t j = 0; j < H; ++j) {
      const T i = gi[j], f = gf[j], gg = gc[j], o = go[j];
      const T tc = tanh_value(cr[j]);
      T dhv = dhr[j];
      if constexpr (HasDy) dhv += dyr[j];
      const T dcv = dcr[j] + dhv * o * (T(1) - tc * tc);
      T cpv = T(0);
      if constexpr (HasPrev) cpv = cp[j];
      gi[j] = dcv * gg * i * (T(1) - i);
      gf[j] = dcv * cpv * f * (T(1) - f);
      gc[j] = dcv * i * (T(1) - gg * gg);
      go[j] = dhv * tc * o * (T(1) - o);
      dcr[j] = dcv * f;
    }
  }

  // GRU step, element-wise half (PyTorch's formulation):
  //   r = sigmoid(xr + hr), z = sigmoid(xz + hz), n = tanh(xn + r * hn), h' = (1 - z) * n + z * h
  // where gx (batch x 3H, stride 3H) = x W_ih^T + b_ih and gh (batch x 3H) = h W_hh^T + b_hh. gx receives (r, z, n)
  // and hn_saved (batch x H) the recurrent part of n, W_hn h + b_hn, for the backward. h_prev (stride ld_h_prev;
  // null: zeros) -> h (stride ld_h).
  template <class T>
  KILN_NOINLINE KILN_WIDE_VECTOR_LOOPS static void gru_cell_forward(index_t batch, index_t hidden, T* gx, const T* gh,
                                                                    const T* h_prev, index_t ld_h_prev, T* hn_saved,
                                                                    T* h, index_t ld_h) {
    const index_t H = hidden;
    with_flags(h_prev != nullptr, false, [&](auto has_prev, auto) KILN_WIDE_VECTOR_LOOPS {
      for (index_t b = 0; b < batch; ++b) {
        T* x = gx + b * 3 * H;
        const T* hh = gh + b * 3 * H;
        gru_row_forward<has_prev>(H, x, x + H, x + 2 * H, hh, hh + H, hh + 2 * H,
                                  has_prev ? h_prev + b * ld_h_prev : nullptr, hn_saved + b * H, h + b * ld_h);
      }
    });
  }

  template <bool HasPrev, class T>
  KILN_ALWAYS_INLINE static void gru_row_forward(index_t H, T* KILN_RESTRICT xr, T* KILN_RESTRICT xz,
                                                 T* KILN_RESTRICT xn, const T* KILN_RESTRICT hr_in,
                                                 const T* KILN_RESTRICT hz_in, const T* KILN_RESTRICT hn_in,
                                                 const T* KILN_RESTRICT hp, T* KILN_RESTRICT hs, T* KILN_RESTRICT hr) {
    for (index_t j = 0; j < H; ++j) {
      const T r = sigmoid_value(xr[j] + hr_in[j]);
      const T z = sigmoid_value(xz[j] + hz_in[j]);
      const T n = tanh_value(xn[j] + r * hn_in[j]);
      xr[j] = r;
      xz[j] = z;
      xn[j] = n;
      hs[j] = hn_in[j];
      T hpv = T(0);
      if constexpr (HasPrev) hpv = hp[j];
      hr[j] = (T(1) - z) * n + z * hpv;
    }
  }

  // GRU step backward. gx holds (r, z, n) and receives dL/d(x W_ih^T + b_ih); dgh (batch x 3H) receives
  // dL/d(h W_hh^T + b_hh). dy (stride ld_dy; null: zeros) and dh (batch x H, from the next step) are the gradients
  // reaching h; dh receives the direct part of dL/dh_prev (z * dL/dh), to which the caller adds dgh W_hh.
  template <class T>
  KILN_NOINLINE KILN_WIDE_VECTOR_LOOPS static void gru_cell_backward(index_t batch, index_t hidden, T* gx,
                                                                     const T* hn_saved, const T* h_prev,
                                                                     index_t ld_h_prev, const T* dy, index_t ld_dy,
                                                                     T* dh, T* dgh) {
    const index_t H = hidden;
    with_flags(h_prev != nullptr, dy != nullptr, [&](auto has_prev, auto has_dy) KILN_WIDE_VECTOR_LOOPS {
      for (index_t b = 0; b < batch; ++b) {
        T* x = gx + b * 3 * H;
        T* d = dgh + b * 3 * H;
        gru_row_backward<has_prev, has_dy>(H, x, x + H, x + 2 * H, d, d + H, d + 2 * H, hn_saved + b * H,
                                           has_prev ? h_prev + b * ld_h_prev : nullptr,
                                           has_dy ? dy + b * ld_dy : nullptr, dh + b * H);
      }
    });
  }

  template <bool HasPrev, bool HasDy, class T>
  KILN_ALWAYS_INLINE static void gru_row_backward(index_t H, T* KILN_RESTRICT xr, T* KILN_RESTRICT xz,
                                                  T* KILN_RESTRICT xn, T* KILN_RESTRICT dr_out,
                                                  T* KILN_RESTRICT dz_out, T* KILN_RESTRICT dn_out,
                                                  const T* KILN_RESTRICT hs, const T* KILN_RESTRICT hp,
                                                  const T* KILN_RESTRICT dyr, T* KILN_RESTRICT dhr) {
    for (index_t j = 0; j < H; ++j) {
      const T r = xr[j], z = xz[j], n = xn[j];
      T hpv = T(0);
      if constexpr (HasPrev) hpv = hp[j];
      T dhv = dhr[j];
      if constexpr (HasDy) dhv += dyr[j];
      const T dn = dhv * (T(1) - z) * (T(1) - n * n);
      const T dz = dhv * (hpv - n) * z * (T(1) - z);
      const T dr = dn * hs[j] * r * (T(1) - r);
      xr[j] = dr;
      xz[j] = dz;
      xn[j] = dn;
      dr_out[j] = dr;
      dz_out[j] = dz;
      dn_out[j] = dn * r;
      dhr[j] = dhv * z;
    }
  }

  // Calls body(has_a, has_b) with std::bool_constant arguments, so that a row loop whose optional operands (a
  // previous state, an output gradient) are null is compiled without the test, and without a conditional load that
  // would stop vectorisation.
  template <class Body>
  static void with_flags(bool a, bool b, Body body) {
    if (a) {
      if (b) body(std::true_type{}, std::true_type{});
      else body(std::true_type{}, std::false_type{});
    } else {
      if (b) body(std::false_type{}, std::true_type{});
      else body(std::false_type{}, std::false_type{});
    }
  }

  // Reorders a (a, b, width) array as (b, a, width): batch-first <-> time-major.
  template <class T>
  KILN_KERNEL static void swap_leading(const T* in, T* out, index_t a, index_t b, index_t width) {
    for (index_t i = 0; i < a; ++i)
      for (index_t j = 0; j < b; ++j)
        std::memcpy(out + (j * a + i) * width, in + (i * b + j) * width, static_cast<std::size_t>(width) * sizeof(T));
  }

  // Inverted dropout between stacked layers: mask[i] = 0 with probability p, else 1 / (1 - p), drawn from rng in
  // order; y = x * mask. (Kept here, not shared with a Dropout layer, until a dropout kernel lands in the policy.)
  template <class T>
  KILN_KERNEL static void recurrent_dropout_forward(const T* x, T* y, T* mask, index_t n, T p, random_generator& rng) {
    T keep = p < T(1) ? T(1) / (T(1) - p) : T(0);
    for (index_t i = 0; i < n; ++i) {
      mask[i] = rng.uniform<T>() < p ? T(0) : keep;
      y[i] = x[i] * mask[i];
    }
  }
};

}  // namespace kiln::kernels::cpu
