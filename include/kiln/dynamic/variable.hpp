// basic_variable<T> (Variable for float): dynamic mode's tensor, a cheap handle (one pointer, intrusive count) to a
// value, its gradient and its place on the autograd tape, like a torch.Tensor with requires_grad.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/dynamic/tape.hpp"
#include "kiln/optim/parameter.hpp"

namespace kiln::nn {

// How Variable::backward treats the graph it goes through (torch.Tensor.backward's retain_graph).
struct backward_options {
  bool retain_graph = false;  // keep the graph for another backward instead of freeing it
};

template <class T>
class basic_variable {
 public:
  using value_type = T;
  using node_type = detail::variable_node<T>;

  // An empty handle (defined() is false).
  basic_variable() = default;
  // A zero-filled leaf of the given shape.
  explicit basic_variable(const kiln::shape& s, bool requires_grad = false)
      : node_(detail::make_node<T>(s, requires_grad, true)) {
    detail::zero_values(node_->value, s.numel());
  }
  // A leaf holding a copy of the data, which is host memory (storage comes from the caching allocator, not the
  // tensor's own buffer; on a GPU policy, device memory).
  basic_variable(tensor_view<const T> data, bool requires_grad = false)
      : node_(detail::make_node<T>(data.shape(), requires_grad, true)) {
    detail::copy_values_from_host(data.data(), node_->value, data.numel());
  }
  basic_variable(const Tensor<T>& data, bool requires_grad = false) : basic_variable(data.view(), requires_grad) {}
  // A leaf that reads the data where it is instead of copying it, as torch.from_numpy does: a batch that a data loader
  // has just assembled goes into the model without a second copy.
  // The data must stay alive and unchanged while the variable or any value computed from it is in use (a backward
  // reads it again), and nothing may write through value(). On a GPU policy, whose values live in device memory, this
  // copies the data like the constructor above.
  static basic_variable borrowing(tensor_view<const T> data) {
    if constexpr (!dynamic_policy::host_accessible) {
      return basic_variable(data);
    } else {
      basic_variable v = adopt(detail::make_node<T>(data.shape(), false, true, false));
      v.node_->value = const_cast<T*>(data.data());  // read only: no op writes into its inputs
      return v;
    }
  }
  static basic_variable borrowing(const Tensor<T>& data) { return borrowing(tensor_view<const T>(data.view())); }
  // A leaf holding a copy of data that is already in the policy's memory (device memory on a GPU policy: a batch of
  // a dataset uploaded once, copied on the device; on the CPU the same as the constructor from a view).
  static basic_variable copy_of_policy_memory(tensor_view<const T> data, bool requires_grad = false) {
    basic_variable v = adopt(detail::make_node<T>(data.shape(), requires_grad, true));
    if (data.numel()) dynamic_policy::copy(data.data(), v.node_->value, data.numel());
    return v;
  }

  basic_variable(const basic_variable& other) noexcept : node_(other.node_) { detail::retain(node_); }
  basic_variable(basic_variable&& other) noexcept : node_(std::exchange(other.node_, nullptr)) {}
  basic_variable& operator=(const basic_variable& other) noexcept {
    detail::retain(other.node_);
    detail::release(std::exchange(node_, other.node_));
    return *this;
  }
  basic_variable& operator=(basic_variable&& other) noexcept {
    if (this != &other) detail::release(std::exchange(node_, std::exchange(other.node_, nullptr)));
    return *this;
  }
  ~basic_variable() { detail::release(node_); }

  // Takes ownership of a node with one reference (ops use this for their outputs).
  static basic_variable adopt(node_type* n) {
    basic_variable v;
    v.node_ = n;
    return v;
  }

  bool defined() const { return node_ != nullptr; }
  const kiln::shape& shape() const { return checked()->shape; }
  int dim() const { return shape().rank(); }
  index_t numel() const { return shape().numel(); }
  // The value's memory: host memory on the CPU policy, device memory on a GPU policy (KILN_DYNAMIC_POLICY).
  // data(), value() and grad() point into storage this handle keeps alive, so they are refused on a temporary, whose
  // storage would be gone by the next statement (model(x).value()): name the result first, or take a copy with
  // tensor() or item().
  T* data() const& { return checked()->value; }
  T* data() const&& = delete;
  // The value as a writable view (shared: writing through it changes this variable, like tensor.data in PyTorch).
  // On a GPU policy the view is of device memory: pass it to the policy's kernels, or read it with tensor().
  tensor_view<T> value() const& { return {checked()->value, checked()->shape}; }
  tensor_view<T> value() const&& = delete;
  // A copy of the value in host memory.
  Tensor<T> tensor() const {
    if constexpr (dynamic_policy::host_accessible)
      return Tensor<T>(tensor_view<const T>(checked()->value, node_->shape));
    Tensor<T> copy(checked()->shape);
    detail::copy_values_to_host(static_cast<const T*>(node_->value), copy.data(), copy.numel());
    return copy;
  }
  // The single value of a one-element variable (on a GPU, waits for it).
  T item() const {
    if (numel() != 1) fail("Variable::item: expected one element, found shape ", shape());
    return detail::read_value(static_cast<const T*>(node_->value));
  }

  // The gradient that backward() left here. Leaves (parameters, inputs created with requires_grad) keep and
  // accumulate theirs; values computed by ops free theirs once it has been propagated, as in PyTorch.
  bool has_grad() const { return checked()->grad != nullptr; }
  tensor_view<T> grad() const&& = delete;
  tensor_view<T> grad() const& {
    if (!checked()->grad)
      fail("Variable::grad: no gradient is stored for this value of shape ", shape(),
           node_->requires_grad ? " (call backward() first; only leaves keep theirs)" : " (it does not require grad)");
    detail::materialize_grad(node_);
    return {node_->grad, node_->shape};
  }

