// Losses: mse_loss, cross_entropy (fused softmax + negative log-likelihood; with PyTorch's weight, ignore_index and
// label_smoothing), nll_loss, binary_cross_entropy_with_logits, l1_loss, smooth_l1_loss, huber_loss. Each calls the
// policy's fused loss kernel once, as static mode does: when the graph is recorded the kernel also writes dL/dinput
// (for an upstream gradient of 1) into a saved buffer, and backward hands that buffer on (scaled when the loss itself
// was scaled before backward()). With reduction::none (on the CPU policies) a loss keeps one value per element, or
// per row for cross_entropy and nll_loss, as PyTorch's reduction="none": backward then multiplies each element's (or
// row's) saved gradient by that element's upstream gradient.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kiln/dynamic/functional/common.hpp"
#include "kiln/kernels/cpu/loss.hpp"

namespace kiln::nn {

namespace detail {

// dynamic_policy, named through T so that kernels only a GPU policy has (the *_on_device losses) are looked up when
// an op is instantiated rather than where it is defined.
template <class T>
struct loss_policy {
  using type = dynamic_policy;
};

// in[0]: the input, in[1]: a real-valued target or null, in[2]: the saved dL/dinput. scalar: the target's sign
// (-1 for MSE, whose target gradient is the negated input gradient; 0 where the target gets none).
template <class T>
void saved_gradient_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  const T upstream = tape<T>::instance().scalar_gradient(e.out);
  const T* saved = e.in[2]->value;
  index_t n = e.in[2]->shape.numel();
  auto dx = grad_target_for(e.in[0]);
  if (dx.data) {
    if (upstream == T(1)) {
      if (dx.accumulate) P::accumulate(saved, dx.data, n);
      else P::copy(saved, dx.data, n);
    } else {
      write_or_add<P>(dx, n, [&](T* dst) { P::scale(saved, upstream, dst, n); });
    }
  }
  if (e.in[1] && e.scalar != T(0))
    write_or_add<P>(grad_target_for(e.in[1]), n, [&](T* dst) { P::scale(saved, upstream * e.scalar, dst, n); });
}

// Runs kernel(grad_or_null, loss), which writes the loss into the rank-0 output's value, and records the backward
// when needed.
template <class T, class Kernel>
basic_variable<T> fused_loss(variable_node<T>* input, variable_node<T>* target, T target_sign, bool record,
                             Kernel&& kernel) {
  auto y = make_output<T>(kiln::shape{}, record);
  if (!record) {
    kernel(static_cast<T*>(nullptr), y.data());
    return y;
  }
  auto saved = basic_variable<T>::adopt(make_node<T>(input->shape, false, true));
  kernel(saved.data(), y.data());
  tape<T>::instance().record(&saved_gradient_backward<T>, y.node(), input, target, saved.node(), target_sign);
  return y;
}

// reduction::none: backward multiplies each saved local gradient (in[2], the input's shape) by the upstream gradient
// of its element, or of its row where the output has one value per row. in[1] and scalar as above.
template <class T>
void unreduced_loss_backward(const tape_entry<T>& e) {
  using P = typename loss_policy<T>::type;
  const T* saved = e.in[2]->value;
  const T* upstream = e.out->grad;
  const index_t n = e.in[2]->shape.numel(), values = e.out->shape.numel();
  const auto input_gradient = [&](T* dst) {
    if (values == n) P::multiply(saved, upstream, dst, n);
    else P::scale_rows(saved, upstream, dst, values, values ? n / values : 0);
  };
  write_or_add<P>(grad_target_for(e.in[0]), n, input_gradient);
  if (e.in[1] && e.scalar != T(0))
    write_or_add<P>(grad_target_for(e.in[1]), n, [&](T* dst) {
      input_gradient(dst);
      P::scale(dst, e.scalar, dst, n);
    });
}

// reduction::none: kernel(losses, grad_or_null) writes the losses into the output (of out_shape) and, when the graph
// is recorded, each one's gradient with respect to its input element or row into a saved buffer. Host policies only:
// their kernels give the unreduced losses.
template <class T, class Kernel>
basic_variable<T> unreduced_loss(variable_node<T>* input, variable_node<T>* target, T target_sign, bool record,
                                 kiln::shape out_shape, Kernel&& kernel) {
  auto y = make_output<T>(out_shape, record);
  if (!record) {
    kernel(y.data(), static_cast<T*>(nullptr));
    return y;
  }
  auto saved = basic_variable<T>::adopt(make_node<T>(input->shape, false, true));
  kernel(y.data(), saved.data());
  tape<T>::instance().record(&unreduced_loss_backward<T>, y.node(), input, target, saved.node(), target_sign);
  return y;
}

// Where reduction::none is asked of a loss under a policy whose kernels do not give it.
[[noreturn]] inline void fail_unreduced_on_device(const char* op) {
  fail(op, ": reduction::none runs on the CPU policies only; ", dynamic_policy::name,
       " gives the mean or the sum (reduction::mean, reduction::sum)");
}

// The [batch, classes] input of a classification loss, checked against its labels: returns its node.
template <class T>
variable_node<T>* class_loss_input(const basic_variable<T>& input, std::span<const std::int64_t> labels,
                                   const char* op, const char* what) {
  auto* in = node_of(input, op);
  if (in->shape.rank() != 2) fail(op, ": expected ", what, " of shape [batch, classes], found ", in->shape);
  if (static_cast<index_t>(labels.size()) != in->shape[0])
    fail(op, ": expected ", in->shape[0], " labels for ", what, " of shape ", in->shape, ", found ", labels.size());
  if (in->shape[0] == 0) fail(op, ": expected at least one row, found ", what, " of shape ", in->shape);
  return in;
}

// The labels and class weights of a classification loss where its kernel reads them: the caller's own on a host
// policy; on a GPU, checked here (the kernel that leaves the loss on the device cannot report a bad label) and
// uploaded.
template <class T>
class class_loss_data {
 public:
  class_loss_data(const char* op, std::span<const std::int64_t> labels, index_t classes,
                  const kernels::class_loss_options<T>& o)
      : options_(o), labels_(labels.data()) {
    if constexpr (!dynamic_policy::host_accessible) {
      const auto rows = static_cast<index_t>(labels.size());
      kernels::check_class_labels(op, labels.data(), rows, classes, o);
      device_labels_.emplace(rows);
      copy_values_from_host(labels.data(), device_labels_->data(), rows);
      labels_ = device_labels_->data();
      if (o.weight) {
        device_weights_.emplace(classes);
        copy_values_from_host(o.weight, device_weights_->data(), classes);
        options_.weight = device_weights_->data();
      }
    }
  }
  const std::int64_t* labels() const { return labels_; }
  const kernels::class_loss_options<T>& options() const { return options_; }

