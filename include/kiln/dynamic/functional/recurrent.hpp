// The recurrent op behind nn::LSTM and nn::GRU. It calls rnn_forward / rnn_backward (layers/recurrent.hpp), the
// functions static mode's kiln::LSTM / kiln::GRU call, so both modes compute the same numbers.
//
// The op has more inputs and results than a tape entry holds, so it is recorded as:
//   packed = rnn_op(x, hx, flat)   one entry: inputs x, the initial state(s) and the module's flat parameter array
//                                  (its named parameters are views into it); its value holds [output | h_n | c_n],
//                                  and past its shape, a header describing the call and the activations the backward
//                                  needs;
//   rnn_select(packed, what)       one entry per result the caller takes (output, h_n, c_n, last step, final state),
//                                  whose backward adds into packed's gradient.
#pragma once

#include <cstring>
#include <iterator>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/layers/recurrent.hpp"

namespace kiln::nn {

// What rnn_select takes from a packed recurrent result.
enum class rnn_part { output, h_n, c_n, last_step, final_state };

namespace detail {

// The call's description, stored as numbers after the packed results.
struct rnn_header {
  static constexpr index_t size = 16;
  rnn_dims d;
  index_t seq = 0, batch = 0;
  bool training = false, has_h0 = false, has_c0 = false;

