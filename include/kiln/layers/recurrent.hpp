// Stacked, optionally bidirectional recurrent layers (LSTM, GRU) with PyTorch's semantics, written once for both
// modes. The cell-specific step math lives in layers/lstm.hpp and layers/gru.hpp (each a Cell type); this file holds
// what they share: the parameter layout, the workspace plan, forward and backpropagation through time, and the
// static-mode layer types with their output adaptors.
//
// Layout. Parameters are one flat array in PyTorch's _flat_weights order: for each layer l, for each direction
// (forward, then reverse): weight_ih_l{l}[_reverse] (G*H x in_l), weight_hh (G*H x H), bias_ih (G*H), bias_hh (G*H),
// with G gates (LSTM 4: i, f, g, o; GRU 3: r, z, n) and in_l = input_size for l = 0, directions * H above.
// Input and output are (seq, batch, features) or, with batch_first, (batch, seq, features); h_0, c_0, h_n and c_n are
// (num_layers * directions, batch, H), direction-major within a layer as in PyTorch. The output's last dimension is
// (directions * H): output[..., :H] is the forward direction, output[..., H:] the reverse direction, whose state after
// reading the whole sequence is at t = 0 (it runs from t = T-1 down to 0).
//
// Work per layer and direction: ONE GEMM projects the inputs of all time steps (x W_ih^T + b_ih); each step then does
// one GEMM of h_{t-1} against the stacked weight_hh (all gates at once) and the cell's element-wise kernel. The
// backward runs the steps in reverse (one GEMM per step for dL/dh_{t-1}) and then forms the parameter gradients and
// dL/dx with GEMMs over all steps: for an LSTM one for all its parameters (lstm_parameter_gradients), for a GRU one
// per weight and a column sum per bias.
//
// A policy with sequence kernels (policy::cudnn: cuDNN's RNN, kernels/cudnn/rnn.cuh) may instead run the whole stack
// in one call each way; the step loop runs when it declines. It reads and writes the same time-major buffers of the
// plan (the input copy, the last layer's output), so what a layer does around rnn_forward / rnn_backward is the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/init.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/kernels/rnn_dims.hpp"
#include "kiln/kernels/rnn_sequence.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

using kernels::rnn_dims;  // kernels/rnn_dims.hpp

// Parameters of one (layer, direction) inside the flat array.
template <class T>
struct rnn_weights {
  T* w_ih = nullptr;
  T* w_hh = nullptr;
  T* b_ih = nullptr;  // null without bias
  T* b_hh = nullptr;
};

template <class Cell>
constexpr index_t rnn_param_offset(const rnn_dims& d, index_t layer, index_t dir) {
  index_t offset = 0;
  for (index_t l = 0; l < layer; ++l) offset += d.directions() * d.layer_parameters(Cell::gates, l);
  return offset + dir * d.layer_parameters(Cell::gates, layer);
}
template <class Cell>
constexpr index_t rnn_param_count(const rnn_dims& d) {
  return d.parameter_count(Cell::gates);
}
template <class Cell, class T>
rnn_weights<T> rnn_weights_at(T* params, const rnn_dims& d, index_t layer, index_t dir) {
  index_t gh = Cell::gates * d.hidden_size;
  T* p = params + rnn_param_offset<Cell>(d, layer, dir);
  rnn_weights<T> w;
  w.w_ih = p;
  w.w_hh = p + gh * d.layer_input(layer);
  if (d.bias) {
    w.b_ih = w.w_hh + gh * d.hidden_size;
    w.b_hh = w.b_ih + gh;
  }
  return w;
}

// PyTorch's parameter names and shapes, in flat order, with offsets.
template <class Cell>
std::vector<static_parameter_info> rnn_parameter_infos(const rnn_dims& d) {
  std::vector<static_parameter_info> out;
  index_t gh = Cell::gates * d.hidden_size;
  for (index_t l = 0; l < d.num_layers; ++l)
    for (index_t dir = 0; dir < d.directions(); ++dir) {
      std::string suffix = "_l";
      suffix += std::to_string(l);
      if (dir == 1) suffix += "_reverse";
      index_t at = rnn_param_offset<Cell>(d, l, dir);
      auto add = [&](const char* base, kiln::shape s) {
        std::string name = base;
        name += suffix;
        out.push_back({name, s, at});
        at += s.numel();
      };
      add("weight_ih", shape{gh, d.layer_input(l)});
      add("weight_hh", shape{gh, d.hidden_size});
      if (d.bias) {
        add("bias_ih", shape{gh});
        add("bias_hh", shape{gh});
      }
    }
  return out;
}

