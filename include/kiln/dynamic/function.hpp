// nn::Function: an op of the user's own, with a forward and a backward the user writes, as torch.autograd.Function
// (LibTorch's torch::autograd::Function). The forward computes with any ops (nothing it does is recorded); the
// backward receives the gradient of the output and returns one gradient per Variable argument of the forward, in
// order (an empty Variable where there is none). Both run with grad mode off, so the function is differentiated once:
// a gradient of its gradient is not available.
//
//   struct ScaledTanh : kiln::nn::Function<ScaledTanh> {
//     static kiln::nn::Variable forward(kiln::nn::FunctionContext& ctx, const kiln::nn::Variable& x, float scale) {
//       auto y = kiln::nn::tanh(x);
//       ctx.save_for_backward({y});
//       ctx.saved_data["scale"] = scale;
//       return y * scale;
//     }
//     static std::vector<kiln::nn::Variable> backward(kiln::nn::FunctionContext& ctx, const kiln::nn::Variable& g) {
//       const auto& y = ctx.saved_variables()[0];
//       const float scale = static_cast<float>(ctx.saved_data["scale"]);
//       return {g * (1.0f - y * y) * scale};
//     }
//   };
//   auto y = ScaledTanh::apply(x, 2.0f);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/dynamic/functional/common.hpp"

namespace kiln::nn {

// What a Function's forward leaves for its backward.
template <class T>
class basic_function_context {
 public:
  // Variables the backward reads (inputs, outputs or intermediates of the forward); kept alive until then.
  void save_for_backward(std::vector<basic_variable<T>> variables) { saved_ = std::move(variables); }
  const std::vector<basic_variable<T>>& saved_variables() const { return saved_; }
  // Numbers the backward reads (a scale, a dimension), by name.
  std::map<std::string, double> saved_data;
  // Whether the forward's Variable argument i requires a gradient (the backward may skip the others).
  bool needs_input_grad(std::size_t i) const { return i < needs_grad_.size() && needs_grad_[i]; }

 private:
  template <class, class>
  friend struct basic_function;
  std::vector<basic_variable<T>> saved_;
  std::vector<bool> needs_grad_;
};

namespace detail {

// The tape's record of one application: the context, and the Variable arguments as inputs.
template <class T>
struct function_state : saved_state<T> {
  basic_function_context<T> context;
};

template <class Derived, class T>
void function_backward_entry(const tape_entry<T>& e) {
  auto& state = static_cast<function_state<T>&>(*e.saved);
  no_grad guard;  // the backward's own ops are not recorded: the tape is being walked
  // The output's gradient, as a Variable sharing its buffer for the duration of this call.
  auto* g = make_node<T>(e.out->shape, false, true, false);
  g->value = e.out->grad;
  const auto grad_output = basic_variable<T>::adopt(g);
  const std::vector<basic_variable<T>> grads = Derived::backward(state.context, grad_output);
  if (grads.size() != state.inputs.size())
    fail("Function::backward: expected ", state.inputs.size(), " gradients (one per Variable argument of forward), "
         "found ", grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    variable_node<T>* input = state.inputs[i];
    if (!input->requires_grad || !grads[i].defined()) continue;
    if (!(grads[i].shape() == input->shape))
      fail("Function::backward: gradient ", i, " has shape ", grads[i].shape(), ", expected the input's shape ",
           input->shape);
    auto t = grad_target_for(input);
    const T* src = grads[i].node()->value;
    if (t.accumulate) dynamic_policy::accumulate(src, t.data, input->shape.numel());
    else dynamic_policy::copy(src, t.data, input->shape.numel());
  }
}

}  // namespace detail

// The base of a user's Function (CRTP): Derived defines
//   static basic_variable<T> forward(basic_function_context<T>& ctx, Args... args);
//   static std::vector<basic_variable<T>> backward(basic_function_context<T>& ctx, const basic_variable<T>& grad);
// and calls Derived::apply(args...).
template <class Derived, class T = float>
struct basic_function {
  template <class... Args>
  static basic_variable<T> apply(const Args&... args) {
    auto state = std::make_unique<detail::function_state<T>>();
    auto collect = [&](const auto& arg) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(arg)>, basic_variable<T>>) {
        state->keep_input(detail::node_of(arg, "Function::apply"));
        state->context.needs_grad_.push_back(arg.requires_grad());
      }
    };
    (collect(args), ...);
    bool record = false;
    for (auto* n : state->inputs) record = record || n->requires_grad;
    record = record && is_grad_enabled();
    basic_variable<T> result;
    {
      no_grad guard;
      result = Derived::forward(state->context, args...);
    }
    if (!result.defined()) fail("Function::forward returned an empty Variable");
    if (!record) return result;
    // The output: a new node over the forward's result (sharing its storage), made by this op.
    auto* out = detail::make_node<T>(result.shape(), true, false, false);
    out->value = result.node()->value;
    out->storage_owner = result.node();
    detail::retain(result.node());
    auto y = basic_variable<T>::adopt(out);
    detail::tape<T>::instance().record(&detail::function_backward_entry<Derived, T>, out, std::move(state));
    return y;
  }
};

template <class Derived>
using Function = basic_function<Derived, float>;
using FunctionContext = basic_function_context<float>;

}  // namespace kiln::nn
