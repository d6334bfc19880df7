// nn::LSTM and nn::GRU, as torch.nn.LSTM / torch.nn.GRU: the same constructor arguments (nn::rnn_options), parameter
// names (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._reverse), shapes, gate orders, initialisation and
// results:
//   auto [output, state] = lstm(x);              // or lstm(x, {h0, c0})
//   auto [h_n, c_n] = state;
//   auto [output, h_n] = gru(x);                 // or gru(x, h0)
// output is (seq, batch, D*H) or (batch, seq, D*H) with batch_first; h_n and c_n are (layers*D, batch, H).
// output[..., :H] is the forward direction and output[..., H:] the reverse direction, which reads the sequence from
// t = T-1 down to 0: its "last" step (its state after the whole sequence) is at t = 0.
//
// As modules (inside nn::Sequential, whose forward takes and returns one value) use an adaptor, which is the same
// module (it shares the parameters and names) with a one-value forward:
//   nn::AllSteps(lstm)    output                                  forward(x) of a plain nn::LSTM / nn::GRU too
//   nn::LastStep(lstm)    output[:, -1] (batch, D*H)             PyTorch's out[:, -1]; with bidirectional the
//                                                                reverse half has then read only the last input
//   nn::FinalState(lstm)  h_n of the last layer, directions      torch.cat((h_n[-2], h_n[-1]), 1): forward at
//                         concatenated (batch, D*H)              t = T-1, reverse at t = 0; best for classification
//
// Parameters live in one flat array (PyTorch's _flat_weights order), and each named parameter is a view into it, so
// one tape entry can read and differentiate them all, exactly as static mode's flat buffer.
#pragma once

#include <string>
#include <tuple>
#include <utility>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/recurrent.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/layers/gru.hpp"
#include "kiln/layers/lstm.hpp"

namespace kiln::nn {

// torch.nn.LSTM / GRU keyword arguments.
struct rnn_options {
  index_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  float dropout = 0.0f;  // between stacked layers, training only
  bool bidirectional = false;
};

template <class Cell, class T>
class basic_recurrent : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  basic_recurrent(index_t input_size, index_t hidden_size, rnn_options options = {})
      : dims_{input_size, hidden_size, options.num_layers, options.bias, options.bidirectional, options.batch_first,
              options.dropout} {
    if (input_size < 1 || hidden_size < 1 || options.num_layers < 1)
      fail(Cell::name, ": expected positive input_size, hidden_size and num_layers, found ", input_size, ", ",
           hidden_size, " and ", options.num_layers);
    if (!(options.dropout >= 0.0f && options.dropout < 1.0f))
      fail(Cell::name, ": expected dropout in [0, 1), found ", options.dropout);
    flat_ = variable(kiln::shape{rnn_param_count<Cell>(dims_)}, true);
    flat_.ensure_grad();
    auto* flat = flat_.node();
    for (const auto& info : rnn_parameter_infos<Cell>(dims_)) {
      variable p = this->register_parameter(info.name, Tensor<T>(info.shape));
      // The parameter becomes a view of its slice of the flat array (value and gradient).
      auto* n = p.node();
      detail::free_tensor_storage(std::exchange(n->value_block, storage_block{}));
      detail::free_tensor_storage(std::exchange(n->grad_block, storage_block{}));
      n->value = flat->value + info.offset;
      n->grad = flat->grad + info.offset;
      n->storage_owner = flat;
      detail::retain(flat);
    }
    random_generator rng = this->take_init_generator();
    // Dropout between stacked layers draws from a generator of its own, as the static layer's does.
    if (dims_.has_dropout(0)) dropout_rng_ = next_runtime_generator();
    reset_parameters(rng);
  }

  // The packed results (output, h_n[, c_n]) of one call; take them apart with rnn_select.
  variable run(const variable& x, const variable& hx = {}) {
    return rnn_op<Cell>(x, hx, flat_, dims_, this->is_training(), &dropout_rng_);
  }

  // basic_module's one-value forward: the output sequence (as nn::AllSteps).
  variable forward(const variable& x) override { return rnn_select(run(x), rnn_part::output); }

