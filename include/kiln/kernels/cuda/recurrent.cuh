// Recurrent-cell CUDA kernels with the CPU's formulas (kernels/cpu/recurrent.hpp): the element-wise half of one LSTM
// or GRU time step, forward and backward (one thread per (sample, hidden unit)), the (a, b, width) <-> (b, a, width)
// transpose, and the dropout mask between stacked layers drawn from the same counter-based stream as the CPU's, so
// both masks are identical. The GEMMs around these kernels are the policy's (layers/recurrent.hpp issues them).
#pragma once

#include <cstdint>

#include "kiln/core/random.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cuda/cnn_common.cuh"

namespace kiln::kernels::cuda {

namespace detail {

template <class T>
__global__ void lstm_cell_forward_kernel(index_t batch, index_t H, T* gates, const T* c_prev, index_t ld_c_prev,
                                         T* c, T* h, index_t ld_h) {
  for (index_t at = global_thread(); at < batch * H; at += global_threads()) {
    const index_t b = at / H, j = at % H;
    T* g = gates + b * 4 * H;
    const T i = sigmoid_value(g[j]), f = sigmoid_value(g[H + j]), gg = tanh(g[2 * H + j]), o = sigmoid_value(g[3 * H + j]);
    g[j] = i;
    g[H + j] = f;
    g[2 * H + j] = gg;
    g[3 * H + j] = o;
    const T cv = i * gg + (c_prev ? f * c_prev[b * ld_c_prev + j] : T(0));
    c[b * H + j] = cv;
    h[b * ld_h + j] = o * tanh(cv);
  }
}

template <class T>
__global__ void lstm_cell_backward_kernel(index_t batch, index_t H, T* gates, const T* c_prev, index_t ld_c_prev,
                                          const T* c, const T* dy, index_t ld_dy, const T* dh, T* dc) {
  for (index_t at = global_thread(); at < batch * H; at += global_threads()) {
    const index_t b = at / H, j = at % H;
    T* g = gates + b * 4 * H;
    const T i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
    const T tc = tanh(c[b * H + j]);
    const T dhv = dh[b * H + j] + (dy ? dy[b * ld_dy + j] : T(0));
    const T dcv = dc[b * H + j] + dhv * o * (T(1) - tc * tc);
    const T cpv = c_prev ? c_prev[b * ld_c_prev + j] : T(0);
    g[j] = dcv * gg * i * (T(1) - i);
    g[H + j] = dcv * cpv * f * (T(1) - f);
    g[2 * H + j] = dcv * i * (T(1) - gg * gg);
    g[3 * H + j] = dhv * tc * o * (T(1) - o);
    dc[b * H + j] = dcv * f;
  }
}

template <class T>
__global__ void gru_cell_forward_kernel(index_t batch, index_t H, T* gx, const T* gh, const T* h_prev,
                                        index_t ld_h_prev, T* hn_saved, T* h, index_t ld_h) {
  for (index_t at = global_thread(); at < batch * H; at += global_threads()) {
    const index_t b = at / H, j = at % H;
    T* x = gx + b * 3 * H;
    const T* hh = gh + b * 3 * H;
    const T r = sigmoid_value(x[j] + hh[j]);
    const T z = sigmoid_value(x[H + j] + hh[H + j]);
    const T n = tanh(x[2 * H + j] + r * hh[2 * H + j]);
    x[j] = r;
    x[H + j] = z;
    x[2 * H + j] = n;
    hn_saved[b * H + j] = hh[2 * H + j];
    const T hpv = h_prev ? h_prev[b * ld_h_prev + j] : T(0);
    h[b * ld_h + j] = (T(1) - z) * n + z * hpv;
  }
}

template <class T>
__global__ void gru_cell_backward_kernel(index_t batch, index_t H, T* gx, const T* hn_saved, const T* h_prev,
                                         index_t ld_h_prev, const T* dy, index_t ld_dy, T* dh, T* dgh) {
  for (index_t at = global_thread(); at < batch * H; at += global_threads()) {
    const index_t b = at / H, j = at % H;
    T* x = gx + b * 3 * H;
    T* d = dgh + b * 3 * H;
    const T r = x[j], z = x[H + j], n = x[2 * H + j];
    const T hpv = h_prev ? h_prev[b * ld_h_prev + j] : T(0);
    const T dhv = dh[b * H + j] + (dy ? dy[b * ld_dy + j] : T(0));
    const T dn = dhv * (T(1) - z) * (T(1) - n * n);
    const T dz = dhv * (hpv - n) * z * (T(1) - z);
    const T dr = dn * hn_saved[b * H + j] * r * (T(1) - r);
    x[j] = dr;
    x[H + j] = dz;
    x[2 * H + j] = dn;
    d[j] = dr;
    d[H + j] = dz;
    d[2 * H + j] = dn * r;
    dh[b * H + j] = dhv * z;
  }
}

// out[(j a + i) width + w] = in[(i b + j) width + w].
template <class T>
__global__ void swap_leading_kernel(const T* __restrict__ in, T* __restrict__ out, index_t a, index_t b,
                                    index_t width) {
  for (index_t at = global_thread(); at < a * b * width; at += global_threads()) {
    const index_t w = at % width, j = (at / width) % b, i = at / (width * b);
    out[(j * a + i) * width + w] = in[at];
  }
}

// Element i draws the CPU generator's next uniform number: number position + i for float (24 bits of one 32-bit
// draw), numbers position + 2i and + 2i + 1 for double (53 bits of a 64-bit draw), exactly as random_generator's
// uniform<T>() would in order. mask = 0 when u < p, else keep.
template <class T>
__global__ void recurrent_dropout_kernel(const T* __restrict__ x, T* y, T* mask, index_t n, T p, T keep,
                                         random_stream_position start) {
  for (index_t at = global_thread(); at < n; at += global_threads()) {
    T u;
    if constexpr (sizeof(T) <= 4) {
      u = static_cast<T>(random_draw(start, std::uint64_t(at)) >> 8) * T(1.0f / 16777216.0f);
    } else {
      const std::uint64_t hi = random_draw(start, 2 * std::uint64_t(at)), lo = random_draw(start, 2 * std::uint64_t(at) + 1);
      u = static_cast<T>(((hi << 32) | lo) >> 11) * T(1.0 / 9007199254740992.0);
    }
    const T m = u < p ? T(0) : keep;
    mask[at] = m;
    y[at] = x[at] * m;
  }
}

}  // namespace detail

// The recurrent kernels of the CUDA policies (device pointers; same signatures as kernels::cpu::recurrent_kernels).
struct recurrent_kernels {
  template <class T>
  static void lstm_cell_forward(index_t batch, index_t hidden, T* gates, const T* c_prev, index_t ld_c_prev, T* c,
                                T* h, index_t ld_h) {
    detail::launch_elementwise(batch * hidden, detail::lstm_cell_forward_kernel<T>, batch, hidden, gates, c_prev,
                               ld_c_prev, c, h, ld_h);
  }
  template <class T>
  static void lstm_cell_backward(index_t batch, index_t hidden, T* gates, const T* c_prev, index_t ld_c_prev,
                                 const T* c, const T* dy, index_t ld_dy, const T* dh, T* dc) {
    detail::launch_elementwise(batch * hidden, detail::lstm_cell_backward_kernel<T>, batch, hidden, gates, c_prev,
                               ld_c_prev, c, dy, ld_dy, dh, dc);
  }
  template <class T>
  static void gru_cell_forward(index_t batch, index_t hidden, T* gx, const T* gh, const T* h_prev, index_t ld_h_prev,
                               T* hn_saved, T* h, index_t ld_h) {
    detail::launch_elementwise(batch * hidden, detail::gru_cell_forward_kernel<T>, batch, hidden, gx, gh, h_prev,
                               ld_h_prev, hn_saved, h, ld_h);
  }
  template <class T>
  static void gru_cell_backward(index_t batch, index_t hidden, T* gx, const T* hn_saved, const T* h_prev,
                                index_t ld_h_prev, const T* dy, index_t ld_dy, T* dh, T* dgh) {
    detail::launch_elementwise(batch * hidden, detail::gru_cell_backward_kernel<T>, batch, hidden, gx, hn_saved,
                               h_prev, ld_h_prev, dy, ld_dy, dh, dgh);
  }
  template <class T>
  static void swap_leading(const T* in, T* out, index_t a, index_t b, index_t width) {
    detail::launch_elementwise(a * b * width, detail::swap_leading_kernel<T>, in, out, a, b, width);
  }
  // Inverted dropout between stacked layers, the CPU's mask exactly; rng advances past the numbers drawn.
  template <class T>
  static void recurrent_dropout_forward(const T* x, T* y, T* mask, index_t n, T p, random_generator& rng) {
    const T keep = p < T(1) ? T(1) / (T(1) - p) : T(0);
    const std::uint64_t draws = std::uint64_t(n) * (sizeof(T) <= 4 ? 1 : 2);
    detail::launch_elementwise(n, detail::recurrent_dropout_kernel<T>, x, y, mask, n, p, keep,
                               random_stream_position_of(rng));
    advance(rng, draws);
  }
};

}  // namespace kiln::kernels::cuda