// PyTorch's initialisation: every weight and bias U(-1/sqrt(H), 1/sqrt(H)), drawn in parameter order.
template <class T>
void rnn_init(std::span<T> params, index_t hidden_size, random_generator& rng) {
  T bound = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hidden_size)));
  init::uniform(params, -bound, bound, rng);
}

// Where the forward keeps what the backward needs ("saved") and what either uses only while it runs ("temp"), in
// elements, for a given sequence length and batch. Every size is a multiple of the batch, so a static layer can
// reserve it per sample.
template <class Cell>
struct rnn_plan {
  rnn_dims d{};
  index_t seq = 0, batch = 0;
  index_t saved_size = 0, temp_size = 0;

  constexpr rnn_plan(const rnn_dims& dims, index_t seq_len, index_t batch_size)
      : d(dims), seq(seq_len), batch(batch_size) {
    saved_size = input_copy_size();
    for (index_t l = 0; l < d.num_layers; ++l) saved_size += layer_size(l);
    temp_size = 2 * rows() * d.output_size() + input_copy_size() + 2 * batch * d.hidden_size +
                (Cell::has_cell_state ? gradient_operand_size() + gradient_product_size()
                                      : batch * gate_width() + rows() * gate_width());
  }
  constexpr index_t rows() const { return seq * batch; }
  constexpr index_t gate_width() const { return Cell::gates * d.hidden_size; }
  // LSTM backward (temp): every step's [x_t | h_{t-1} | 1] in one row, the operand of lstm_parameter_gradients, and
  // its product with the gate gradients, rounded up to whole samples.
  constexpr index_t gradient_operand_width() const {
    const index_t widest_input = d.num_layers > 1 ? std::max(d.input_size, d.output_size()) : d.input_size;
    return widest_input + d.hidden_size + (d.bias ? 1 : 0);
  }
  constexpr index_t gradient_operand_size() const { return rows() * gradient_operand_width(); }
  constexpr index_t gradient_product_size() const {
    return (gate_width() * gradient_operand_width() + batch - 1) / batch * batch;
  }
  constexpr index_t input_copy_size() const { return d.batch_first ? rows() * d.input_size : 0; }
  constexpr index_t layer_size(index_t l) const {
    index_t r = rows(), w = d.output_size();
    return r * w * (d.has_dropout(l) ? 3 : 1) + d.directions() * r * (gate_width() + d.hidden_size);
  }
  constexpr index_t layer_offset(index_t l) const {
    index_t at = input_copy_size();
    for (index_t i = 0; i < l; ++i) at += layer_size(i);
    return at;
  }
  // saved: the time-major copy of a batch-first input
  template <class T>
  T* input_copy(T* saved) const { return saved; }
  // saved: layer l's output, time-major (seq, batch, directions * H)
  template <class T>
  T* output(T* saved, index_t l) const { return saved + layer_offset(l); }
  // saved: the dropout mask after layer l, and layer l's output with dropout applied (the next layer's input)
  template <class T>
  T* mask(T* saved, index_t l) const { return saved + layer_offset(l) + rows() * d.output_size(); }
  template <class T>
  T* dropped(T* saved, index_t l) const { return saved + layer_offset(l) + 2 * rows() * d.output_size(); }
  // saved: the gates of (l, dir) (seq, batch, G*H): activations after the forward, gradients during the backward
  template <class T>
  T* gates(T* saved, index_t l, index_t dir) const {
    return saved + layer_offset(l) + rows() * d.output_size() * (d.has_dropout(l) ? 3 : 1) +
           dir * rows() * (gate_width() + d.hidden_size);
  }
  // saved: per step and (l, dir), the LSTM's cell state c_t or the GRU's W_hn h + b_hn (seq, batch, H)
  template <class T>
  T* state(T* saved, index_t l, index_t dir) const { return gates(saved, l, dir) + rows() * gate_width(); }
};

// The recurrent weight W_hh of one (layer, direction), multiplied at every time step: op(W_hh) packed once per
// sequence where the policy packs GEMM operands (policy::cpu's prepack_b), read as it lies otherwise.
template <class T>
struct step_weight {
  const T* w = nullptr;       // as stored, ld = its row length
  const T* packed = nullptr;  // op(w) packed, or null
  bool transpose = false;     // op(w) = w^T
};

