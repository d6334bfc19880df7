// What the two fused trainers (kiln::fused_mlp_trainer on the CPU, static/fused_mlp.hpp, and on CUDA,
// static/fused_mlp.cuh) share: the models they take (an input, Flatten where the input has more than one dimension,
// Dense<Hidden, ReLU>, Dense<Out>, both with biases), and the checks of their options and batches.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/fused_parameter.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/static/sequential.hpp"

namespace kiln {

// Trains a static MLP with one fused step per batch: see static/fused_mlp.hpp (CPU policies) and
// static/fused_mlp.cuh (CUDA policies).
template <class Net, bool OnHost = Net::host_accessible>
class fused_mlp_trainer;

namespace detail {

template <class Net>
struct fused_mlp_layout {
  static constexpr bool matches = false;
};
template <class Policy, class InputSpec, index_t Hidden, index_t Out>
struct fused_mlp_layout<Sequential<Policy, InputSpec, Flatten, Dense<Hidden, ReLU>, Dense<Out>>> {
  static constexpr bool matches = true;
  static constexpr index_t hidden = Hidden, out = Out;
};
template <class Policy, class InputSpec, index_t Hidden, index_t Out>
struct fused_mlp_layout<Sequential<Policy, InputSpec, Dense<Hidden, ReLU>, Dense<Out>>> {
  static constexpr bool matches = true;
  static constexpr index_t hidden = Hidden, out = Out;
};

// The sizes of a model that a fused trainer takes, and the compile-time checks both trainers make of it.
template <class Net>
struct fused_mlp_model {
  static_assert(fused_mlp_layout<Net>::matches,
                "kiln::fused_mlp_trainer: expected Sequential<Policy, Input<...>, Flatten, Dense<Hidden, ReLU>, "
                "Dense<Out>> (Flatten optional for a flat input)");
  static_assert(std::is_same_v<typename Net::value_type, float>, "kiln::fused_mlp_trainer: expected float values");
  static constexpr index_t in = Net::input_shape::size, hidden = fused_mlp_layout<Net>::hidden,
                           out = fused_mlp_layout<Net>::out;
};

// A fused step has no amsgrad, no L1/L2 regularisation and no gradient clipping: asking for them is an error rather
// than a silently different step. The hyper-parameters are checked as torch.optim.Adam checks them.
inline void check_fused_mlp_options(const optim::adam_options& o) {
  if (o.amsgrad || o.regularize.l1 != 0 || o.regularize.l2 != 0 || o.clip.norm != 0 || o.clip.value != 0)
    fail("fused_mlp_trainer: expected Adam without amsgrad, regularisation or clipping, found amsgrad ", o.amsgrad,
         ", l1 ", o.regularize.l1, ", l2 ", o.regularize.l2, ", clip norm ", o.clip.norm, ", clip value ",
         o.clip.value);
  if (!(o.lr >= 0) || !(o.eps >= 0) || !(o.weight_decay >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) ||
      !(o.beta2 >= 0 && o.beta2 < 1))
    fail("fused_mlp_trainer: expected lr, eps and weight decay >= 0 and betas in [0, 1), found lr ", o.lr, ", eps ",
         o.eps, ", weight decay ", o.weight_decay, ", betas ", o.beta1, " and ", o.beta2);
}

// AdamW's hyper-parameters as Adam's, for a trainer told to decouple the weight decay.
inline optim::adam_options adam_options_of(const optim::adamw_options& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
          .amsgrad = o.amsgrad, .regularize = o.regularize, .clip = o.clip};
}

// Points W1, b1, W2 and b2 (in this order in `targets`) at the model's parameters and gradients and at the same
// offsets of the trainer's moment buffers (each of the model's flat parameter size).
template <class Net>
void bind_fused_parameters(Net& net, float* exp_avg, float* exp_avg_sq, kernels::fused_parameter* const (&targets)[4]) {
  const auto tensors = Net::named_parameter_infos();
  if (tensors.size() != 4) fail("fused_mlp_trainer: expected 4 parameter tensors, found ", tensors.size());
  for (std::size_t i = 0; i < 4; ++i) {
    const index_t offset = tensors[i].offset;
    *targets[i] = {net.parameter_values().data() + offset, net.gradient_values().data() + offset, exp_avg + offset,
                   exp_avg_sq + offset};
  }
}

// The batch size of a step on x and labels, after checking their shapes against the model and that no layer is
// frozen (the fused step updates every parameter: a frozen layer would silently train).
template <class Net>
index_t check_fused_mlp_batch(const Net& net, tensor_view<const float> x, tensor_view<const std::int64_t> labels) {
  constexpr index_t in = Net::input_shape::size;
  const index_t batch = x.rank() > 0 ? x.extent(0) : 0;
  if (x.rank() != Net::input_shape::rank + 1 || batch < 1 || x.numel() != batch * in || batch > net.max_batch())
    fail("fused_mlp_trainer::train_step: expected a batch of 1 to ", net.max_batch(), " samples of ", in, " values (",
         Net::input_shape::rank, " dimensions each), found shape ", x.shape());
  if (labels.numel() != batch)
    fail("fused_mlp_trainer::train_step: expected ", batch, " labels, one per sample, found ", labels.numel());
  for (std::size_t layer = 0; layer < Net::layer_count; ++layer)
    if (net.is_frozen(layer))
      fail("fused_mlp_trainer::train_step: expected no frozen layer (the fused step updates them all), found layer ",
           layer, " frozen; train it with Sequential::train_step instead");
  return batch;
}

}  // namespace detail

}  // namespace kiln
