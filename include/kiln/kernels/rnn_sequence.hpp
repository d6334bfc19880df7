// What a recurrent stack hands to a policy that runs whole sequences in one library call (policy::cudnn: cuDNN's
// RNN) instead of kiln's step loop (layers/recurrent.hpp). The layer describes the stack with this; the policy says
// whether it can run it, and the layer falls back to its own steps when it cannot.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/kernels/rnn_dims.hpp"

namespace kiln::kernels {

// A stacked (optionally bidirectional) LSTM or GRU with PyTorch's formulas and flat parameter layout, run over a
// time-major (seq, batch, features) sequence whose samples all have the full length: the layer's rnn_dims (with
// batch_first false, as the buffers handed over are time-major), the cell and the sequence's extent.
struct rnn_sequence : rnn_dims {
  enum class cell { lstm, gru };
  cell kind = cell::lstm;
  index_t seq = 0, batch = 0;
  // Dropout masks drawn between the layers in this pass (training with dropout > 0 and more than one layer): they come
  // from kiln's counter-based generator, so that every policy draws the same masks, which a library's RNN cannot do.
  bool draws_dropout = false;

  constexpr index_t gates() const { return kind == cell::lstm ? 4 : 3; }
  constexpr index_t parameter_count() const { return rnn_dims::parameter_count(gates()); }
};

}  // namespace kiln::kernels