template <class Policy, class T>
step_weight<T> prepare_step_weight(bool transpose, index_t k, index_t n, const T* w, index_t ldw) {
  if constexpr (requires { Policy::prepack_b(transpose, k, n, w, ldw); })
    return {w, Policy::prepack_b(transpose, k, n, w, ldw), transpose};
  else
    return {w, nullptr, transpose};
}

// C = alpha A op(W) + beta C (+ bias per column): one time step's product with the recurrent weight.
template <class Policy, class T>
void step_gemm(index_t m, index_t n, index_t k, const T* a, index_t lda, const step_weight<T>& w, index_t ldw,
               T beta, T* c, index_t ldc, const T* bias = nullptr) {
  if constexpr (requires { Policy::gemm_prepacked_b(false, m, n, k, T(1), a, lda, w.packed, beta, c, ldc); }) {
    if (w.packed) {
      Policy::gemm_prepacked_b(false, m, n, k, T(1), a, lda, w.packed, beta, c, ldc, {bias});
      return;
    }
  }
  Policy::gemm(false, w.transpose, m, n, k, T(1), a, lda, w.w, ldw, beta, c, ldc, {bias});
}

// Runs body(begin, end) over slices of the batch, in parallel where the policy splits independent rows
// (policy::cpu's for_batch_slices), as one slice otherwise. Every batch row of a recurrent layer is independent
// through the whole time loop, forward and backward, so each thread runs all the steps of its rows with no barrier.
template <class Policy, class Body>
void for_batch_slices(index_t batch, index_t work_per_row, Body&& body) {
  if constexpr (requires { Policy::for_batch_slices(batch, work_per_row, body); })
    Policy::for_batch_slices(batch, work_per_row, body);
  else
    body(index_t{0}, batch);
}

// The stack as a policy's sequence kernels see it.
template <class Cell>
kernels::rnn_sequence rnn_sequence_of(const rnn_dims& d, index_t seq, index_t batch, bool training) {
  kernels::rnn_sequence s;
  static_cast<rnn_dims&>(s) = d;
  s.batch_first = false;  // the plan's buffers, which the policy is handed, are time-major
  s.kind = Cell::has_cell_state ? kernels::rnn_sequence::cell::lstm : kernels::rnn_sequence::cell::gru;
  s.seq = seq;
  s.batch = batch;
  s.draws_dropout = training && d.has_dropout(0);
  return s;
}

namespace detail {
// The rows of time step t in a time-major (seq, batch, width) array.
template <class T>
T* step_rows(T* base, index_t t, index_t batch, index_t width) {
  return base + t * batch * width;
}
}  // namespace detail