 private:
  kernels::class_loss_options<T> options_;
  const std::int64_t* labels_;
  std::optional<scratch_buffer<std::int64_t>> device_labels_;
  std::optional<scratch_buffer<T>> device_weights_;
};

// A loss of the L1 family (l1_variant.hpp). Both operands may require grad: the target's gradient is the input's,
// negated.
template <class T>
basic_variable<T> l1_family_loss(const char* op, const basic_variable<T>& input, const basic_variable<T>& target,
                                 const kernels::l1_variant<T>& f, reduction r) {
  auto* in = node_of(input, op);
  auto* tg = node_of(target, op);
  if (in->shape != tg->shape)
    fail(op, ": expected input and target of the same shape, found ", in->shape, " and ", tg->shape);
  bool record = should_record<T>({in, tg});
  if (r == reduction::none) {
    if constexpr (loss_policy<T>::type::host_accessible)
      return unreduced_loss<T>(in, tg, T(-1), record, in->shape, [&](T* losses, T* grad) {
        loss_policy<T>::type::l1_loss_elements(f, in->value, tg->value, in->shape.numel(), losses, grad);
      });
    else
      fail_unreduced_on_device(op);
  }
  return fused_loss<T>(in, tg, T(-1), record, [&](T* grad, T* loss) {
    using P = typename loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::l1_loss(f, in->value, tg->value, in->shape.numel(), r, grad);
    else
      P::l1_loss_on_device(f, in->value, tg->value, in->shape.numel(), r, grad, loss);
  });
}

}  // namespace detail