  bool requires_grad() const { return checked()->requires_grad; }
  bool is_leaf() const { return checked()->is_leaf; }
  // Turns gradient tracking of a leaf on or off. On a parameter, off freezes it: optimizers skip it.
  basic_variable& set_requires_grad(bool on) {
    if (!checked()->is_leaf && !on)
      fail("Variable::set_requires_grad: only a leaf can stop requiring grad; use detach() on a computed value");
    node_->requires_grad = on;
    return *this;
  }
  // Zeroes the gradient if there is one. The buffer stays allocated, so an optimizer's pointers stay valid; a leaf's
  // zeros are only written when something reads the gradient before a backward() has written it (as PyTorch's
  // set_to_none saves the fill, but the gradient still reads as zeros and optimizers still step on it).
  void zero_grad() const {
    if (!checked()->grad) return;
    if (detail::lazy_zero_grad(node_)) node_->grad_pending_zero = true;
    else detail::zero_values(node_->grad, numel());
  }
  // Allocates a zero gradient if there is none yet (registration does this for parameters).
  void ensure_grad() const {
    if (!checked()->grad) detail::allocate_grad(node_, true);
  }

  // Back-propagates from this one-element value (seeded with 1) into every leaf that requires grad, then frees the
  // graph it went through (as PyTorch without retain_graph); other graphs on this thread's tape stay usable. With
  // {.retain_graph = true} the graph stays, for a second backward through it (another loss sharing part of it, or
  // the same loss again).
  void backward(backward_options options = {}) const { backward_from_here(options, nullptr); }
  // The same, telling `listener` as each watched leaf's gradient becomes final (detail::gradient_ready_listener).
  void backward(detail::gradient_ready_listener<T>& listener, backward_options options = {}) const {
    backward_from_here(options, &listener);
  }

 private:
  void backward_from_here(backward_options options, detail::gradient_ready_listener<T>* listener) const {
    if (numel() != 1)
      fail("Variable::backward: expected a value with one element (a loss), found shape ", shape(),
           "; reduce it first, e.g. with nn::sum or nn::mean");
    if (!node_->requires_grad)
      fail("Variable::backward: the value does not require grad (no input of the ops that made it requires grad, "
           "or it was computed under no_grad)");
    if (node_->creator < 0) {
      if (node_->graph_freed)
        fail("Variable::backward: the graph that produced this value was already freed by an earlier backward()");
      detail::seed_gradient(node_);  // a leaf: no op made it (a graph that was freed failed above)
      if (listener)
        for (std::size_t i = 0; i < listener->watched_leaves().size(); ++i) listener->gradient_ready(i);
      return;
    }
    detail::tape<T>::instance().backward(node_, options.retain_graph, listener);
  }

 public:

  // A leaf sharing this value's storage, cut off from the graph (requires_grad false).
  basic_variable detach() const {
    auto* n = detail::make_node<T>(shape(), false, true, false);
    n->value = node_->value;
    n->storage_owner = node_;
    detail::retain(node_);
    return adopt(n);
  }

  node_type* node() const { return node_; }

 private:
  node_type* checked() const {
    if (!node_) fail("Variable: the handle is empty (default-constructed or moved from)");
    return node_;
  }
  node_type* node_ = nullptr;
};

using Variable = basic_variable<float>;

// How kiln::optim optimizers see a dynamic parameter (found by ADL): its value and gradient spans and its
// requires_grad flag as the trainable switch, and its pending-zero flag for a lazy zero_grad. The gradient must
// already exist (parameters get one at registration).
template <class T>
optim::parameter_slot<T> as_parameter_slot(const basic_variable<T>& v) {
  v.ensure_grad();
  auto* n = v.node();
  return {n->value, n->grad, n->shape.numel(), &n->requires_grad,
          detail::lazy_zero_grad(n) ? &n->grad_pending_zero : nullptr};
}

namespace detail {

// A variable's value to fill from the host (the modules' initialisers): on the CPU policy the value itself; on a GPU
// policy a host copy, which write_back() copies to the device. An empty handle gives an empty span.
template <class T>
class host_values {
 public:
  explicit host_values(const basic_variable<T>& v) : variable_(v) {
    if constexpr (!dynamic_policy::host_accessible) {
      if (!v.defined()) return;
      copy_.resize(static_cast<std::size_t>(v.numel()));
      copy_values_to_host(static_cast<const T*>(v.data()), copy_.data(), v.numel());
    }
  }
  std::span<T> span() {
    if (!variable_.defined()) return {};
    if constexpr (dynamic_policy::host_accessible)
      return std::span<T>(variable_.data(), static_cast<std::size_t>(variable_.numel()));
    return std::span<T>(copy_);
  }
  void write_back() {
    if constexpr (!dynamic_policy::host_accessible)
      if (variable_.defined()) copy_values_from_host(copy_.data(), variable_.data(), variable_.numel());
  }

 private:
  basic_variable<T> variable_;
  std::vector<T> copy_;
};

}  // namespace detail

// The number of entries on this thread's tape (for tests and diagnostics).
template <class T = float>
std::size_t tape_size() {
  return detail::tape<T>::instance().size();
}
// Drops this thread's tape without back-propagating (graphs recorded so far can no longer be differentiated).
template <class T = float>
void clear_tape() {
  detail::tape<T>::instance().clear();
}

}  // namespace kiln::nn
