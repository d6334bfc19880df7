// What a recurrent stack hands to a policy that runs whole sequences in one library call (policy::cudnn: cuDNN's
// RNN) instead of kiln's step loop (layers/recurrent.hpp). The layer describes the stack with this; the policy says
// whether it can run it, and the layer falls back to its own steps when it cannot.
#pragma once

#include "kiln/core/config.hpp"

namespace kiln::kernels {

// A stacked (optionally bidirectional) LSTM or GRU with PyTorch's formulas and flat parameter layout, run over a
// time-major (seq, batch, features) sequence whose samples all have the full length.
struct rnn_sequence {
  enum class cell { lstm, gru };
  cell kind = cell::lstm;
  index_t input_size = 0, hidden_size = 0, num_layers = 1;
  bool bias = true, bidirectional = false;
  index_t seq = 0, batch = 0;
  // Dropout masks drawn between the layers in this pass (training with dropout > 0 and more than one layer): they come
  // from kiln's counter-based generator, so that every policy draws the same masks, which a library's RNN cannot do.
  bool draws_dropout = false;

  constexpr index_t directions() const { return bidirectional ? 2 : 1; }
  constexpr index_t gates() const { return kind == cell::lstm ? 4 : 3; }
  constexpr index_t output_size() const { return directions() * hidden_size; }
  constexpr index_t layer_input(index_t layer) const { return layer == 0 ? input_size : output_size(); }
  // The flat parameter count: per layer and direction W_ih, W_hh and, with bias, b_ih and b_hh.
  constexpr index_t parameter_count() const {
    index_t count = 0;
    for (index_t l = 0; l < num_layers; ++l)
      count += directions() * gates() * hidden_size * (layer_input(l) + hidden_size + (bias ? 2 : 0));
    return count;
  }
};

}  // namespace kiln::kernels
