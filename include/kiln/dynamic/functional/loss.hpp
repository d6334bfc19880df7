// Losses: mse_loss, cross_entropy (fused softmax + negative log-likelihood), binary_cross_entropy_with_logits. Each
// calls the policy's fused loss kernel once, as static mode does: when the graph is recorded the kernel also writes
// dL/dinput (for an upstream gradient of 1) into a saved buffer, and backward hands that buffer on (scaled when the
// loss itself was scaled before backward()).
#pragma once

#include <cstdint>
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

}  // namespace detail

// reduce((input - target)^2) with reduction mean (default) or sum. Both operands may require grad.
template <class T>
basic_variable<T> mse_loss(const basic_variable<T>& input, const basic_variable<T>& target,
                           reduction r = reduction::mean) {
  auto* in = detail::node_of(input, "mse_loss");
  auto* tg = detail::node_of(target, "mse_loss");
  if (in->shape != tg->shape)
    fail("mse_loss: expected input and target of the same shape, found ", in->shape, " and ", tg->shape);
  bool record = detail::should_record<T>({in, tg});
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
  auto* in = detail::node_of(logits, "cross_entropy");
  if (in->shape.rank() != 2) fail("cross_entropy: expected logits of shape [batch, classes], found ", in->shape);
  index_t rows = in->shape[0], classes = in->shape[1];
  if (static_cast<index_t>(labels.size()) != rows)
    fail("cross_entropy: expected ", rows, " labels for logits of shape ", in->shape, ", found ", labels.size());
  if (rows == 0) fail("cross_entropy: expected at least one row, found logits of shape ", in->shape);
  bool record = detail::should_record<T>({in});
  if constexpr (!dynamic_policy::host_accessible) {
    // The labels are host memory, checked here as the CPU kernel checks them, then uploaded: the device kernel that
    // leaves the loss on the device (no wait) cannot report a bad label.
    for (index_t i = 0; i < rows; ++i)
      if (labels[static_cast<std::size_t>(i)] < 0 || labels[static_cast<std::size_t>(i)] >= classes)
        fail("cross_entropy: expected labels in [0, ", classes, "), found ", labels[static_cast<std::size_t>(i)],
             " at row ", i);
    detail::scratch_buffer<std::int64_t> device_labels(rows);
    detail::copy_values_from_host(labels.data(), device_labels.data(), rows);
    return detail::fused_loss<T>(in, nullptr, T(0), record, [&](T* grad, T* loss) {
      using P = typename detail::loss_policy<T>::type;
      P::softmax_cross_entropy_on_device(in->value, device_labels.data(), rows, classes, r, grad, loss);
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
  return detail::fused_loss<T>(in, nullptr, T(0), record, [&](T* grad, T* loss) {
    using P = typename detail::loss_policy<T>::type;
    if constexpr (P::host_accessible)
      *loss = P::bce_with_logits(in->value, tg->value, in->shape.numel(), r, grad);
    else
      P::bce_with_logits_on_device(in->value, tg->value, in->shape.numel(), r, grad, loss);
  });
}

}  // namespace kiln::nn
