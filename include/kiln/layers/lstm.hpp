// LSTM (PyTorch's nn.LSTM): the cell's step, forward and backward, and the static-mode type kiln::LSTM. The stacking,
// directions, time loop and parameter layout are shared with the GRU in layers/recurrent.hpp; dynamic mode's nn::LSTM
// calls the same rnn_forward / rnn_backward with lstm_cell.
//   i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)   f = sigmoid(W_if x + b_if + W_hf h + b_hf)
//   g = tanh(W_ig x + b_ig + W_hg h + b_hg)      o = sigmoid(W_io x + b_io + W_ho h + b_ho)
//   c' = f * c + i * g                            h' = o * tanh(c')
#pragma once

#include "kiln/layers/recurrent.hpp"

namespace kiln {

struct lstm_cell {
  static constexpr const char* name = "LSTM";
  static constexpr index_t gates = 4;  // i, f, g, o stacked in weight_ih / weight_hh, PyTorch's order
  static constexpr bool has_cell_state = true;

  // One step: gates (batch x 4H, holding x W_ih^T + b_ih) += h_prev W_hh^T + b_hh (one GEMM for the four gates),
  // then the cell kernel: gates -> activations, c (batch x H) and h_out (row stride ld_out).
  template <class Policy, class T>
  static void step_forward(index_t batch, index_t H, const step_weight<T>& w_hh, const T* b_hh, T* gates, T* c,
                           const T* h_prev, index_t ld_h_prev, const T* c_prev, T* h_out, index_t ld_out, T*) {
    if (h_prev) step_gemm<Policy>(batch, 4 * H, H, h_prev, ld_h_prev, w_hh, H, T(1), gates, 4 * H, b_hh);
    else if (b_hh) Policy::add_row_bias(gates, b_hh, batch, 4 * H);
    Policy::lstm_cell_forward(batch, H, gates, c_prev, H, c, h_out, ld_out);
  }
  // One step back: gates -> dL/d(pre-activations); dc carries dL/dc to the step before; dh (batch x H) receives
  // dL/dh_prev = dgates W_hh (one GEMM).
  template <class Policy, class T>
  static void step_backward(index_t batch, index_t H, const step_weight<T>& w_hh, T* gates, const T* c,
                            const T* c_prev, const T*, index_t, const T* dy, index_t ld_dy, T* dh, T* dc, T*) {
    Policy::lstm_cell_backward(batch, H, gates, c_prev, H, c, dy, ld_dy, dh, dc);
    step_gemm<Policy>(batch, H, 4 * H, gates, 4 * H, w_hh, H, T(0), dh, H);
  }
};

// Static-mode LSTM over (Seq, Features) samples, batch first, zero initial states; hands (Seq, D*Hidden) to the next
// layer, or one step with kiln::LastStep<...> / kiln::FinalState<...> (layers/recurrent.hpp). Options: bias, dropout.
template <index_t Hidden, index_t Layers = 1, bool Bidirectional = false, rnn_options Options = rnn_options{}>
using LSTM = recurrent_layer<lstm_cell, Hidden, Layers, Bidirectional, Options, rnn_output::sequence>;

}  // namespace kiln