// Forward through all layers and both directions. x: (seq, batch, input) or batch-first; h0, c0: (L*D, batch, H) or
// null (zeros; c0 is ignored by a GRU); output (the input's layout, directions * H wide), h_n, c_n: may be null.
// saved (plan.saved_size) is kept for rnn_backward; temp (plan.temp_size) is scratch. rng draws the dropout masks
// (only when training with dropout > 0 and more than one layer).
template <class Cell, class Policy, class T>
void rnn_forward(const rnn_dims& d, index_t seq, index_t batch, const T* params, const T* x, const T* h0, const T* c0,
                 T* output, T* h_n, T* c_n, T* saved, T* temp, bool training, random_generator* rng) {
  const rnn_plan<Cell> plan(d, seq, batch);
  const index_t H = d.hidden_size, D = d.directions(), W = d.output_size(), GH = plan.gate_width(),
                R = plan.rows();
  const T* in = x;
  if (d.batch_first) {
    Policy::swap_leading(x, plan.input_copy(saved), batch, seq, d.input_size);
    in = plan.input_copy(saved);
  }
  // The whole stack in one call where the policy can (the last layer's output lands where the steps would put it).
  bool ran_whole = false;
  if constexpr (requires {
                  Policy::rnn_sequence_forward(kernels::rnn_sequence{}, params, in, h0, c0, output, h_n, c_n,
                                               static_cast<const void*>(saved));
                })
    ran_whole = Policy::rnn_sequence_forward(rnn_sequence_of<Cell>(d, seq, batch, training), params, in, h0, c0,
                                             plan.output(saved, d.num_layers - 1), h_n, c_n,
                                             static_cast<const void*>(saved));
  T* gh_temp = temp;  // GRU: h W_hh^T + b_hh of one step
  for (index_t l = 0; !ran_whole && l < d.num_layers; ++l) {
    const index_t I = d.layer_input(l);
    T* Y = plan.output(saved, l);
    for (index_t dir = 0; dir < D; ++dir) {
      auto w = rnn_weights_at<Cell>(params, d, l, dir);
      T* G = plan.gates(saved, l, dir);
      T* S = plan.state(saved, l, dir);
      // The input projection of every time step at once.
      Policy::gemm(false, true, R, GH, I, T(1), in, I, w.w_ih, I, T(0), G, GH, {w.b_ih});
      // Each step multiplies by W_hh^T: packed once here, then every batch slice runs all its steps against it.
      const step_weight<T> w_hh = prepare_step_weight<Policy>(true, H, GH, static_cast<const T*>(w.w_hh), H);
      for_batch_slices<Policy>(batch, GH * H, [&](index_t b0, index_t b1) {
        const T* h_prev = h0 ? h0 + ((l * D + dir) * batch + b0) * H : nullptr;
        index_t ld_h_prev = H;
        const T* c_prev = c0 ? c0 + ((l * D + dir) * batch + b0) * H : nullptr;
        for (index_t s = 0; s < seq; ++s) {
          const index_t t = dir ? seq - 1 - s : s;
          T* h_out = detail::step_rows(Y, t, batch, W) + b0 * W + dir * H;
          T* state = detail::step_rows(S, t, batch, H) + b0 * H;
          Cell::template step_forward<Policy>(b1 - b0, H, w_hh, w.b_hh, detail::step_rows(G, t, batch, GH) + b0 * GH,
                                              state, h_prev, ld_h_prev, c_prev, h_out, W, gh_temp + b0 * GH);
          h_prev = h_out;
          ld_h_prev = W;
          if constexpr (Cell::has_cell_state) c_prev = state;
        }
      });
      const index_t last = dir ? 0 : seq - 1;
      if (h_n)
        for (index_t b = 0; b < batch; ++b)
          Policy::copy(detail::step_rows(Y, last, batch, W) + b * W + dir * H, h_n + ((l * D + dir) * batch + b) * H,
                       H);
      if constexpr (Cell::has_cell_state)
        if (c_n) Policy::copy(detail::step_rows(S, last, batch, H), c_n + (l * D + dir) * batch * H, batch * H);
    }
    in = Y;
    if (d.has_dropout(l) && training) {
      if (!rng) fail(Cell::name, ": dropout needs a random generator");
      Policy::recurrent_dropout_forward(Y, plan.dropped(saved, l), plan.mask(saved, l), R * W, T(d.dropout), *rng);
      in = plan.dropped(saved, l);
    }
  }
  if (output) {
    const T* Y = plan.output(saved, d.num_layers - 1);
    if (d.batch_first) Policy::swap_leading(Y, output, seq, batch, W);
    else Policy::copy(Y, output, R * W);
  }
}