  static constexpr index_t fields = 12;
  // at is in the policy's memory: the numbers go through a host array (on a GPU, a copy each way; read waits).
  template <class T>
  void write(T* to) const {
    const double v[fields] = {double(d.input_size), double(d.hidden_size), double(d.num_layers), double(d.bias),
                              double(d.bidirectional), double(d.batch_first), double(d.dropout), double(seq),
                              double(batch), double(training), double(has_h0), double(has_c0)};
    T at[fields];
    for (index_t i = 0; i < fields; ++i) at[i] = static_cast<T>(v[i]);
    copy_values_from_host(at, to, fields);
  }
  template <class T>
  static rnn_header read(const T* from) {
    T at[fields];
    copy_values_to_host(from, at, fields);
    rnn_header h;
    auto i = [&](int k) { return static_cast<index_t>(at[k]); };
    h.d = rnn_dims{i(0), i(1), i(2), at[3] != T(0), at[4] != T(0), at[5] != T(0), static_cast<float>(at[6])};
    h.seq = i(7);
    h.batch = i(8);
    h.training = at[9] != T(0);
    h.has_h0 = at[10] != T(0);
    h.has_c0 = at[11] != T(0);
    return h;
  }
  index_t output_count() const { return seq * batch * d.output_size(); }
  index_t state_count() const { return d.num_layers * d.directions() * batch * d.hidden_size; }
};

template <class Cell, class T>
void rnn_backward_entry(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>* packed = e.out;
  variable_node<T>*x = e.in[0], *flat = e.in[1], *hx = e.in[2];
  const index_t results = packed->shape.numel();
  const rnn_header h = rnn_header::read(packed->value + results);
  const rnn_plan<Cell> plan(h.d, h.seq, h.batch);
  T* saved = packed->value + results + rnn_header::size;
  // rnn_backward overwrites the saved gates with their gradients: a backward that keeps the graph for another one
  // (retain_graph) hands it a copy instead.
  const bool keep_saved = tape<T>::instance().retaining_graph();
  scratch_buffer<T> saved_copy(keep_saved ? plan.saved_size : 0);
  if (keep_saved) {
    rnn_copy_saved<Cell, P>(plan, static_cast<const T*>(saved), saved_copy.data());
    saved = saved_copy.data();
  }
  const T* g = packed->grad;
  const index_t out_n = h.output_count(), state_n = h.state_count();
  const T* h0 = hx && h.has_h0 ? hx->value : nullptr;
  const T* c0 = hx && h.has_c0 ? hx->value + state_n : nullptr;

  scratch_buffer<T> temp(plan.temp_size);
  grad_target<T> dx = grad_target_for(x), dhx = grad_target_for(hx);
  scratch_buffer<T> dx_scratch(dx.accumulate ? x->shape.numel() : 0);
  scratch_buffer<T> dhx_scratch(dhx.accumulate ? hx->shape.numel() : 0);
  T* dx_to = dx.data ? (dx.accumulate ? dx_scratch.data() : dx.data) : nullptr;
  T* dhx_to = dhx.data ? (dhx.accumulate ? dhx_scratch.data() : dhx.data) : nullptr;
  T* dparams = zeroed_grad_for(flat);
  scratch_buffer<T> dparams_scratch(dparams ? 0 : flat->shape.numel());
  if (!dparams) dparams = dparams_scratch.data();

  rnn_backward<Cell, P>(h.d, h.seq, h.batch, flat->value, x->value, h0, c0, g, g + out_n,
                        Cell::has_cell_state ? g + out_n + state_n : nullptr, dx_to,
                        dhx_to && h.has_h0 ? dhx_to : nullptr,
                        dhx_to && h.has_c0 ? dhx_to + state_n : nullptr, dparams, saved, temp.data(), h.training);
  if (dx.data && dx.accumulate) P::accumulate(dx_scratch.data(), dx.data, x->shape.numel());
  if (dhx.data && dhx.accumulate) P::accumulate(dhx_scratch.data(), dhx.data, hx->shape.numel());
}

// Calls body(source offset, source row stride, destination offset, destination row stride, rows, columns) for every
// block of elements `what` copies out of packed: one block, or one per direction for the final state.
template <class Body>
void for_each_rnn_block(const rnn_header& h, rnn_part what, Body&& body) {
  const index_t T = h.seq, B = h.batch, H = h.d.hidden_size, D = h.d.directions(), W = h.d.output_size();
  const index_t out_n = h.output_count(), state_n = h.state_count();
  switch (what) {
    case rnn_part::output: return body(index_t{0}, out_n, index_t{0}, out_n, index_t{1}, out_n);
    case rnn_part::h_n: return body(out_n, state_n, index_t{0}, state_n, index_t{1}, state_n);
    case rnn_part::c_n: return body(out_n + state_n, state_n, index_t{0}, state_n, index_t{1}, state_n);
    case rnn_part::last_step:
      if (h.d.batch_first) body((T - 1) * W, T * W, index_t{0}, W, B, W);
      else body((T - 1) * B * W, B * W, index_t{0}, B * W, index_t{1}, B * W);
      return;
    case rnn_part::final_state:
      for (index_t dir = 0; dir < D; ++dir) body(out_n + ((h.d.num_layers - 1) * D + dir) * B * H, H, dir * H, W, B, H);
      return;
  }
}

inline kiln::shape rnn_part_shape(const rnn_header& h, rnn_part what) {
  const index_t T = h.seq, B = h.batch, H = h.d.hidden_size, W = h.d.output_size();
  switch (what) {
    case rnn_part::output: return h.d.batch_first ? kiln::shape{B, T, W} : kiln::shape{T, B, W};
    case rnn_part::h_n:
    case rnn_part::c_n: return kiln::shape{h.d.num_layers * h.d.directions(), B, H};
    case rnn_part::last_step:
    case rnn_part::final_state: return kiln::shape{B, W};
  }
  return {};
}

template <class T>
void rnn_select_backward(const tape_entry<T>& e) {
  variable_node<T>* packed = e.in[0];
  T* g = zeroed_grad_for(packed);
  if (!g) return;
  const rnn_header h = rnn_header::read(packed->value + packed->shape.numel());
  const T* dy = e.out->grad;
  for_each_rnn_block(h, static_cast<rnn_part>(e.aux),
                     [&](index_t src, index_t ld_src, index_t dst, index_t ld_dst, index_t rows, index_t cols) {
                       if (rows == 1) dynamic_policy::accumulate(dy + dst, g + src, cols);
                       else dynamic_policy::accumulate_rows(rows, cols, dy + dst, ld_dst, g + src, ld_src);
                     });
}

template <class T>
void stack_states_backward(const tape_entry<T>& e) {
  const T* dy = e.out->grad;
  const index_t n = e.out->shape.numel() / 2;
  for (int k = 0; k < 2; ++k) {
    grad_target<T> t = grad_target_for(e.in[k]);
    if (!t.data) continue;
    if (t.accumulate) dynamic_policy::accumulate(dy + k * n, t.data, n);
    else dynamic_policy::copy(dy + k * n, t.data, n);
  }
}

}  // namespace detail

// Runs a stacked recurrent layer. x: (seq, batch, input) or (batch, seq, input) with d.batch_first; hx: empty, h_0
// (L*D, batch, H), or for an LSTM (h_0, c_0) stacked as (2, L*D, batch, H) (see stack_states); flat: the parameters
// in rnn_weights order. Returns the packed result for rnn_select.
template <class Cell, class T>
basic_variable<T> rnn_op(const basic_variable<T>& x, const basic_variable<T>& hx, const basic_variable<T>& flat,
                         const rnn_dims& d, bool training, random_generator* rng) {
  auto* xn = detail::node_of(x, Cell::name);
  auto* fn = detail::node_of(flat, Cell::name);
  auto* hn = hx.defined() ? hx.node() : nullptr;
  const kiln::shape& xs = xn->shape;
  if (xs.rank() != 3 || xs[2] != d.input_size)
    fail(Cell::name, ": expected input of shape ", d.batch_first ? "(batch, seq, " : "(seq, batch, ", d.input_size,
         "), found ", xs);
  detail::rnn_header h;
  h.d = d;
  h.seq = d.batch_first ? xs[1] : xs[0];
  h.batch = d.batch_first ? xs[0] : xs[1];
  h.training = training;
  if (h.seq < 1 || h.batch < 1) fail(Cell::name, ": expected a non-empty sequence and batch, found input ", xs);
  const index_t state_n = h.state_count();
  if (hn) {
    const index_t L = d.num_layers * d.directions();
    bool pair = Cell::has_cell_state;
    const kiln::shape state{L, h.batch, d.hidden_size};
    const kiln::shape expected = pair ? kiln::shape{2, L, h.batch, d.hidden_size} : state;
    if (hn->shape != expected) {
      // Said in the caller's terms: an LSTM's h_0 and c_0 arrive stacked (stack_states checked they match), and the
      // stacked shape is ours, not theirs.
      const kiln::shape& s = hn->shape;
      const bool stacked = pair && s.rank() == 4 && s[0] == 2;
      fail(Cell::name, ": expected ", pair ? "h_0 and c_0" : "h_0",
           " of shape (num_layers * num_directions, batch, hidden_size) = ", state, ", found ",
           stacked ? kiln::shape{s[1], s[2], s[3]} : s,
           stacked ? "" : pair ? " (expected h_0 and c_0 stacked by stack_states)" : "");
    }
    h.has_h0 = true;
    h.has_c0 = pair;
  }
  if (fn->shape.numel() != rnn_param_count<Cell>(d))
    fail(Cell::name, ": expected ", rnn_param_count<Cell>(d), " parameters, found ", fn->shape.numel());
  const rnn_plan<Cell> plan(d, h.seq, h.batch);
  const index_t results = h.output_count() + state_n * (Cell::has_cell_state ? 2 : 1);
  bool record = detail::should_record<T>({xn, fn, hn});
  auto packed = basic_variable<T>::adopt(detail::make_node<T>(kiln::shape{results}, record, false, false));
  auto* pn = packed.node();
  pn->value_block = detail::allocate_tensor_storage(
      static_cast<std::size_t>(results + detail::rnn_header::size + plan.saved_size) * sizeof(T));
  pn->value = static_cast<T*>(pn->value_block.data);
  h.write(pn->value + results);
  T* saved = pn->value + results + detail::rnn_header::size;
  detail::scratch_buffer<T> temp(plan.temp_size);
  const T* h0 = hn ? hn->value : nullptr;
  const T* c0 = hn && Cell::has_cell_state ? hn->value + state_n : nullptr;
  T* out = pn->value;
  rnn_forward<Cell, dynamic_policy>(d, h.seq, h.batch, fn->value, xn->value, h0, c0, out, out + h.output_count(),
                                    Cell::has_cell_state ? out + h.output_count() + state_n : nullptr, saved,
                                    temp.data(), training, rng);
  if (record) detail::tape<T>::instance().record(&detail::rnn_backward_entry<Cell, T>, pn, xn, fn, hn);
  return packed;
}

// One result of rnn_op: output, h_n, c_n, the last step of the output, or the final state of the last layer.
template <class T>
basic_variable<T> rnn_select(const basic_variable<T>& packed, rnn_part what) {
  auto* pn = detail::node_of(packed, "rnn_select");
  const auto h = detail::rnn_header::read(pn->value + pn->shape.numel());
  bool record = detail::should_record<T>({pn});
  auto y = detail::make_output<T>(detail::rnn_part_shape(h, what), record);
  T* dst = y.data();
  detail::for_each_rnn_block(h, what,
                             [&](index_t src, index_t ld_src, index_t to, index_t ld_to, index_t rows, index_t cols) {
                               if (rows == 1) dynamic_policy::copy(pn->value + src, dst + to, cols);
                               else dynamic_policy::copy_rows(rows, cols, pn->value + src, ld_src, dst + to, ld_to);
                             });
  if (record)
    detail::tape<T>::instance().record(&detail::rnn_select_backward<T>, y.node(), pn, nullptr, nullptr, T(0),
                                       static_cast<int>(what));
  return y;
}

// (h_0, c_0), each (L*D, batch, H), as one (2, L*D, batch, H) value: the LSTM's initial-state input.
template <class T>
basic_variable<T> stack_states(const basic_variable<T>& h0, const basic_variable<T>& c0) {
  auto* a = detail::node_of(h0, "LSTM (h_0)");
  auto* b = detail::node_of(c0, "LSTM (c_0)");
  if (a->shape != b->shape || a->shape.rank() != 3)
    fail("LSTM: expected h_0 and c_0 of the same shape (layers * directions, batch, hidden), found ", a->shape, " and ",
         b->shape);
  bool record = detail::should_record<T>({a, b});
  auto y = detail::make_output<T>(kiln::shape{2, a->shape[0], a->shape[1], a->shape[2]}, record);
  const index_t n = a->shape.numel();
  dynamic_policy::copy(a->value, y.data(), n);
  dynamic_policy::copy(b->value, y.data() + n, n);
  if (record) detail::tape<T>::instance().record(&detail::stack_states_backward<T>, y.node(), a, b);
  return y;
}

}  // namespace kiln::nn