// PyTorch's options of cross_entropy beyond the reduction. The defaults change nothing.
template <class T>
struct cross_entropy_options {
  reduction reduce = reduction::mean;
  std::span<const T> weight{};                 // one per class; empty: every class weighs 1. The mean then divides
                                               // by the summed weights of the rows' labels, as PyTorch's does
  std::optional<std::int64_t> ignore_index{};  // rows with this label count for nothing; none by default
  T label_smoothing = 0;                       // in [0, 1]: the target is (1 - s) one-hot + s uniform over the classes
};

// PyTorch's options of nll_loss beyond the reduction.
template <class T>
struct nll_options {
  reduction reduce = reduction::mean;
  std::span<const T> weight{};                 // one per class; empty: every class weighs 1
  std::optional<std::int64_t> ignore_index{};  // rows with this label count for nothing; none by default
};

// reduce((input - target)^2) with reduction mean (default), sum or none. Both operands may require grad.
template <class T>
basic_variable<T> mse_loss(const basic_variable<T>& input, const basic_variable<T>& target,
                           reduction r = reduction::mean) {
  auto* in = detail::node_of(input, "mse_loss");
  auto* tg = detail::node_of(target, "mse_loss");
  if (in->shape != tg->shape)
    fail("mse_loss: expected input and target of the same shape, found ", in->shape, " and ", tg->shape);
  bool record = detail::should_record<T>({in, tg});
  if (r == reduction::none) {
    if constexpr (detail::loss_policy<T>::type::host_accessible)
      return detail::unreduced_loss<T>(in, tg, T(-1), record, in->shape, [&](T* losses, T* grad) {
        detail::loss_policy<T>::type::mse_elements(in->value, tg->value, in->shape.numel(), losses, grad);
      });
    else
      detail::fail_unreduced_on_device("mse_loss");
  }
  return detail::fused_loss<T>(in, tg, T(-1), record, [&](T* grad, T* loss) {
    using P = typename detail::loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::mse(in->value, tg->value, in->shape.numel(), r, grad);
    else
      P::mse_on_device(in->value, tg->value, in->shape.numel(), r, grad, loss);
  });
}

// Cross-entropy of logits [batch, classes] against integer class labels [batch] in [0, classes), through a fused,
// stable log-softmax (PyTorch's F.cross_entropy with class indices).
template <class T>
basic_variable<T> cross_entropy(const basic_variable<T>& logits, std::span<const std::int64_t> labels,
                                reduction r = reduction::mean) {
  if (r == reduction::none) return cross_entropy(logits, labels, cross_entropy_options<T>{.reduce = r});
  auto* in = detail::class_loss_input(logits, labels, "cross_entropy", "logits");
  index_t rows = in->shape[0], classes = in->shape[1];
  bool record = detail::should_record<T>({in});
  if constexpr (!dynamic_policy::host_accessible) {
    const detail::class_loss_data<T> data("cross_entropy", labels, classes, {});
    return detail::fused_loss<T>(in, nullptr, T(0), record, [&](T* grad, T* loss) {
      using P = typename detail::loss_policy<T>::type;
      P::softmax_cross_entropy_on_device(in->value, data.labels(), rows, classes, r, grad, loss);
    });
  }
  return detail::fused_loss<T>(in, nullptr, T(0), record, [&](T* grad, T* loss) {
    *loss = dynamic_policy::softmax_cross_entropy(in->value, labels.data(), rows, classes, r, grad);
  });
}
template <class T>
basic_variable<T> cross_entropy(const basic_variable<T>& logits, const Tensor<std::int64_t>& labels,
                                reduction r = reduction::mean) {
  if (labels.rank() != 1)
    fail("cross_entropy: expected labels of shape [batch], found ", labels.shape());
  return cross_entropy(logits, labels.span(), r);
}

