// Loss functions shared by both modes: each pairs a target type with a kernel that gives the loss and dL/doutput.
// forward_backward returns the loss on the host (a GPU policy waits for it); forward_backward_into leaves it in the
// policy's memory and never waits, for a training step captured into a CUDA graph.
#pragma once

#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/loss.hpp"

namespace kiln::loss {

// Mean squared error against real-valued targets of the output's shape.
struct mse {
  reduction reduce = reduction::mean;
  static constexpr const char* name = "mse";
  template <class T>
  using target_type = T;

  template <class Policy, class T>
  T forward_backward(const T* output, const T* target, T* doutput, index_t batch, index_t row_size) const {
    return Policy::mse(output, target, batch * row_size, reduce, doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const T* target, T* doutput, index_t batch, index_t row_size,
                             T* loss) const {
    if constexpr (Policy::host_accessible) *loss = Policy::mse(output, target, batch * row_size, reduce, doutput);
    else Policy::mse_on_device(output, target, batch * row_size, reduce, doutput, loss);
  }
};

// Cross-entropy from logits (batch x classes) against integer class labels, through a fused, stable log-softmax.
struct cross_entropy {
  reduction reduce = reduction::mean;
  static constexpr const char* name = "cross_entropy";
  template <class T>
  using target_type = std::int64_t;

  template <class Policy, class T>
  T forward_backward(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes) const {
    return Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes,
                             T* loss) const {
    if constexpr (Policy::host_accessible)
      *loss = Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, doutput);
    else
      Policy::softmax_cross_entropy_on_device(output, labels, batch, classes, reduce, doutput, loss);
  }
};

// Binary cross-entropy from logits against targets in [0, 1], computed stably.
struct bce_with_logits {
  reduction reduce = reduction::mean;
  static constexpr const char* name = "bce_with_logits";
  template <class T>
  using target_type = T;

  template <class Policy, class T>
  T forward_backward(const T* output, const T* target, T* doutput, index_t batch, index_t row_size) const {
    return Policy::bce_with_logits(output, target, batch * row_size, reduce, doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const T* target, T* doutput, index_t batch, index_t row_size,
                             T* loss) const {
    if constexpr (Policy::host_accessible)
      *loss = Policy::bce_with_logits(output, target, batch * row_size, reduce, doutput);
    else
      Policy::bce_with_logits_on_device(output, target, batch * row_size, reduce, doutput, loss);
  }
};

// Keras' names for the same losses.
inline constexpr cross_entropy sparse_categorical_crossentropy{};
inline constexpr mse mean_squared_error{};
inline constexpr bce_with_logits binary_crossentropy_from_logits{};

}  // namespace kiln::loss
