// BatchNorm1d / BatchNorm2d (PyTorch's): per-channel normalisation of (batch, channels[, length]) or (batch,
// channels, height, width) data. Training normalises with the batch statistics (biased variance) and updates the
// running statistics (unbiased variance) with momentum; evaluation normalises with the running statistics.
// running_mean, running_var and num_batches_tracked are buffers (saved, never trained); weight and bias parameters.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

// The running statistics of one batch-norm layer: running_mean (C), running_var (C), num_batches_tracked (1), one
// after the other (static mode's buffer slice, or three dynamic buffers).
template <class T>
struct batch_norm_state {
  T* running_mean = nullptr;
  T* running_var = nullptr;
  T* num_batches_tracked = nullptr;
};

// y = gamma (x - mean) invstd + beta per channel. save_mean / save_invstd (C each) receive the statistics used,
// for the backward. In training the batch statistics are used and state is updated (when its pointers are set);
// in evaluation state's running statistics are used.
template <class Policy, class T>
void batch_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                        const batch_norm_state<T>& state, index_t batch, index_t channels, index_t spatial, T eps,
                        T momentum, bool training) {
  if (training) {
    // As PyTorch: one value per channel has no spread to normalise by, and its unbiased variance would divide by 0.
    if (batch * spatial < 2)
      fail("BatchNorm: expected more than 1 value per channel when training, found ", batch, " sample",
           batch == 1 ? "" : "s", " of ", spatial, " value", spatial == 1 ? "" : "s", " per channel");
    Policy::batch_norm_forward_train(x, gamma, beta, y, save_mean, save_invstd, state.running_mean, state.running_var,
                                     batch, channels, spatial, eps, momentum);
    if (state.num_batches_tracked) Policy::batch_norm_count_batch(state.num_batches_tracked);
  } else {
    Policy::batch_norm_forward_eval(x, gamma, beta, y, save_mean, save_invstd, state.running_mean, state.running_var,
                                    batch, channels, spatial, eps);
  }
}
// dx (overwritten, skipped when null), dgamma and dbeta (added with accumulate) from the saved statistics; training
// says whether the forward used batch statistics.
template <class Policy, class T>
void batch_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta, const T* save_mean,
                         const T* save_invstd, index_t batch, index_t channels, index_t spatial, bool training,
                         bool accumulate) {
  Policy::batch_norm_backward(x, gamma, dy, dx, dgamma, dbeta, save_mean, save_invstd, batch, channels, spatial,
                              training, accumulate);
}
// PyTorch's initial values: weight 1, bias 0; running mean 0, running variance 1, no batches tracked.
template <class T>
void batch_norm_init(std::span<T> weight, std::span<T> bias) {
  for (T& v : weight) v = T(1);
  for (T& v : bias) v = T(0);
}
template <class T>
void batch_norm_init_buffers(T* buffers, index_t channels) {
  for (index_t c = 0; c < channels; ++c) {
    buffers[c] = T(0);
    buffers[channels + c] = T(1);
  }
  buffers[2 * channels] = T(0);
}

// The static layer behind BatchNorm1d (TwoD false: inputs (C,) or (C, L)) and BatchNorm2d (inputs (C, H, W)).
template <bool TwoD, double Momentum, double Eps, bool Affine>
struct batch_norm_layer {
  static_assert(Momentum >= 0 && Momentum <= 1 && Eps > 0, "kiln::BatchNorm: momentum in [0, 1] and eps > 0");
  static constexpr const char* name = TwoD ? "BatchNorm2d" : "BatchNorm1d";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = TwoD ? In::rank == 3 : (In::rank == 1 || In::rank == 2);
  static constexpr const char* requirement =
      TwoD ? "a (channels, height, width) input" : "a (channels,) or (channels, length) input";

  template <class In>
  struct bind {
    static constexpr index_t channels = In::rank >= 1 ? In::extents[0] : 1;
    static constexpr index_t spatial = In::size / channels;
    using output = In;
    static constexpr index_t param_count = Affine ? 2 * channels : 0;
    static constexpr index_t buffer_count = 2 * channels + 1;
    // The statistics the forward used (mean, invstd): 2C in all, which one sample's share always covers.
    static constexpr index_t scratch_per_sample = 2 * channels;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator&) {
      if constexpr (Affine) batch_norm_init<T>({params, channels}, {params + channels, channels});
    }
    template <class T>
    static void init_buffers(T* buffers) {
      batch_norm_init_buffers(buffers, channels);
    }
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      batch_norm_state<T> state{buffers, buffers + channels, buffers + 2 * channels};
      batch_norm_forward<Policy>(x, Affine ? params : nullptr, Affine ? params + channels : nullptr, y, scratch,
                                 scratch + channels, state, ctx.batch, channels, spatial, T(Eps), T(Momentum),
                                 ctx.training);
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      batch_norm_backward<Policy>(x, Affine ? params : nullptr, dy, dx, Affine ? dparams : nullptr,
                                  Affine ? dparams + channels : nullptr, scratch, scratch + channels, ctx.batch,
                                  channels, spatial, ctx.training, false);
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      if constexpr (Affine) return {{"weight", shape{channels}, 0}, {"bias", shape{channels}, channels}};
      else return {};
    }
    static std::vector<static_parameter_info> buffer_tensors() {
      return {{"running_mean", shape{channels}, 0},
              {"running_var", shape{channels}, channels},
              {"num_batches_tracked", shape{}, 2 * channels}};
    }
    static std::string description() { return name; }
  };
};

// Batch normalisation of (C,) or (C, L) samples (PyTorch's BatchNorm1d(C, eps, momentum, affine)).
template <double Momentum = 0.1, double Eps = 1e-5, bool Affine = true>
struct BatchNorm1d : batch_norm_layer<false, Momentum, Eps, Affine> {};
// Batch normalisation of (C, H, W) samples (PyTorch's BatchNorm2d).
template <double Momentum = 0.1, double Eps = 1e-5, bool Affine = true>
struct BatchNorm2d : batch_norm_layer<true, Momentum, Eps, Affine> {};

}  // namespace kiln