  std::string name() const override { return Cell::name; }
  std::string extra_repr() const override {
    std::string s = std::to_string(dims_.input_size);
    s += ", ";
    s += std::to_string(dims_.hidden_size);
    if (dims_.num_layers != 1) {
      s += ", num_layers=";
      s += std::to_string(dims_.num_layers);
    }
    if (!dims_.bias) s += ", bias=False";
    if (dims_.batch_first) s += ", batch_first=True";
    if (dims_.dropout > 0) {
      s += ", dropout=";
      s += std::to_string(dims_.dropout);
    }
    if (dims_.bidirectional) s += ", bidirectional=True";
    return s;
  }
  // PyTorch's initialisation: every parameter U(-1/sqrt(hidden), 1/sqrt(hidden)), in parameter order (rnn_init, the
  // function static mode's layer uses).
  void reset_parameters(random_generator& rng) override {
    detail::host_values<T> flat(flat_);
    rnn_init<T>(flat.span(), dims_.hidden_size, rng);
    flat.write_back();
  }

  const rnn_dims& dims() const { return dims_; }
  index_t input_size() const { return dims_.input_size; }
  index_t hidden_size() const { return dims_.hidden_size; }
  index_t num_layers() const { return dims_.num_layers; }
  bool bidirectional() const { return dims_.bidirectional; }
  bool batch_first() const { return dims_.batch_first; }
  // All parameters as one array in PyTorch's _flat_weights order (the named parameters are views into it).
  const variable& flat_parameters() const { return flat_; }

 protected:
  random_generator* own_runtime_generator() override { return dims_.has_dropout(0) ? &dropout_rng_ : nullptr; }

  rnn_dims dims_;
  variable flat_;
  random_generator dropout_rng_;
};

// torch.nn.LSTM. lstm(x) and lstm(x, {h0, c0}) return (output, (h_n, c_n)).
template <class T>
class basic_lstm : public basic_recurrent<lstm_cell, T> {
 public:
  using variable = basic_variable<T>;
  using state_type = std::tuple<variable, variable>;
  using result_type = std::tuple<variable, state_type>;
  using basic_recurrent<lstm_cell, T>::basic_recurrent;

  result_type forward_with_state(const variable& x, const state_type& hx = {}) {
    const auto& [h0, c0] = hx;
    if (h0.defined() != c0.defined()) fail("LSTM: give both h_0 and c_0, or neither");
    variable packed = this->run(x, h0.defined() ? stack_states(h0, c0) : variable{});
    return {rnn_select(packed, rnn_part::output),
            state_type{rnn_select(packed, rnn_part::h_n), rnn_select(packed, rnn_part::c_n)}};
  }
  result_type operator()(const variable& x, const state_type& hx = {}) { return forward_with_state(x, hx); }
};

// torch.nn.GRU. gru(x) and gru(x, h0) return (output, h_n).
template <class T>
class basic_gru : public basic_recurrent<gru_cell, T> {
 public:
  using variable = basic_variable<T>;
  using result_type = std::tuple<variable, variable>;
  using basic_recurrent<gru_cell, T>::basic_recurrent;

  result_type forward_with_state(const variable& x, const variable& h0 = {}) {
    variable packed = this->run(x, h0);
    return {rnn_select(packed, rnn_part::output), rnn_select(packed, rnn_part::h_n)};
  }
  result_type operator()(const variable& x, const variable& h0 = {}) { return forward_with_state(x, h0); }
};

// The adaptors: the same recurrent module (sharing its parameters and names) with forward(x) returning one value.
template <class R, rnn_part Part>
class basic_rnn_adaptor : public R {
 public:
  using variable = typename R::variable;
  explicit basic_rnn_adaptor(R rnn) : R(std::move(rnn)) {}
  variable forward(const variable& x) override { return rnn_select(this->run(x), Part); }
  variable operator()(const variable& x) { return forward(x); }
  std::string name() const override {
    std::string s = Part == rnn_part::last_step ? "LastStep[" : Part == rnn_part::final_state ? "FinalState[" : "AllSteps[";
    s += R::name();
    s += "]";
    return s;
  }
};

template <class R>
struct AllSteps : basic_rnn_adaptor<R, rnn_part::output> {
  using basic_rnn_adaptor<R, rnn_part::output>::basic_rnn_adaptor;
};
template <class R>
struct LastStep : basic_rnn_adaptor<R, rnn_part::last_step> {
  using basic_rnn_adaptor<R, rnn_part::last_step>::basic_rnn_adaptor;
};
template <class R>
struct FinalState : basic_rnn_adaptor<R, rnn_part::final_state> {
  using basic_rnn_adaptor<R, rnn_part::final_state>::basic_rnn_adaptor;
};
template <class R>
AllSteps(R) -> AllSteps<R>;
template <class R>
LastStep(R) -> LastStep<R>;
template <class R>
FinalState(R) -> FinalState<R>;

using LSTM = basic_lstm<float>;
using GRU = basic_gru<float>;

}  // namespace kiln::nn
