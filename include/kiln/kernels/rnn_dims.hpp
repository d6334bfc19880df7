// A stacked recurrent layer's hyper-parameters and the size of its flat parameter array: what both the layers
// (layers/recurrent.hpp) and a policy's whole-sequence kernels (kernels/rnn_sequence.hpp) need to know of the stack,
// kept here so that the kernels do not reach up into layers/.
#pragma once

#include "kiln/core/config.hpp"

namespace kiln::kernels {

// A stacked recurrent layer's hyper-parameters (PyTorch's constructor arguments).
struct rnn_dims {
  index_t input_size = 0;
  index_t hidden_size = 0;
  index_t num_layers = 1;
  bool bias = true;
  bool bidirectional = false;
  bool batch_first = false;
  float dropout = 0.0f;  // between layers, training only

  constexpr index_t directions() const { return bidirectional ? 2 : 1; }
  constexpr index_t output_size() const { return directions() * hidden_size; }
  constexpr index_t layer_input(index_t layer) const { return layer == 0 ? input_size : output_size(); }
  constexpr bool has_dropout(index_t layer) const { return dropout > 0.0f && layer + 1 < num_layers; }
  // The parameters of one direction of `layer` for a cell of `gates` gates: W_ih, W_hh and, with bias, b_ih and b_hh.
  constexpr index_t layer_parameters(index_t gates, index_t layer) const {
    const index_t gate_rows = gates * hidden_size;
    return gate_rows * (layer_input(layer) + hidden_size + (bias ? 2 : 0));
  }
  // The whole flat array's length: every layer, both directions.
  constexpr index_t parameter_count(index_t gates) const {
    index_t count = 0;
    for (index_t l = 0; l < num_layers; ++l) count += directions() * layer_parameters(gates, l);
    return count;
  }
};

}  // namespace kiln::kernels