// ADDS an LSTM direction's parameter gradients (W_ih, W_hh and both biases) into dw from its gate gradients G
// (seq, batch, 4H) in ONE product over all the steps at once: G^T [x_t | h_{t-1} | 1], one stacked row per step and
// batch element. Taken apart as G^T x, G^T h_{t-1} and two column sums, they read all of G four times (G outgrows L2
// for a long sequence). in: the layer's input (seq, batch, I); Y: its output (seq, batch, W), whose half for
// direction dir one step earlier is h_{t-1}; h_first: this direction's h_0 (null: zeros). scratch holds
// plan.gradient_operand_size() + plan.gradient_product_size() elements.
// (A GRU's recurrent product has a gradient of its own, so it would take two products, and the column of ones would
// add a whole register panel to the one with H columns, which costs more than the reads of G it saves.)
template <class Policy, class Cell, class T>
void lstm_parameter_gradients(const rnn_plan<Cell>& plan, index_t I, index_t dir, const T* G, const T* in,
                              const T* Y, const T* h_first, const rnn_weights<T>& dw, T* scratch) {
  const index_t H = plan.d.hidden_size, W = plan.d.output_size(), GH = plan.gate_width(), R = plan.rows(),
                batch = plan.batch;
  const index_t width = I + H + (plan.d.bias ? 1 : 0);  // this layer's stacked row
  T* operand = scratch;
  T* product = scratch + plan.gradient_operand_size();
  Policy::copy_rows(R, I, in, I, operand, width);
  // h_{t-1} of every step but the direction's first is the output one step earlier: Y's rows shifted by one step
  // (down for the forward direction, up for the reverse one).
  const index_t first_step_row = dir ? R - batch : 0;
  if (R > batch)
    Policy::copy_rows(R - batch, H, Y + (dir ? batch * W : 0) + dir * H, W, operand + (dir ? 0 : batch * width) + I,
                      width);
  if (h_first) Policy::copy_rows(batch, H, h_first, H, operand + first_step_row * width + I, width);
  else Policy::fill_rows(batch, H, T(0), operand + first_step_row * width + I, width);
  if (plan.d.bias) Policy::fill_rows(R, 1, T(1), operand + I + H, width);
  Policy::gemm(true, false, GH, width, R, T(1), G, GH, operand, width, T(0), product, width);
  Policy::accumulate_rows(GH, I, product, width, dw.w_ih, I);
  Policy::accumulate_rows(GH, H, product + I, width, dw.w_hh, H);
  if (plan.d.bias) {  // both biases get the gates' gradient summed over every row
    Policy::accumulate_rows(GH, 1, product + I + H, width, dw.b_ih, 1);
    Policy::accumulate_rows(GH, 1, product + I + H, width, dw.b_hh, 1);
  }
}

// Copies what a forward saved for its backward (plan.saved_size elements at `from`) to `to`, so that a backward can
// run from the copy while the original stays for another (dynamic mode's retain_graph): with a policy's sequence
// kernels, the library's own saved state goes with it.
template <class Cell, class Policy, class T>
void rnn_copy_saved(const rnn_plan<Cell>& plan, const T* from, T* to) {
  Policy::copy(from, to, plan.saved_size);
  if constexpr (requires { Policy::rnn_sequence_copy_saved(static_cast<const void*>(from), static_cast<void*>(to)); })
    Policy::rnn_sequence_copy_saved(static_cast<const void*>(from), static_cast<void*>(to));
}