// Cross-entropy with PyTorch's weight, ignore_index and label_smoothing (cross_entropy_options); with none set it is
// the function above.
template <class T>
basic_variable<T> cross_entropy(const basic_variable<T>& logits, std::span<const std::int64_t> labels,
                                const cross_entropy_options<T>& o) {
  auto* in = detail::class_loss_input(logits, labels, "cross_entropy", "logits");
  const index_t rows = in->shape[0], classes = in->shape[1];
  kernels::check_class_loss_options("cross_entropy", static_cast<index_t>(o.weight.size()), classes,
                                    o.label_smoothing);
  const detail::class_loss_data<T> data(
      "cross_entropy", labels, classes,
      {o.weight.empty() ? nullptr : o.weight.data(), o.ignore_index.has_value(), o.ignore_index.value_or(0),
       o.label_smoothing});
  if (o.reduce == reduction::none) {
    if constexpr (detail::loss_policy<T>::type::host_accessible)
      return detail::unreduced_loss<T>(in, nullptr, T(0), detail::should_record<T>({in}), kiln::shape{rows},
                                       [&](T* losses, T* grad) {
                                         detail::loss_policy<T>::type::softmax_cross_entropy_rows(
                                             in->value, data.labels(), rows, classes, data.options(), losses, grad);
                                       });
    else
      detail::fail_unreduced_on_device("cross_entropy");
  }
  return detail::fused_loss<T>(in, nullptr, T(0), detail::should_record<T>({in}), [&](T* grad, T* loss) {
    using P = typename detail::loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::softmax_cross_entropy(in->value, data.labels(), rows, classes, o.reduce, data.options(), grad);
    else
      P::softmax_cross_entropy_on_device(in->value, data.labels(), rows, classes, o.reduce, data.options(), grad,
                                         loss);
  });
}
template <class T>
basic_variable<T> cross_entropy(const basic_variable<T>& logits, const Tensor<std::int64_t>& labels,
                                const cross_entropy_options<T>& o) {
  if (labels.rank() != 1) fail("cross_entropy: expected labels of shape [batch], found ", labels.shape());
  return cross_entropy(logits, labels.span(), o);
}

// Negative log-likelihood of log-probabilities [batch, classes] (e.g. log_softmax(x, 1)) against integer class labels
// [batch], as PyTorch's F.nll_loss: nll_loss(log_softmax(x, 1), labels) is cross_entropy(x, labels).
template <class T>
basic_variable<T> nll_loss(const basic_variable<T>& log_probs, std::span<const std::int64_t> labels,
                           const nll_options<T>& o) {
  auto* in = detail::class_loss_input(log_probs, labels, "nll_loss", "log-probabilities");
  const index_t rows = in->shape[0], classes = in->shape[1];
  kernels::check_class_loss_options("nll_loss", static_cast<index_t>(o.weight.size()), classes, 0);
  const detail::class_loss_data<T> data(
      "nll_loss", labels, classes,
      {o.weight.empty() ? nullptr : o.weight.data(), o.ignore_index.has_value(), o.ignore_index.value_or(0), T(0)});
  if (o.reduce == reduction::none) {
    if constexpr (detail::loss_policy<T>::type::host_accessible)
      return detail::unreduced_loss<T>(in, nullptr, T(0), detail::should_record<T>({in}), kiln::shape{rows},
                                       [&](T* losses, T* grad) {
                                         detail::loss_policy<T>::type::nll_rows(in->value, data.labels(), rows,
                                                                                classes, data.options(), losses, grad);
                                       });
    else
      detail::fail_unreduced_on_device("nll_loss");
  }
  return detail::fused_loss<T>(in, nullptr, T(0), detail::should_record<T>({in}), [&](T* grad, T* loss) {
    using P = typename detail::loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::nll(in->value, data.labels(), rows, classes, o.reduce, data.options(), grad);
    else
      P::nll_on_device(in->value, data.labels(), rows, classes, o.reduce, data.options(), grad, loss);
  });
}
template <class T>
basic_variable<T> nll_loss(const basic_variable<T>& log_probs, std::span<const std::int64_t> labels,
                           reduction r = reduction::mean) {
  return nll_loss(log_probs, labels, nll_options<T>{.reduce = r});
}
template <class T>
basic_variable<T> nll_loss(const basic_variable<T>& log_probs, const Tensor<std::int64_t>& labels,
                           const nll_options<T>& o) {
  if (labels.rank() != 1) fail("nll_loss: expected labels of shape [batch], found ", labels.shape());
  return nll_loss(log_probs, labels.span(), o);
}
template <class T>
basic_variable<T> nll_loss(const basic_variable<T>& log_probs, const Tensor<std::int64_t>& labels,
                           reduction r = reduction::mean) {
  return nll_loss(log_probs, labels, nll_options<T>{.reduce = r});
}

