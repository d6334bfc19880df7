// nn::Sequential: modules applied in order, built from a list and edited at run time (push_back, insert, erase).
// Children are named "0", "1", ... as in PyTorch, so parameters are "1.weight" and so on; an error from a child is
// rethrown with its index in front ("Sequential[1] Linear(in_features=784, out_features=128): ...").
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

template <class T>
class basic_sequential;

namespace detail {
template <class M, class T>
struct is_module_arg : std::is_base_of<basic_module<T>, std::remove_cvref_t<M>> {};
template <class M, class T>
struct is_module_arg<std::shared_ptr<M>, T> : std::is_base_of<basic_module<T>, M> {};
template <class M, class T>
concept module_arg = is_module_arg<std::remove_cvref_t<M>, T>::value;
template <class M, class T>
concept sequential_itself = std::is_same_v<std::remove_cvref_t<M>, basic_sequential<T>>;
}  // namespace detail

template <class T>
class basic_sequential : public basic_module<T> {
 public:
  using module_ptr = typename basic_module<T>::module_ptr;

  basic_sequential() = default;
  // Sequential(nn::Flatten(), nn::Linear(784, 128), ...): modules by value (moved into shared ownership) or as
  // shared_ptrs (shared with the caller).
  template <class... M>
    requires(sizeof...(M) > 0 && (detail::module_arg<M, T> && ...) &&
             !(sizeof...(M) == 1 && (detail::sequential_itself<M, T> && ...)))
  explicit basic_sequential(M&&... modules) {
    (push_back(std::forward<M>(modules)), ...);
    this->restore_construction_order();
  }

  basic_variable<T> forward(const basic_variable<T>& x) override {
    auto& list = this->mutable_children();
    basic_variable<T> y = x;
    for (std::size_t i = 0; i < list.size(); ++i) {
      try {
        y = list[i].second->forward(y);
      } catch (const error& e) {
        fail("Sequential[", i, "] ", e.what());
      }
    }
    return y;
  }
  std::string name() const override { return "Sequential"; }

  template <class M>
    requires detail::module_arg<M, T>
  void push_back(M&& module) {
    insert(size(), std::forward<M>(module));
  }
  // Inserts before position index (0 <= index <= size()); later children are renumbered.
  template <class M>
    requires detail::module_arg<M, T>
  void insert(std::size_t index, M&& module) {
    if (index > size()) fail("Sequential::insert: expected a position in [0, ", size(), "], found ", index);
    auto& list = this->mutable_children();
    list.insert(list.begin() + static_cast<std::ptrdiff_t>(index), {std::string(), to_pointer(std::forward<M>(module))});
    renumber();
  }
  // Removes the child at index; later children are renumbered.
  void erase(std::size_t index) {
    if (index >= size()) fail("Sequential::erase: expected a position in [0, ", size(), "), found ", index);
    auto& list = this->mutable_children();
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(index));
    renumber();
  }
  std::size_t size() const { return this->named_children().size(); }
  bool empty() const { return size() == 0; }
  basic_module<T>& operator[](std::size_t index) const { return *at(index); }
  const module_ptr& at(std::size_t index) const {
    if (index >= size()) fail("Sequential: index ", index, " is out of range for ", size(), " modules");
    return this->named_children()[index].second;
  }

 private:
  template <class M>
  static module_ptr to_pointer(M&& module) {
    if constexpr (requires { module.get(); }) {
      if (!module) fail("Sequential: a null module pointer was given");
      return module_ptr(std::forward<M>(module));
    } else {
      return std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module));
    }
  }
  void renumber() {
    auto& list = this->mutable_children();
    for (std::size_t i = 0; i < list.size(); ++i) list[i].first = std::to_string(i);
  }
};

using Sequential = basic_sequential<float>;

}  // namespace kiln::nn