// Backpropagation through time. dout (the output's layout), dh_n, dc_n: gradients of the forward's results, each may
// be null (zero). Writes dx (the input's layout), dh0, dc0 when not null, and ADDS the parameter gradients into
// dparams. Overwrites the saved gates with their gradients, so it runs once per forward. training must be the
// forward's flag (it says whether dropout masks were drawn).
template <class Cell, class Policy, class T>
void rnn_backward(const rnn_dims& d, index_t seq, index_t batch, const T* params, const T* x, const T* h0,
                  const T* c0, const T* dout, const T* dh_n, const T* dc_n, T* dx, T* dh0, T* dc0, T* dparams, T* saved, T* temp,
                  bool training) {
  const rnn_plan<Cell> plan(d, seq, batch);
  const index_t H = d.hidden_size, D = d.directions(), W = d.output_size(), GH = plan.gate_width(),
                R = plan.rows();
  T* dy_cur = temp;
  T* dy_next = temp + R * W;
  T* dx_copy = dy_next + R * W;
  T* dh = dx_copy + plan.input_copy_size();
  T* dc = dh + batch * H;
  // GRU only: dL/d(h W_hh^T + b_hh) of every step (the LSTM's is its gate gradient itself)
  T* dgh_all = Cell::has_cell_state ? nullptr : dc + batch * H + batch * GH;
  T* gradient_scratch = dc + batch * H;  // LSTM: lstm_parameter_gradients' operand and product
  if (dout) {
    if (d.batch_first) Policy::swap_leading(dout, dy_cur, batch, seq, W);
    else Policy::copy(dout, dy_cur, R * W);
  } else {
    Policy::fill(dy_cur, T(0), R * W);
  }
  const T* x_tm = d.batch_first ? plan.input_copy(saved) : x;
  // The whole stack in one call where the policy ran the forward that way (it declines in the same cases).
  bool ran_whole = false;
  if constexpr (requires {
                  Policy::rnn_sequence_backward(kernels::rnn_sequence{}, params, x_tm, h0, c0, x_tm, dy_cur, dh_n,
                                                dc_n, dx, dh0, dc0, dparams, static_cast<const void*>(saved));
                })
    ran_whole = Policy::rnn_sequence_backward(rnn_sequence_of<Cell>(d, seq, batch, training), params, x_tm, h0, c0,
                                              static_cast<const T*>(plan.output(saved, d.num_layers - 1)), dy_cur,
                                              dh_n, dc_n, dx ? (d.batch_first ? dx_copy : dx) : nullptr, dh0, dc0,
                                              dparams, static_cast<const void*>(saved));
  for (index_t l = d.num_layers - 1; !ran_whole && l >= 0; --l) {
    const index_t I = d.layer_input(l);
    const T* in = l == 0 ? x_tm : (training && d.has_dropout(l - 1) ? plan.dropped(saved, l - 1)
                                                                    : plan.output(saved, l - 1));
    T* din = l == 0 ? (dx ? (d.batch_first ? dx_copy : dx) : nullptr) : dy_next;
    const T* Y = plan.output(saved, l);
    for (index_t dir = 0; dir < D; ++dir) {
      auto w = rnn_weights_at<Cell>(const_cast<T*>(params), d, l, dir);
      auto dw = rnn_weights_at<Cell>(dparams, d, l, dir);
      T* G = plan.gates(saved, l, dir);
      const T* S = plan.state(saved, l, dir);
      const index_t slot = (l * D + dir) * batch * H;
      const T* h_first = h0 ? h0 + slot : nullptr;
      const T* c_first = c0 && Cell::has_cell_state ? c0 + slot : nullptr;
      if (dh_n) Policy::copy(dh_n + slot, dh, batch * H);
      else Policy::fill(dh, T(0), batch * H);
      if constexpr (Cell::has_cell_state) {
        if (dc_n) Policy::copy(dc_n + slot, dc, batch * H);
        else Policy::fill(dc, T(0), batch * H);
      }
      T* dG_h = Cell::has_cell_state ? G : dgh_all;  // the gradient of the recurrent product
      // Each step multiplies by W_hh (dL/dh_prev = dgates W_hh): packed once, as in the forward.
      const step_weight<T> w_hh = prepare_step_weight<Policy>(false, GH, H, static_cast<const T*>(w.w_hh), H);
      for_batch_slices<Policy>(batch, GH * H, [&](index_t b0, index_t b1) {
        for (index_t s = seq - 1; s >= 0; --s) {
          const index_t t = dir ? seq - 1 - s : s;
          const index_t t_prev = dir ? t + 1 : t - 1;
          const T* h_prev = s == 0 ? (h_first ? h_first + b0 * H : nullptr)
                                   : detail::step_rows(Y, t_prev, batch, W) + b0 * W + dir * H;
          const index_t ld_h_prev = s == 0 ? H : W;
          const T* state_prev = s == 0 ? (c_first ? c_first + b0 * H : nullptr)
                                       : detail::step_rows(S, t_prev, batch, H) + b0 * H;
          Cell::template step_backward<Policy>(
              b1 - b0, H, w_hh, detail::step_rows(G, t, batch, GH) + b0 * GH,
              detail::step_rows(S, t, batch, H) + b0 * H, state_prev, h_prev, ld_h_prev,
              detail::step_rows(dy_cur, t, batch, W) + b0 * W + dir * H, W, dh + b0 * H, dc + b0 * H,
              dgh_all ? detail::step_rows(dgh_all, t, batch, GH) + b0 * GH : nullptr);
        }
      });
      if (dh0) Policy::copy(dh, dh0 + slot, batch * H);
      if constexpr (Cell::has_cell_state)
        if (dc0) Policy::copy(dc, dc0 + slot, batch * H);
      // Parameter gradients. The recurrent weight sees h_{t-1}: the layer's own output one step earlier in its
      // direction, or h_0 at the first step (zero, contributing nothing, without one).
      if constexpr (Cell::has_cell_state && requires { Policy::accumulate_rows(R, I, G, GH, G, GH); }) {
        lstm_parameter_gradients<Policy>(plan, I, dir, G, in, Y, h_first, dw, gradient_scratch);
      } else {
        Policy::gemm(true, false, GH, I, R, T(1), G, GH, in, I, T(1), dw.w_ih, I);
        if (seq > 1) {
          const T* dg_from = dir ? dG_h : dG_h + batch * GH;
          const T* h_from = dir ? Y + batch * W + dir * H : Y + dir * H;
          Policy::gemm(true, false, GH, H, (seq - 1) * batch, T(1), dg_from, GH, h_from, W, T(1), dw.w_hh, H);
        }
        if (h_first) {
          const index_t t0 = dir ? seq - 1 : 0;
          Policy::gemm(true, false, GH, H, batch, T(1), detail::step_rows(dG_h, t0, batch, GH), GH, h_first, H, T(1),
                       dw.w_hh, H);
        }
        if (d.bias) {
          Policy::sum_rows(G, dw.b_ih, R, GH, true);
          Policy::sum_rows(dG_h, dw.b_hh, R, GH, true);
        }
      }
      if (din) Policy::gemm(false, false, R, I, GH, T(1), G, GH, w.w_ih, I, dir == 0 ? T(0) : T(1), din, I);
    }
    if (l > 0) {
      if (training && d.has_dropout(l - 1)) Policy::multiply(dy_next, plan.mask(saved, l - 1), dy_next, R * W);
      std::swap(dy_cur, dy_next);
    }
  }
  if (dx && d.batch_first) Policy::swap_leading(dx_copy, dx, seq, batch, d.input_size);
}