// reduce(|input - target|), PyTorch's l1_loss (mean absolute error); the gradient at a zero difference is 0.
template <class T>
basic_variable<T> l1_loss(const basic_variable<T>& input, const basic_variable<T>& target,
                          reduction r = reduction::mean) {
  return detail::l1_family_loss("l1_loss", input, target, kernels::l1_variant<T>::l1(), r);
}

// PyTorch's smooth_l1_loss: 0.5 d^2 / beta where |d| = |input - target| < beta, |d| - 0.5 beta elsewhere (beta >= 0;
// 0 gives l1_loss).
template <class T>
basic_variable<T> smooth_l1_loss(const basic_variable<T>& input, const basic_variable<T>& target,
                                 reduction r = reduction::mean, T beta = T(1)) {
  return detail::l1_family_loss("smooth_l1_loss", input, target, kernels::l1_variant<T>::smooth_l1(beta), r);
}

// PyTorch's huber_loss: 0.5 d^2 where |d| = |input - target| < delta, delta (|d| - 0.5 delta) elsewhere (delta > 0).
template <class T>
basic_variable<T> huber_loss(const basic_variable<T>& input, const basic_variable<T>& target,
                             reduction r = reduction::mean, T delta = T(1)) {
  return detail::l1_family_loss("huber_loss", input, target, kernels::l1_variant<T>::huber(delta), r);
}

// Binary cross-entropy from logits against targets in [0, 1] of the same shape, computed stably. The target gets no
// gradient (it is data); passing one that requires grad throws.
template <class T>
basic_variable<T> binary_cross_entropy_with_logits(const basic_variable<T>& logits, const basic_variable<T>& target,
                                                   reduction r = reduction::mean) {
  auto* in = detail::node_of(logits, "binary_cross_entropy_with_logits");
  auto* tg = detail::node_of(target, "binary_cross_entropy_with_logits");
  if (in->shape != tg->shape)
    fail("binary_cross_entropy_with_logits: expected logits and target of the same shape, found ", in->shape, " and ",
         tg->shape);
  if (tg->requires_grad && is_grad_enabled())
    fail("binary_cross_entropy_with_logits: the target requires grad, which is not supported; detach() it");
  bool record = detail::should_record<T>({in});
  if (r == reduction::none) {
    if constexpr (detail::loss_policy<T>::type::host_accessible)
      return detail::unreduced_loss<T>(in, nullptr, T(0), record, in->shape, [&](T* losses, T* grad) {
        detail::loss_policy<T>::type::bce_with_logits_elements(in->value, tg->value, in->shape.numel(), losses, grad);
      });
    else
      detail::fail_unreduced_on_device("binary_cross_entropy_with_logits");
  }
  return detail::fused_loss<T>(in, nullptr, T(0), record, [&](T* grad, T* loss) {
    using P = typename detail::loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::bce_with_logits(in->value, tg->value, in->shape.numel(), r, grad);
    else
      P::bce_with_logits_on_device(in->value, tg->value, in->shape.numel(), r, grad, loss);
  });
}

}  // namespace kiln::nn
