// Batch normalisation through cuDNN: ForwardTraining, ForwardInference and Backward. x is seen as (batch, channels,
// spatial, 1): CUDNN_BATCHNORM_SPATIAL normalises each channel over batch and spatial (BatchNorm2d, and BatchNorm1d
// on (N, C, L)); with spatial = 1 (BatchNorm1d on (N, C)) the statistics are per activation, and cuDNN's
// PER_ACTIVATION mode computes the same numbers. cuDNN's running variance is the unbiased batch variance, as the CPU's
// and PyTorch's (tests/cuda/test_cuda_cnn.cu checks it); its saved statistics are (mean, 1/sqrt(var + eps)), the
// CPU's save_mean / save_invstd, so either backward can follow either forward. num_batches_tracked is counted by the
// layer through batch_norm_count_batch, as on the CPU.
// kiln's CUDA kernels run instead where cuDNN cannot: a single value per channel (the unbiased variance divides by
// zero), only one of the running statistics given, extents beyond int, no dx wanted, or a backward through fixed
// (evaluation) statistics, which cuDNN's backward does not offer.
#pragma once

#include "kiln/kernels/cuda/normalization.cuh"
#include "kiln/kernels/cudnn/common.cuh"

namespace kiln::kernels::cudnn {

namespace detail {

inline cudnnBatchNormMode_t batch_norm_mode(index_t spatial) {
  return spatial == 1 ? CUDNN_BATCHNORM_PER_ACTIVATION : CUDNN_BATCHNORM_SPATIAL;
}

// A device array of at least n values of T set to value, kept for the process's life: the scale (ones) and shift
// (zeros) of a batch norm without an affine transform, or scratch for gradients nobody asked for (cuDNN needs all).
template <class T>
T* filled_array(index_t n, int slot, T value) {
  static std::mutex mutex;
  static auto* arrays = new std::map<int, kiln::cuda::device_buffer<T>>();
  std::lock_guard lock(mutex);
  auto& buffer = (*arrays)[slot];
  if (buffer.size() < n) {
    buffer = kiln::cuda::device_buffer<T>(n);
    const typename blend<T>::type v = static_cast<typename blend<T>::type>(value);
    KILN_CUDNN_CHECK(cudnnSetTensor(kiln::cuda::cudnn_handle(), tensor_4d<T>(1, n, 1, 1), buffer.data(), &v));
  }
  return buffer.data();
}
template <class T>
const T* ones(index_t n) {
  return filled_array<T>(n, 0, T(1));
}
template <class T>
const T* zeros(index_t n) {
  return filled_array<T>(n, 1, T(0));
}
// Gradient scratch for dgamma (slot 2) and dbeta (slot 3); its contents are never read.
template <class T>
T* gradient_scratch(index_t n, int which) {
  return filled_array<T>(n, 2 + which, T(0));
}

template <class T>
__global__ void invstd_of_variance_kernel(const T* running_mean, const T* running_var, T* save_mean, T* save_invstd,
                                          index_t channels, T eps) {
  using S = kernels::cuda::detail::cuda_sum_type<T>;
  for (index_t c = kernels::cuda::detail::global_thread(); c < channels; c += kernels::cuda::detail::global_threads()) {
    save_mean[c] = running_mean[c];
    save_invstd[c] = static_cast<T>(1 / sqrt(static_cast<S>(running_var[c]) + eps));
  }
}

inline bool cudnn_batch_norm_fits(index_t batch, index_t channels, index_t spatial) {
  return batch * spatial > 1 && fits_int({batch, channels, spatial});
}

}  // namespace detail

// The batch-norm kernels policy::cudnn replaces (device pointers; the CPU's signatures and semantics).
struct batch_norm_kernels {
  template <class T>
  static void batch_norm_forward_train(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                       T* running_mean, T* running_var, index_t batch, index_t channels,
                                       index_t spatial, T eps, T momentum) {
    if (!detail::cudnn_batch_norm_fits(batch, channels, spatial) ||
        (running_mean == nullptr) != (running_var == nullptr)) {
      kernels::cuda::normalization_kernels::batch_norm_forward_train(x, gamma, beta, y, save_mean, save_invstd,
                                                                     running_mean, running_var, batch, channels,
                                                                     spatial, eps, momentum);
      return;
    }
    using B = detail::blend<T>;
    auto data = detail::tensor_4d<T>(batch, channels, spatial, 1);
    auto stats = detail::tensor_4d<T>(1, channels, 1, 1);
    // running = (1 - factor) running + factor batch: the factor is the momentum.
    KILN_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        kiln::cuda::cudnn_handle(), detail::batch_norm_mode(spatial), &B::one, &B::zero, data, x, data, y, stats,
        gamma ? gamma : detail::ones<T>(channels), beta ? beta : detail::zeros<T>(channels), double(momentum),
        running_mean, running_var, double(eps), save_mean, save_invstd));
  }

  template <class T>
  static void batch_norm_forward_eval(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                      const T* running_mean, const T* running_var, index_t batch, index_t channels,
                                      index_t spatial, T eps) {
    if (batch < 1 || !detail::fits_int({batch, channels, spatial})) {
      kernels::cuda::normalization_kernels::batch_norm_forward_eval(x, gamma, beta, y, save_mean, save_invstd,
                                                                    running_mean, running_var, batch, channels,
                                                                    spatial, eps);
      return;
    }
    using B = detail::blend<T>;
    auto data = detail::tensor_4d<T>(batch, channels, spatial, 1);
    auto stats = detail::tensor_4d<T>(1, channels, 1, 1);
    KILN_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        kiln::cuda::cudnn_handle(), detail::batch_norm_mode(spatial), &B::one, &B::zero, data, x, data, y, stats,
        gamma ? gamma : detail::ones<T>(channels), beta ? beta : detail::zeros<T>(channels), running_mean,
        running_var, double(eps)));
    // The statistics used, saved for the backward as the CPU saves them.
    kernels::cuda::detail::launch_elementwise(channels, detail::invstd_of_variance_kernel<T>, running_mean,
                                              running_var, save_mean, save_invstd, channels, eps);
  }

  template <class T>
  static void batch_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta,
                                  const T* mean, const T* invstd, index_t batch, index_t channels, index_t spatial,
                                  bool batch_statistics, bool accumulate) {
    if (!batch_statistics || !dx || !detail::cudnn_batch_norm_fits(batch, channels, spatial)) {
      kernels::cuda::normalization_kernels::batch_norm_backward(x, gamma, dy, dx, dgamma, dbeta, mean, invstd, batch,
                                                                channels, spatial, batch_statistics, accumulate);
      return;
    }
    using B = detail::blend<T>;
    auto data = detail::tensor_4d<T>(batch, channels, spatial, 1);
    auto stats = detail::tensor_4d<T>(1, channels, 1, 1);
    // The saved statistics are given, so cuDNN does not recompute them and the epsilon argument goes unused (the
    // saved invstd already holds the forward's eps); 1e-5 only satisfies the argument check.
    KILN_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        kiln::cuda::cudnn_handle(), detail::batch_norm_mode(spatial), &B::one, &B::zero, &B::one,
        B::factor(accumulate), data, x, data, dy, data, dx, stats,
        gamma ? gamma : detail::ones<T>(channels), dgamma ? dgamma : detail::gradient_scratch<T>(channels, 0),
        dbeta ? dbeta : detail::gradient_scratch<T>(channels, 1), 1e-5, mean, invstd));
  }
};

}  // namespace kiln::kernels::cudnn