// What a static recurrent layer hands to the next layer.
enum class rnn_output {
  sequence,     // every step: (seq, directions * H); output[..., :H] forward, output[..., H:] reverse direction
  last_step,    // output[:, -1]: (directions * H); for a bidirectional layer the reverse half has read one step only
  final_state,  // h_n of the last layer, directions concatenated: (directions * H) = [forward at t = T-1, reverse at
                // t = 0], each direction after reading the whole sequence: the usual choice for classification
};

// Static-mode options beyond the type's main arguments.
struct rnn_options {
  bool bias = true;
  float dropout = 0.0f;  // between stacked layers, training only
};

// The static-mode stacked recurrent layer over (Seq, Features) samples (batch first). Parameters in the flat buffer
// in PyTorch's order and names (weight_ih_l0, ...); the layer starts from zero states.
template <class Cell, index_t Hidden, index_t Layers, bool Bidirectional, rnn_options Options, rnn_output Output>
struct recurrent_layer {
  static_assert(Hidden > 0 && Layers > 0, "kiln::LSTM / kiln::GRU: Hidden and Layers must be positive");
  static_assert(Options.dropout >= 0.0f && Options.dropout < 1.0f,
                "kiln::LSTM / kiln::GRU: rnn_options::dropout must be in [0, 1)");
  static constexpr const char* name = Cell::name;

  template <class In>
  static constexpr bool accepts = In::rank == 2;
  static constexpr const char* requirement = "a (sequence, features) input per sample, e.g. kiln::Input<28, 28>";

  // The same layer handing another view of its results to the next layer (see LastStep, FinalState, AllSteps).
  template <rnn_output O>
  using with_output = recurrent_layer<Cell, Hidden, Layers, Bidirectional, Options, O>;

  template <class In>
  struct bind {
    static constexpr index_t seq = In::extents[0], features = In::extents[1];
    static constexpr rnn_dims dims{features, Hidden, Layers, Options.bias, Bidirectional, true, Options.dropout};
    static constexpr index_t width = dims.output_size();
    using output = std::conditional_t<Output == rnn_output::sequence, kiln::dims<seq, width>, kiln::dims<width>>;
    static constexpr index_t param_count = rnn_param_count<Cell>(dims);
    static constexpr rnn_plan<Cell> plan1{dims, seq, 1};
    // Per sample: the saved activations, the scratch, and the full-size gradient that a selecting output scatters.
    static constexpr index_t select_size = Output == rnn_output::last_step     ? seq * width
                                           : Output == rnn_output::final_state ? Layers * dims.directions() * Hidden
                                                                               : 0;
    static constexpr index_t scratch_per_sample = plan1.saved_size + plan1.temp_size + select_size;
    static constexpr bool aliases_input = false;
    // Dropout between stacked layers draws masks with a generator of the layer's own.
    static constexpr bool draws_at_run_time = dims.has_dropout(0);

