// Per-class weights of a classification loss (PyTorch's `weight` of cross_entropy and nll_loss), as the static-mode
// loss structs hold them: `loss::cross_entropy{.weight = {1, 2, 0.5}}`.
#pragma once

#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"

namespace kiln::loss {

namespace detail {
// One address per (policy, element type): the key of a class_weights copy.
template <class Policy, class T>
inline constexpr char weights_copy_key = 0;
}  // namespace detail

// The weights, given once on the host, and a copy in each policy's memory (in its element type), made on first use
// and then kept, shared by every copy of the loss: a training step captured into a CUDA graph reads the same device
// buffer at each replay, and no step after the first uploads anything. As with Adam's state, run one step before
// capturing a graph. The weights cannot change after construction (a kept copy would go stale); make a new loss.
class class_weights {
 public:
  class_weights() = default;
  class_weights(std::initializer_list<float> values) : class_weights(std::vector<float>(values)) {}
  class_weights(std::vector<float> values)  // NOLINT: implicit, so that `.weight = w` reads naturally
      : state_(values.empty() ? nullptr : std::make_shared<state>(std::move(values))) {}

  bool empty() const { return !state_; }
  index_t size() const { return state_ ? static_cast<index_t>(state_->values.size()) : 0; }
  std::span<const float> values() const {
    return state_ ? std::span<const float>(state_->values) : std::span<const float>();
  }

  // The weights as T in Policy's memory (null when empty), valid as long as this object or a copy of it lives.
  template <class Policy, class T>
  const T* data() const {
    if (!state_) return nullptr;
    const void* key = &detail::weights_copy_key<Policy, T>;
    std::lock_guard lock(state_->mutex);
    for (const auto& c : state_->copies)
      if (c.key == key) return static_cast<const T*>(c.data);
    using buffer = typename Policy::template buffer<T>;
    const std::vector<T> converted(state_->values.begin(), state_->values.end());
    auto copy = std::make_shared<buffer>(size());
    Policy::upload(converted.data(), copy->data(), size());
    state_->copies.push_back({key, copy, copy->data()});
    return copy->data();
  }

 private:
  struct policy_copy {
    const void* key;
    std::shared_ptr<void> owner;  // the policy's buffer
    const void* data;
  };
  struct state {
    explicit state(std::vector<float> v) : values(std::move(v)) {}
    std::vector<float> values;
    std::mutex mutex;
    std::vector<policy_copy> copies;
  };
  std::shared_ptr<state> state_;
};

}  // namespace kiln::loss
