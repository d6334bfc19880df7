// GRU (PyTorch's nn.GRU): the cell's step, forward and backward, and the static-mode type kiln::GRU. The stacking,
// directions, time loop and parameter layout are shared with the LSTM in layers/recurrent.hpp; dynamic mode's nn::GRU
// calls the same rnn_forward / rnn_backward with gru_cell.
//   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)   z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn))   h' = (1 - z) * n + z * h
#pragma once

#include "kiln/layers/recurrent.hpp"

namespace kiln {

struct gru_cell {
  static constexpr const char* name = "GRU";
  static constexpr index_t gates = 3;  // r, z, n stacked in weight_ih / weight_hh, PyTorch's order
  static constexpr bool has_cell_state = false;

  // One step: gh (scratch, batch x 3H) = h_prev W_hh^T + b_hh (one GEMM for the three gates), then the cell kernel
  // combines it with gx (x W_ih^T + b_ih): gx -> (r, z, n), hn (batch x H) keeps W_hn h + b_hn, h_out (stride ld_out).
  template <class Policy, class T>
  static void step_forward(index_t batch, index_t H, const step_weight<T>& w_hh, const T* b_hh, T* gx, T* hn,
                           const T* h_prev, index_t ld_h_prev, const T*, T* h_out, index_t ld_out, T* gh) {
    if (h_prev) {
      step_gemm<Policy>(batch, 3 * H, H, h_prev, ld_h_prev, w_hh, H, T(0), gh, 3 * H, b_hh);
    } else {
      Policy::fill(gh, T(0), batch * 3 * H);
      if (b_hh) Policy::add_row_bias(gh, b_hh, batch, 3 * H);
    }
    Policy::gru_cell_forward(batch, H, gx, gh, h_prev, ld_h_prev, hn, h_out, ld_out);
  }
  // One step back: gx -> dL/d(x W_ih^T + b_ih), dgh -> dL/d(h W_hh^T + b_hh); dh receives dL/dh_prev =
  // z * dL/dh + dgh W_hh.
  template <class Policy, class T>
  static void step_backward(index_t batch, index_t H, const step_weight<T>& w_hh, T* gx, const T* hn, const T*,
                            const T* h_prev, index_t ld_h_prev, const T* dy, index_t ld_dy, T* dh, T*, T* dgh) {
    Policy::gru_cell_backward(batch, H, gx, hn, h_prev, ld_h_prev, dy, ld_dy, dh, dgh);
    step_gemm<Policy>(batch, H, 3 * H, dgh, 3 * H, w_hh, H, T(1), dh, H);
  }
};

// Static-mode GRU over (Seq, Features) samples, batch first, zero initial state; hands (Seq, D*Hidden) to the next
// layer, or one step with kiln::LastStep<...> / kiln::FinalState<...> (layers/recurrent.hpp). Options: bias, dropout.
template <index_t Hidden, index_t Layers = 1, bool Bidirectional = false, rnn_options Options = rnn_options{}>
using GRU = recurrent_layer<gru_cell, Hidden, Layers, Bidirectional, Options, rnn_output::sequence>;

}  // namespace kiln
