// Loss functions shared by both modes: each pairs a target type with a kernel that gives the loss and dL/doutput.
// forward_backward returns the loss on the host (a GPU policy waits for it); forward_backward_into leaves it in the
// policy's memory and never waits, for a training step captured into a CUDA graph.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/loss/class_weights.hpp"

namespace kiln::loss {

namespace detail {
// The kernel options of a classification loss, checked against the output's classes.
template <class Policy, class T>
kernels::class_loss_options<T> class_options(const char* loss, const class_weights& weight,
                                             const std::optional<std::int64_t>& ignore_index, float label_smoothing,
                                             index_t classes) {
  kernels::check_class_loss_options(loss, weight.size(), classes, label_smoothing);
  return {weight.template data<Policy, T>(), ignore_index.has_value(), ignore_index.value_or(0), T(label_smoothing)};
}

// forward_backward_into of the L1 family's losses.
template <class Policy, class T>
void l1_loss_into(const kernels::l1_variant<T>& f, const T* output, const T* target, T* doutput, index_t n,
                  reduction r, T* loss) {
  if constexpr (Policy::host_accessible) *loss = Policy::l1_loss(f, output, target, n, r, doutput);
  else Policy::l1_loss_on_device(f, output, target, n, r, doutput, loss);
}
}  // namespace detail

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

// Cross-entropy from logits (batch x classes) against integer class labels, through a fused, stable log-softmax, with
// PyTorch's options: per-class weights (the mean then divides by the summed weights of the rows' labels), a label whose
// rows count for nothing, and label smoothing. Without options it runs exactly the plain fused kernel.
struct cross_entropy {
  reduction reduce = reduction::mean;
  class_weights weight{};                      // one per class; empty: every class weighs 1
  std::optional<std::int64_t> ignore_index{};  // none by default (PyTorch's default, -100, is no valid label either)
  float label_smoothing = 0;                   // in [0, 1]
  static constexpr const char* name = "cross_entropy";
  template <class T>
  using target_type = std::int64_t;

  bool plain() const { return weight.empty() && !ignore_index && label_smoothing == 0; }

  template <class Policy, class T>
  T forward_backward(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes) const {
    if (plain()) return Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, doutput);
    return Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, options<Policy, T>(classes),
                                         doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes,
                             T* loss) const {
    if (plain()) {
      if constexpr (Policy::host_accessible)
        *loss = Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, doutput);
      else
        Policy::softmax_cross_entropy_on_device(output, labels, batch, classes, reduce, doutput, loss);
    } else if constexpr (Policy::host_accessible) {
      *loss = Policy::softmax_cross_entropy(output, labels, batch, classes, reduce, options<Policy, T>(classes),
                                            doutput);
    } else {
      Policy::softmax_cross_entropy_on_device(output, labels, batch, classes, reduce, options<Policy, T>(classes),
                                              doutput, loss);
    }
  }

 private:
  template <class Policy, class T>
  kernels::class_loss_options<T> options(index_t classes) const {
    return detail::class_options<Policy, T>(name, weight, ignore_index, label_smoothing, classes);
  }
};

// Negative log-likelihood of log-probabilities (batch x classes, e.g. the output of a LogSoftmax<1> layer) against
// integer class labels, as PyTorch's nll_loss, with its per-class weights and ignored label. LogSoftmax then nll is
// cross_entropy.
struct nll {
  reduction reduce = reduction::mean;
  class_weights weight{};                      // one per class; empty: every class weighs 1
  std::optional<std::int64_t> ignore_index{};  // none by default
  static constexpr const char* name = "nll";
  template <class T>
  using target_type = std::int64_t;

  template <class Policy, class T>
  T forward_backward(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes) const {
    return Policy::nll(output, labels, batch, classes, reduce, options<Policy, T>(classes), doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const std::int64_t* labels, T* doutput, index_t batch, index_t classes,
                             T* loss) const {
    if constexpr (Policy::host_accessible)
      *loss = Policy::nll(output, labels, batch, classes, reduce, options<Policy, T>(classes), doutput);
    else
      Policy::nll_on_device(output, labels, batch, classes, reduce, options<Policy, T>(classes), doutput, loss);
  }

 private:
  template <class Policy, class T>
  kernels::class_loss_options<T> options(index_t classes) const {
    return detail::class_options<Policy, T>("nll_loss", weight, ignore_index, 0, classes);
  }
};

// Mean absolute error against real-valued targets of the output's shape (PyTorch's l1_loss; the gradient at a zero
// difference is 0).
struct l1 {
  reduction reduce = reduction::mean;
  static constexpr const char* name = "l1";
  template <class T>
  using target_type = T;

  template <class Policy, class T>
  T forward_backward(const T* output, const T* target, T* doutput, index_t batch, index_t row_size) const {
    return Policy::l1_loss(kernels::l1_variant<T>::l1(), output, target, batch * row_size, reduce, doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const T* target, T* doutput, index_t batch, index_t row_size,
                             T* loss) const {
    detail::l1_loss_into<Policy>(kernels::l1_variant<T>::l1(), output, target, doutput, batch * row_size, reduce,
                                 loss);
  }
};

// Smooth L1 (PyTorch's smooth_l1_loss): quadratic where |output - target| < beta, linear beyond; beta >= 0.
struct smooth_l1 {
  reduction reduce = reduction::mean;
  float beta = 1;
  static constexpr const char* name = "smooth_l1";
  template <class T>
  using target_type = T;

  template <class Policy, class T>
  T forward_backward(const T* output, const T* target, T* doutput, index_t batch, index_t row_size) const {
    return Policy::l1_loss(kernels::l1_variant<T>::smooth_l1(T(beta)), output, target, batch * row_size, reduce,
                           doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const T* target, T* doutput, index_t batch, index_t row_size,
                             T* loss) const {
    detail::l1_loss_into<Policy>(kernels::l1_variant<T>::smooth_l1(T(beta)), output, target, doutput,
                                 batch * row_size, reduce, loss);
  }
};

// Huber (PyTorch's huber_loss, Keras' Huber): quadratic where |output - target| < delta, linear beyond; delta > 0.
struct huber {
  reduction reduce = reduction::mean;
  float delta = 1;
  static constexpr const char* name = "huber";
  template <class T>
  using target_type = T;

  template <class Policy, class T>
  T forward_backward(const T* output, const T* target, T* doutput, index_t batch, index_t row_size) const {
    return Policy::l1_loss(kernels::l1_variant<T>::huber(T(delta)), output, target, batch * row_size, reduce,
                           doutput);
  }
  template <class Policy, class T>
  void forward_backward_into(const T* output, const T* target, T* doutput, index_t batch, index_t row_size,
                             T* loss) const {
    detail::l1_loss_into<Policy>(kernels::l1_variant<T>::huber(T(delta)), output, target, doutput, batch * row_size,
                                 reduce, loss);
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

// Keras' names for the same losses (Keras' Huber is loss::huber). Not constexpr: the class losses hold weights.
inline const cross_entropy sparse_categorical_crossentropy{};
inline constexpr mse mean_squared_error{};
inline constexpr bce_with_logits binary_crossentropy_from_logits{};
inline constexpr l1 mean_absolute_error{};

}  // namespace kiln::loss
