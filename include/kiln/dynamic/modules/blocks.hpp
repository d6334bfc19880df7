// Graph blocks of dynamic mode, with the names a PyTorch model of the same nesting gives its parameters:
//   nn::Residual(body)            y = x + body(x)                      children "body"
//   nn::Residual(body, shortcut)  y = shortcut(x) + body(x)            children "body", "shortcut" (ResNet's downsample)
//   nn::Add(branch, branch, ...)  y = the branches' outputs summed     children "0", "1", ...
//   nn::Concat(dim, branch, ...)  y = the branches' outputs joined along dim (nn::cat)
// A body, shortcut or branch is any module; a chain of several is an nn::Sequential, whose own children are numbered,
// so a residual block's first convolution is "body.0.weight" and inside a model "1.body.0.weight". Sums broadcast
// (nn::add), so the shapes must match or broadcast; a body that changes the shape needs a shortcut that changes it the
// same way.
//   auto block = kiln::nn::Residual(kiln::nn::Sequential(kiln::nn::Linear(64, 64), kiln::nn::ReLU(),
//                                                        kiln::nn::Linear(64, 64)));
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/dynamic/modules/sequential.hpp"

namespace kiln::nn {

namespace detail {

template <class T, class M>
std::shared_ptr<basic_module<T>> module_pointer(M&& module) {
  if constexpr (requires { module.get(); }) {
    if (!module) fail("a null module pointer was given to a block");
    return std::shared_ptr<basic_module<T>>(std::forward<M>(module));
  } else {
    return std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module));
  }
}

}  // namespace detail

template <class T>
class basic_residual : public basic_module<T> {
 public:
  template <class Body>
    requires detail::module_arg<Body, T>
  explicit basic_residual(Body&& body) {
    body_ = this->register_module("body", detail::module_pointer<T>(std::forward<Body>(body)));
  }
  template <class Body, class Shortcut>
    requires(detail::module_arg<Body, T> && detail::module_arg<Shortcut, T>)
  basic_residual(Body&& body, Shortcut&& shortcut) {
    body_ = this->register_module("body", detail::module_pointer<T>(std::forward<Body>(body)));
    shortcut_ = this->register_module("shortcut", detail::module_pointer<T>(std::forward<Shortcut>(shortcut)));
    this->restore_construction_order();
  }

  basic_variable<T> forward(const basic_variable<T>& x) override {
    basic_variable<T> f = body_->forward(x);
    basic_variable<T> s = shortcut_ ? shortcut_->forward(x) : x;
    if (!(f.shape() == s.shape()))
      fail(this->describe(), ": the body gives shape ", f.shape(), " but the ", shortcut_ ? "shortcut" : "input",
           " has shape ", s.shape(), shortcut_ ? "; make the shortcut change the shape as the body does"
                                               : "; add a shortcut that changes the shape as the body does");
    return add(s, f);
  }
  std::string name() const override { return "Residual"; }
  basic_module<T>& body() const { return *body_; }
  bool has_shortcut() const { return shortcut_ != nullptr; }
  // The shortcut; only when has_shortcut().
  basic_module<T>& shortcut() const {
    if (!shortcut_) fail(this->describe(), ": this residual block has no shortcut (y = x + body(x))");
    return *shortcut_;
  }

 private:
  std::shared_ptr<basic_module<T>> body_, shortcut_;
};

template <class T>
class basic_add : public basic_module<T> {
 public:
  template <class... M>
    requires(sizeof...(M) > 0 && (detail::module_arg<M, T> && ...))
  explicit basic_add(M&&... branches) {
    (add_branch(std::forward<M>(branches)), ...);
    this->restore_construction_order();
  }
  basic_variable<T> forward(const basic_variable<T>& x) override {
    basic_variable<T> y;
    for (const auto& [name, branch] : this->named_children()) {
      basic_variable<T> b = branch->forward(x);
      try {
        y = y.defined() ? add(y, b) : b;
      } catch (const error& e) {
        fail(this->describe(), " branch ", name, ": ", e.what());
      }
    }
    return y;
  }
  std::string name() const override { return "Add"; }

 private:
  template <class M>
  void add_branch(M&& m) {
    this->register_module(std::to_string(this->named_children().size()), detail::module_pointer<T>(std::forward<M>(m)));
  }
};

template <class T>
class basic_concat : public basic_module<T> {
 public:
  template <class... M>
    requires(sizeof...(M) > 0 && (detail::module_arg<M, T> && ...))
  explicit basic_concat(int dim, M&&... branches) : dim_(dim) {
    (add_branch(std::forward<M>(branches)), ...);
    this->restore_construction_order();
  }
  basic_variable<T> forward(const basic_variable<T>& x) override {
    std::vector<basic_variable<T>> outputs;
    for (const auto& [name, branch] : this->named_children()) outputs.push_back(branch->forward(x));
    try {
      return cat(outputs, dim_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "Concat"; }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim_); }
  // The dim the branches' outputs are joined along, as given (PyTorch's numbering; negative counts from the end).
  int dim() const { return dim_; }

 private:
  template <class M>
  void add_branch(M&& m) {
    this->register_module(std::to_string(this->named_children().size()), detail::module_pointer<T>(std::forward<M>(m)));
  }
  int dim_;
};

using Residual = basic_residual<float>;
using Add = basic_add<float>;
using Concat = basic_concat<float>;

}  // namespace kiln::nn
