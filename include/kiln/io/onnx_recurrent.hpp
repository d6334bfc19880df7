// ONNX export of the recurrent layers, for both modes (kiln/io/onnx.hpp has the table of operators): LSTM and GRU with
// any number of stacked layers, either direction or both, with or without bias, batch first or time-major, handing on
// every step, the last step or the final state. onnx_recurrent checks the current value's per-sample shape, writes one
// ONNX LSTM or GRU node per stacked layer with the nodes that give kiln's shapes, and moves the builder on; static
// mode's onnx_emit overload at the end and dynamic mode's dispatch (kiln/io/onnx_dynamic.hpp) call it.
//
// ONNX's recurrent operators read and write time-major values: X (seq, N, features), Y (seq, directions, N, hidden),
// Y_h (directions, N, hidden). layout = 1 would make them batch first, but it exists only from opset 14 and
// onnxruntime's CPU kernels refuse it, so a batch-first value goes through a Transpose instead. Between stacked
// layers, Y becomes (seq, N, directions * hidden) with the forward direction's features first, as kiln and PyTorch
// concatenate them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/layers/gru.hpp"
#include "kiln/layers/lstm.hpp"
#include "kiln/layers/recurrent.hpp"

namespace kiln::io {

namespace detail {
// ONNX's gate blocks as indices of PyTorch's (kiln's) blocks in weight_ih, weight_hh and the biases. LSTM: ONNX's
// i, o, f, c from PyTorch's i, f, g, o (c is PyTorch's g). GRU: ONNX's z, r, h from PyTorch's r, z, n.
template <class Cell>
constexpr auto onnx_gate_order() {
  if constexpr (std::is_same_v<Cell, lstm_cell>) return std::array<index_t, 4>{0, 3, 1, 2};
  else return std::array<index_t, 3>{1, 0, 2};
}

// Appends the (gates * H) x cols matrix at from (a vector when cols = 1) with its H-row gate blocks in ONNX's order.
template <class Cell>
void append_in_onnx_gate_order(std::vector<float>& to, const float* from, index_t H, index_t cols) {
  for (index_t block : onnx_gate_order<Cell>())
    to.insert(to.end(), from + block * H * cols, from + (block + 1) * H * cols);
}

// A Transpose of value to a fresh name.
inline std::string onnx_transpose(onnx_builder& b, const std::string& value, const std::vector<index_t>& perm) {
  std::string y = b.fresh("transpose");
  auto n = onnx_builder::node("Transpose", {value}, y);
  onnx_builder::attr_ints(n, "perm", perm);
  b.add_node(std::move(n));
  return y;
}
inline std::string onnx_squeeze(onnx_builder& b, const std::string& value, std::int64_t axis) {
  std::string y = b.fresh("squeeze");
  b.add_node(onnx_builder::node("Squeeze", {value, b.int64_initializer("axes", {axis})}, y));  // axes an input from 13
  return y;
}
inline std::string onnx_reshape(onnx_builder& b, const std::string& value, const std::vector<std::int64_t>& target) {
  std::string y = b.fresh("reshape");
  b.add_node(onnx_builder::node("Reshape", {value, b.int64_initializer("shape", target)}, y));
  return y;
}
// value has the D directions at direction_axis and H features last (Y, Y_h); the result drops that dim and holds
// D * H features, the forward direction's first, as kiln and PyTorch concatenate them. keep: the Reshape target of
// the other dims, which the Transpose puts first (0 keeps an extent, the batch's included).
inline std::string onnx_join_directions(onnx_builder& b, const std::string& value, index_t D, index_t H,
                                        std::size_t direction_axis, std::vector<std::int64_t> keep) {
  if (D == 1) return onnx_squeeze(b, value, static_cast<std::int64_t>(direction_axis));
  // Move the directions next to the hidden features, then merge the two.
  std::vector<index_t> perm;
  for (std::size_t d = 0; d < keep.size() + 2; ++d)
    if (d != direction_axis && d != keep.size() + 1) perm.push_back(static_cast<index_t>(d));
  perm.push_back(static_cast<index_t>(direction_axis));
  perm.push_back(static_cast<index_t>(keep.size() + 1));
  keep.push_back(D * H);
  return onnx_reshape(b, onnx_transpose(b, value, perm), keep);
}
}  // namespace detail

// A stacked recurrent layer of dims d (PyTorch's arguments; dropout, used in training only, is ignored) and cell Cell
// (lstm_cell or gru_cell), whose parameters lie at params in rnn_forward's flat layout (PyTorch's order), starting
// from zero states as Sequential models do. It reads (N, seq, input_size) with d.batch_first, (seq, N, input_size)
// otherwise, and hands on what `output` says: every step ((N, seq, D * H) or (seq, N, D * H)), the last step
// (N, D * H, PyTorch's out[:, -1]) or the last layer's final state (N, D * H: forward after t = T-1, reverse after
// t = 0). The GRU node has linear_before_reset = 1: PyTorch's (and kiln's) reset gate scales W_hn h + b_hn.
template <class Cell>
void onnx_recurrent(onnx_builder& b, const rnn_dims& d, const float* params, rnn_output output) {
  static_assert(std::is_same_v<Cell, lstm_cell> || std::is_same_v<Cell, gru_cell>,
                "kiln::io::export_onnx: a recurrent layer exports with an LSTM or GRU cell only");
  const char* layer = Cell::name;
  const std::vector<index_t> s = b.sample_shape();
  const int batch_axis = d.batch_first ? 0 : 1;
  if (s.size() != 2 || b.batch_axis() != batch_axis || s[1] != d.input_size) {
    const std::string features = std::to_string(d.input_size);
    if (d.batch_first)
      fail("export_onnx: ", layer, " (batch_first) expects input of shape [N, seq, ", features,
           "], found a value of shape ", b.shape_text());
    fail("export_onnx: ", layer, " without batch_first expects input of shape [seq, N, ", features,
         "] (the batch second: options.input_shape {seq, -1, ", features, "} as the graph's input), found a value of "
         "shape ", b.shape_text());
  }
  if (s[0] < 1)
    fail("export_onnx: ", layer, " expects at least one time step, found a value of shape ", b.shape_text());
  if (d.hidden_size < 1 || d.num_layers < 1)
    fail("export_onnx: ", layer, " expects a positive hidden_size and num_layers, found ", d.hidden_size, " and ",
         d.num_layers);
  const index_t seq = s[0], H = d.hidden_size, D = d.directions(), W = d.output_size(), GH = Cell::gates * H;
  std::string x = b.current();
  if (d.batch_first) x = detail::onnx_transpose(b, x, {1, 0, 2});
  std::string y_h;  // the last layer's Y_h, when its final state is handed on
  for (index_t l = 0; l < d.num_layers; ++l) {
    const index_t I = d.layer_input(l);
    std::vector<float> w, r, bias;
    for (index_t dir = 0; dir < D; ++dir) {
      const rnn_weights<const float> p = rnn_weights_at<Cell>(params, d, l, dir);
      detail::append_in_onnx_gate_order<Cell>(w, p.w_ih, H, I);
      detail::append_in_onnx_gate_order<Cell>(r, p.w_hh, H, H);
      if (d.bias) {  // B is [Wb, Rb] per direction
        detail::append_in_onnx_gate_order<Cell>(bias, p.b_ih, H, 1);
        detail::append_in_onnx_gate_order<Cell>(bias, p.b_hh, H, 1);
      }
    }
    std::vector<std::string> inputs{x, b.initializer("weight_ih", w.data(), {D, GH, I}),
                                    b.initializer("weight_hh", r.data(), {D, GH, H})};
    if (d.bias) inputs.push_back(b.initializer("bias", bias.data(), {D, 2 * GH}));
    const bool final_state = output == rnn_output::final_state && l + 1 == d.num_layers;
    std::string y = final_state ? std::string() : b.fresh(std::is_same_v<Cell, lstm_cell> ? "lstm" : "gru");
    if (final_state) y_h = b.fresh(std::is_same_v<Cell, lstm_cell> ? "lstm_h" : "gru_h");
    auto n = onnx_builder::node(layer, inputs, final_state ? std::vector<std::string>{y, y_h}
                                                           : std::vector<std::string>{y});
    onnx_builder::attr_int(n, "hidden_size", H);
    if (D == 2) onnx_builder::attr_string(n, "direction", "bidirectional");
    if constexpr (std::is_same_v<Cell, gru_cell>) onnx_builder::attr_int(n, "linear_before_reset", 1);
    b.add_node(std::move(n));
    // Y (seq, D, N, H) -> (seq, N, D * H): the next layer's input, or what the last one hands on.
    if (!final_state) x = detail::onnx_join_directions(b, y, D, H, 1, {0, 0});
  }
  switch (output) {
    case rnn_output::sequence:
      if (d.batch_first) b.set_current(detail::onnx_transpose(b, x, {1, 0, 2}), {seq, W}, 0);
      else b.set_current(x, {seq, W}, 1);
      return;
    case rnn_output::last_step: {
      // Step -1 of the time-major output, as PyTorch's out[:, -1] (out[-1] without batch_first).
      std::string last = b.fresh("last_step");
      auto n = onnx_builder::node("Gather", {x, b.int64_initializer("index", {-1}, true)}, last);
      onnx_builder::attr_int(n, "axis", 0);
      b.add_node(std::move(n));
      b.set_current(last, {W}, 0);
      return;
    }
    case rnn_output::final_state:
      // Y_h (D, N, H) -> (N, D * H): forward after t = T-1, then reverse after t = 0.
      b.set_current(detail::onnx_join_directions(b, y_h, D, H, 0, {0}), {W}, 0);
      return;
  }
}

// --- static mode: the onnx_emit overload of LSTM, GRU and their output adaptors (onnx.hpp has the others) -----------
// params: the layer's state_dict entries in order, which is rnn_forward's flat layout (weight_ih_l0, weight_hh_l0,
// bias_ih_l0, bias_hh_l0, then _reverse, then the next layer).
template <class Cell, index_t Hidden, index_t Layers, bool Bidirectional, rnn_options Options, rnn_output Output>
void onnx_emit(onnx_builder& b, const recurrent_layer<Cell, Hidden, Layers, Bidirectional, Options, Output>&,
               const std::vector<const Tensor<float>*>& params) {
  const rnn_dims d{params.at(0)->extent(1), Hidden, Layers, Options.bias, Bidirectional, true, Options.dropout};
  std::vector<float> flat;
  for (const auto* p : params) flat.insert(flat.end(), p->data(), p->data() + p->numel());
  if (static_cast<index_t>(flat.size()) != rnn_param_count<Cell>(d))
    fail("export_onnx: ", Cell::name, " expects ", rnn_param_count<Cell>(d), " parameters, found ", flat.size());
  onnx_recurrent<Cell>(b, d, flat.data(), Output);
}

}  // namespace kiln::io
