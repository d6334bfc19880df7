// Recurrent-cell CPU kernels: the element-wise half of one LSTM or GRU time step, forward and backward, plus the
// (batch, seq) <-> (seq, batch) transposes and the dropout mask between stacked layers. The matrix products of a step
// (the input projection of all steps at once, and the recurrent product h W_hh^T) are GEMMs that layers/recurrent.hpp
// issues around these kernels. Gate orders are PyTorch's: LSTM (i, f, g, o), GRU (r, z, n).
#pragma once

#include <cmath>
#include <cstring>

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
  KILN_NOINLINE static void lstm_cell_forward(index_t batch, index_t hidden, T* gates, const T* c_prev, index_t ld_c_prev, T* c,
                                T* h, index_t ld_h) {
    const index_t H = hidden;
    for (index_t b = 0; b < batch; ++b) {
      T* g = gates + b * 4 * H;
      const T* cp = c_prev ? c_prev + b * ld_c_prev : nullptr;
      T* cr = c + b * H;
      T* hr = h + b * ld_h;
      for (index_t j = 0; j < H; ++j) {
        T i = sigmoid_value(g[j]), f = sigmoid_value(g[H + j]), gg = std::tanh(g[2 * H + j]),
          o = sigmoid_value(g[3 * H + j]);
        g[j] = i;
        g[H + j] = f;
        g[2 * H + j] = gg;
        g[3 * H + j] = o;
        T cv = i * gg + (cp ? f * cp[j] : T(0));
        cr[j] = cv;
        hr[j] = o * std::tanh(cv);
      }
    }
  }

  // LSTM step backward. gates holds the activations from the forward and receives dL/d(pre-activations) (the
  // gradient of both projections and both biases). dy (row stride ld_dy; null: zeros) is the gradient reaching h
  // from the layer's output, dh (batch x H) the gradient reaching h from the next time step; dc (batch x H) holds
  // dL/dc from the next step on entry and dL/dc_prev on exit.
  template <class T>
  KILN_NOINLINE static void lstm_cell_backward(index_t batch, index_t hidden, T* gates, const T* c_prev, index_t ld_c_prev,
                                 const T* c, const T* dy, index_t ld_dy, const T* dh, T* dc) {
    const index_t H = hidden;
    for (index_t b = 0; b < batch; ++b) {
      T* g = gates + b * 4 * H;
      const T* cp = c_prev ? c_prev + b * ld_c_prev : nullptr;
      const T* cr = c + b * H;
      const T* dyr = dy ? dy + b * ld_dy : nullptr;
      const T* dhr = dh + b * H;
      T* dcr = dc + b * H;
      for (index_t j = 0; j < H; ++j) {
        T i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
        T tc = std::tanh(cr[j]);
        T dhv = dhr[j] + (dyr ? dyr[j] : T(0));
        T dcv = dcr[j] + dhv * o * (T(1) - tc * tc);
        T cpv = cp ? cp[j] : T(0);
        g[j] = dcv * gg * i * (T(1) - i);
        g[H + j] = dcv * cpv * f * (T(1) - f);
        g[2 * H + j] = dcv * i * (T(1) - gg * gg);
        g[3 * H + j] = dhv * tc * o * (T(1) - o);
        dcr[j] = dcv * f;
      }
    }
  }

  // GRU step, element-wise half (PyTorch's formulation):
  //   r = sigmoid(xr + hr), z = sigmoid(xz + hz), n = tanh(xn + r * hn), h' = (1 - z) * n + z * h
  // where gx (batch x 3H, stride 3H) = x W_ih^T + b_ih and gh (batch x 3H) = h W_hh^T + b_hh. gx receives (r, z, n)
  // and hn_saved (batch x H) the recurrent part of n, W_hn h + b_hn, for the backward. h_prev (stride ld_h_prev;
  // null: zeros) -> h (stride ld_h).
  template <class T>
  KILN_NOINLINE static void gru_cell_forward(index_t batch, index_t hidden, T* gx, const T* gh, const T* h_prev, index_t ld_h_prev,
                               T* hn_saved, T* h, index_t ld_h) {
    const index_t H = hidden;
    for (index_t b = 0; b < batch; ++b) {
      T* x = gx + b * 3 * H;
      const T* hh = gh + b * 3 * H;
      const T* hp = h_prev ? h_prev + b * ld_h_prev : nullptr;
      T* hs = hn_saved + b * H;
      T* hr = h + b * ld_h;
      for (index_t j = 0; j < H; ++j) {
        T r = sigmoid_value(x[j] + hh[j]);
        T z = sigmoid_value(x[H + j] + hh[H + j]);
        T n = std::tanh(x[2 * H + j] + r * hh[2 * H + j]);
        x[j] = r;
        x[H + j] = z;
        x[2 * H + j] = n;
        hs[j] = hh[2 * H + j];
        T hpv = hp ? hp[j] : T(0);
        hr[j] = (T(1) - z) * n + z * hpv;
      }
    }
  }

  // GRU step backward. gx holds (r, z, n) and receives dL/d(x W_ih^T + b_ih); dgh (batch x 3H) receives
  // dL/d(h W_hh^T + b_hh). dy (stride ld_dy; null: zeros) and dh (batch x H, from the next step) are the gradients
  // reaching h; dh receives the direct part of dL/dh_prev (z * dL/dh), to which the caller adds dgh W_hh.
  template <class T>
  KILN_NOINLINE static void gru_cell_backward(index_t batch, index_t hidden, T* gx, const T* hn_saved, const T* h_prev,
                                index_t ld_h_prev, const T* dy, index_t ld_dy, T* dh, T* dgh) {
    const index_t H = hidden;
    for (index_t b = 0; b < batch; ++b) {
      T* x = gx + b * 3 * H;
      T* d = dgh + b * 3 * H;
      const T* hs = hn_saved + b * H;
      const T* hp = h_prev ? h_prev + b * ld_h_prev : nullptr;
      const T* dyr = dy ? dy + b * ld_dy : nullptr;
      T* dhr = dh + b * H;
      for (index_t j = 0; j < H; ++j) {
        T r = x[j], z = x[H + j], n = x[2 * H + j];
        T hpv = hp ? hp[j] : T(0);
        T dhv = dhr[j] + (dyr ? dyr[j] : T(0));
        T dn = dhv * (T(1) - z) * (T(1) - n * n);
        T dz = dhv * (hpv - n) * z * (T(1) - z);
        T dr = dn * hs[j] * r * (T(1) - r);
        x[j] = dr;
        x[H + j] = dz;
        x[2 * H + j] = dn;
        d[j] = dr;
        d[H + j] = dz;
        d[2 * H + j] = dn * r;
        dhr[j] = dhv * z;
      }
    }
  }

  // Reorders a (a, b, width) array as (b, a, width): batch-first <-> time-major.
  template <class T>
  static void swap_leading(const T* in, T* out, index_t a, index_t b, index_t width) {
    for (index_t i = 0; i < a; ++i)
      for (index_t j = 0; j < b; ++j)
        std::memcpy(out + (j * a + i) * width, in + (i * b + j) * width, static_cast<std::size_t>(width) * sizeof(T));
  }

  // Inverted dropout between stacked layers: mask[i] = 0 with probability p, else 1 / (1 - p), drawn from rng in
  // order; y = x * mask. (Kept here, not shared with a Dropout layer, until a dropout kernel lands in the policy.)
  template <class T>
  static void recurrent_dropout_forward(const T* x, T* y, T* mask, index_t n, T p, random_generator& rng) {
    T keep = p < T(1) ? T(1) / (T(1) - p) : T(0);
    for (index_t i = 0; i < n; ++i) {
      mask[i] = rng.uniform<T>() < p ? T(0) : keep;
      y[i] = x[i] * mask[i];
    }
  }
};

}  // namespace kiln::kernels::cpu