    template <class T>
    static void init(T* params, random_generator& rng) {
      rnn_init<T>({params, static_cast<std::size_t>(param_count)}, Hidden, rng);
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      const index_t B = ctx.batch;
      const rnn_plan<Cell> plan(dims, seq, B);
      T* saved = scratch;
      T* temp = saved + plan.saved_size;
      T* select = temp + plan.temp_size;
      if constexpr (Output == rnn_output::sequence) {
        rnn_forward<Cell, Policy>(dims, seq, B, params, x, static_cast<const T*>(nullptr),
                                  static_cast<const T*>(nullptr), y, static_cast<T*>(nullptr),
                                  static_cast<T*>(nullptr), saved, temp, ctx.training, ctx.rng);
      } else if constexpr (Output == rnn_output::last_step) {
        rnn_forward<Cell, Policy>(dims, seq, B, params, x, static_cast<const T*>(nullptr),
                                  static_cast<const T*>(nullptr), static_cast<T*>(nullptr),
                                  static_cast<T*>(nullptr), static_cast<T*>(nullptr), saved, temp, ctx.training,
                                  ctx.rng);
        Policy::copy(detail::step_rows(plan.output(saved, Layers - 1), seq - 1, B, width), y, B * width);
      } else {
        rnn_forward<Cell, Policy>(dims, seq, B, params, x, static_cast<const T*>(nullptr),
                                  static_cast<const T*>(nullptr), static_cast<T*>(nullptr), select,
                                  static_cast<T*>(nullptr), saved, temp, ctx.training, ctx.rng);
        for (index_t dir = 0; dir < dims.directions(); ++dir)
          Policy::copy_rows(B, Hidden, select + ((Layers - 1) * dims.directions() + dir) * B * Hidden, Hidden,
                            y + dir * Hidden, width);
      }
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t B = ctx.batch;
      const rnn_plan<Cell> plan(dims, seq, B);
      T* saved = scratch;
      T* temp = saved + plan.saved_size;
      T* select = temp + plan.temp_size;
      Policy::fill(dparams, T(0), param_count);
      const T* dout = nullptr;
      const T* dh_n = nullptr;
      if constexpr (Output == rnn_output::sequence) {
        dout = dy;
      } else if constexpr (Output == rnn_output::last_step) {
        Policy::fill(select, T(0), B * seq * width);
        Policy::copy_rows(B, width, dy, width, select + (seq - 1) * width, seq * width);
        dout = select;
      } else {
        Policy::fill(select, T(0), Layers * dims.directions() * B * Hidden);
        for (index_t dir = 0; dir < dims.directions(); ++dir)
          Policy::copy_rows(B, Hidden, dy + dir * Hidden, width,
                            select + ((Layers - 1) * dims.directions() + dir) * B * Hidden, Hidden);
        dh_n = select;
      }
      rnn_backward<Cell, Policy>(dims, seq, B, params, x, static_cast<const T*>(nullptr),
                                 static_cast<const T*>(nullptr), dout, dh_n,
                                 static_cast<const T*>(nullptr), dx, static_cast<T*>(nullptr),
                                 static_cast<T*>(nullptr), dparams, saved, temp, ctx.training);
    }
    static std::vector<static_parameter_info> parameter_tensors() { return rnn_parameter_infos<Cell>(dims); }
    static std::string description() {
      std::string s = Cell::name;
      s += "(";
      s += std::to_string(Hidden);
      if (Layers > 1) {
        s += ", layers=";
        s += std::to_string(Layers);
      }
      if (Bidirectional) s += ", bidirectional";
      s += ")";
      if (Output == rnn_output::last_step) s += "[last step]";
      if (Output == rnn_output::final_state) s += "[final state]";
      return s;
    }
  };
};

// Output adaptors for a static recurrent layer R (kiln::LSTM<...> or kiln::GRU<...>), the same layer and parameters:
//   AllSteps<R>    (seq, D*H): every step, output[..., :H] forward direction, output[..., H:] reverse (R itself).
//   LastStep<R>    (D*H): output[:, -1], PyTorch's out[:, -1]. For a bidirectional R the reverse half at t = T-1 has
//                  read only the last input; prefer FinalState for classification.
//   FinalState<R>  (D*H): h_n of the last layer, [forward direction at t = T-1, reverse direction at t = 0]: both
//                  directions after reading the whole sequence (PyTorch: torch.cat((h_n[-2], h_n[-1]), dim=1)).
template <class R>
using AllSteps = typename R::template with_output<rnn_output::sequence>;
template <class R>
using LastStep = typename R::template with_output<rnn_output::last_step>;
template <class R>
using FinalState = typename R::template with_output<rnn_output::final_state>;

}  // namespace kiln
