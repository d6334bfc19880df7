// Batch and layer normalisation on the GPU with the CPU's formulas (kernels/cpu/normalization.hpp): two-pass
// statistics summed in double for float data, biased variance to normalise, unbiased variance into the running
// variance, (mean, 1/sqrt(var + eps)) saved for the backward. One block per channel (batch norm) or row (layer norm);
// the block's partial sums combine in a fixed tree, so results are the same on every run.
#pragma once

#include "kiln/kernels/cuda/cnn_common.cuh"

namespace kiln::kernels::cuda {

namespace detail {

// The offset of element `at` of channel c when x is seen as (batch, channels, spatial).
__device__ inline index_t channel_offset(index_t at, index_t c, index_t channels, index_t spatial) {
  return ((at / spatial) * channels + c) * spatial + at % spatial;
}

// y = x * scale + shift over channel c with scale = gamma invstd and shift = beta - mean scale, as the CPU's
// normalize_channel.
template <class T>
__device__ void normalize_channel(const T* x, const T* gamma, const T* beta, T* y, index_t c, T mean, T invstd,
                                  index_t count, index_t channels, index_t spatial) {
  const T scale = gamma ? gamma[c] * invstd : invstd;
  const T shift = (beta ? beta[c] : T(0)) - mean * scale;
  for (index_t at = threadIdx.x; at < count; at += blockDim.x) {
    const index_t o = channel_offset(at, c, channels, spatial);
    y[o] = x[o] * scale + shift;
  }
}

template <class T>
__global__ void batch_norm_forward_train_kernel(const T* __restrict__ x, const T* gamma, const T* beta, T* y,
                                                T* save_mean, T* save_invstd, T* running_mean, T* running_var,
                                                index_t batch, index_t channels, index_t spatial, T eps, T momentum) {
  using S = cuda_sum_type<T>;
  const index_t c = blockIdx.x, count = batch * spatial;
  S total = 0, unused = 0;
  for (index_t at = threadIdx.x; at < count; at += blockDim.x) total += x[channel_offset(at, c, channels, spatial)];
  block_sum2(total, unused);
  const S mean = total / S(count);
  S squares = 0;
  for (index_t at = threadIdx.x; at < count; at += blockDim.x) {
    const S d = S(x[channel_offset(at, c, channels, spatial)]) - mean;
    squares += d * d;
  }
  block_sum2(squares, unused);
  const S var = squares / S(count);
  const T m = static_cast<T>(mean);
  const T invstd = static_cast<T>(1 / sqrt(var + S(eps)));
  if (threadIdx.x == 0) {
    save_mean[c] = m;
    save_invstd[c] = invstd;
    if (running_mean) running_mean[c] = (T(1) - momentum) * running_mean[c] + momentum * m;
    if (running_var) {
      const T unbiased = static_cast<T>(count > 1 ? squares / S(count - 1) : var);
      running_var[c] = (T(1) - momentum) * running_var[c] + momentum * unbiased;
    }
  }
  normalize_channel(x, gamma, beta, y, c, m, invstd, count, channels, spatial);
}

template <class T>
__global__ void batch_norm_forward_eval_kernel(const T* __restrict__ x, const T* gamma, const T* beta, T* y,
                                               T* save_mean, T* save_invstd, const T* running_mean,
                                               const T* running_var, index_t batch, index_t channels,
                                               index_t spatial, T eps) {
  using S = cuda_sum_type<T>;
  const index_t c = blockIdx.x;
  const T invstd = static_cast<T>(1 / sqrt(static_cast<S>(running_var[c]) + eps));
  if (threadIdx.x == 0) {
    save_mean[c] = running_mean[c];
    save_invstd[c] = invstd;
  }
  normalize_channel(x, gamma, beta, y, c, running_mean[c], invstd, batch * spatial, channels, spatial);
}

template <class T>
__global__ void batch_norm_backward_kernel(const T* __restrict__ x, const T* gamma, const T* __restrict__ dy, T* dx,
                                           T* dgamma, T* dbeta, const T* mean, const T* invstd, index_t batch,
                                           index_t channels, index_t spatial, bool batch_statistics,
                                           bool accumulate) {
  using S = cuda_sum_type<T>;
  const index_t c = blockIdx.x, count = batch * spatial;
  const T m = mean[c], is = invstd[c];
  S sum_dy = 0, sum_dy_xhat = 0;
  for (index_t at = threadIdx.x; at < count; at += blockDim.x) {
    const index_t o = channel_offset(at, c, channels, spatial);
    sum_dy += dy[o];
    sum_dy_xhat += S(dy[o]) * S((x[o] - m) * is);
  }
  block_sum2(sum_dy, sum_dy_xhat);
  if (threadIdx.x == 0) {
    if (dgamma) dgamma[c] = accumulate ? dgamma[c] + static_cast<T>(sum_dy_xhat) : static_cast<T>(sum_dy_xhat);
    if (dbeta) dbeta[c] = accumulate ? dbeta[c] + static_cast<T>(sum_dy) : static_cast<T>(sum_dy);
  }
  if (!dx) return;
  const T scale = (gamma ? gamma[c] : T(1)) * is;
  const T mean_dy = batch_statistics ? static_cast<T>(sum_dy / S(count)) : T(0);
  const T mean_dy_xhat = batch_statistics ? static_cast<T>(sum_dy_xhat / S(count)) : T(0);
  for (index_t at = threadIdx.x; at < count; at += blockDim.x) {
    const index_t o = channel_offset(at, c, channels, spatial);
    const T xhat = (x[o] - m) * is;
    dx[o] = scale * (dy[o] - mean_dy - xhat * mean_dy_xhat);
  }
}

template <class T>
__global__ void count_batch_kernel(T* num_batches_tracked) {
  *num_batches_tracked += T(1);
}

template <class T>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const T* gamma, const T* beta, T* y, T* save_mean,
                                          T* save_invstd, index_t cols, T eps) {
  using S = cuda_sum_type<T>;
  const index_t r = blockIdx.x;
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  S total = 0, unused = 0;
  for (index_t c = threadIdx.x; c < cols; c += blockDim.x) total += xr[c];
  block_sum2(total, unused);
  const S mean = total / S(cols);
  S squares = 0;
  for (index_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const S d = S(xr[c]) - mean;
    squares += d * d;
  }
  block_sum2(squares, unused);
  const T m = static_cast<T>(mean);
  const T is = static_cast<T>(1 / sqrt(squares / S(cols) + S(eps)));
  if (threadIdx.x == 0) {
    save_mean[r] = m;
    save_invstd[r] = is;
  }
  for (index_t c = threadIdx.x; c < cols; c += blockDim.x) {
    T v = (xr[c] - m) * is;
    if (gamma) v = v * gamma[c];
    if (beta) v = v + beta[c];
    yr[c] = v;
  }
}

// dx of one row per block: invstd (g - mean(g) - xhat mean(g xhat)) with g = gamma dy.
template <class T>
__global__ void layer_norm_backward_rows_kernel(const T* __restrict__ x, const T* gamma, const T* __restrict__ dy,
                                                T* dx, const T* mean, const T* invstd, index_t cols) {
  using S = cuda_sum_type<T>;
  const index_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const T* dyr = dy + r * cols;
  const T m = mean[r], is = invstd[r];
  S sum_g = 0, sum_g_xhat = 0;
  for (index_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T xhat = (xr[c] - m) * is;
    const T g = gamma ? dyr[c] * gamma[c] : dyr[c];
    sum_g += g;
    sum_g_xhat += S(g) * S(xhat);
  }
  block_sum2(sum_g, sum_g_xhat);
  const T mean_g = static_cast<T>(sum_g / S(cols)), mean_g_xhat = static_cast<T>(sum_g_xhat / S(cols));
  for (index_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T xhat = (xr[c] - m) * is;
    const T g = gamma ? dyr[c] * gamma[c] : dyr[c];
    dx[r * cols + c] = is * (g - mean_g - xhat * mean_g_xhat);
  }
}

// dgamma[c] (+)= sum over rows of dy xhat, dbeta[c] (+)= sum of dy: one thread per column, rows in order, as the CPU.
template <class T>
__global__ void layer_norm_backward_params_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* dgamma,
                                                  T* dbeta, const T* mean, const T* invstd, index_t rows,
                                                  index_t cols, bool accumulate) {
  for (index_t c = global_thread(); c < cols; c += global_threads()) {
    T g_sum = dgamma && accumulate ? dgamma[c] : T(0);
    T b_sum = dbeta && accumulate ? dbeta[c] : T(0);
    for (index_t r = 0; r < rows; ++r) {
      const T d = dy[r * cols + c];
      g_sum += d * ((x[r * cols + c] - mean[r]) * invstd[r]);
      b_sum += d;
    }
    if (dgamma) dgamma[c] = g_sum;
    if (dbeta) dbeta[c] = b_sum;
  }
}

}  // namespace detail

// The normalisation kernels of the CUDA policies (device pointers; same signatures and semantics as
// kernels::cpu::normalization_kernels). Batch norm sees x as (batch, channels, spatial); layer norm as (rows, cols).
struct normalization_kernels {
  template <class T>
  static void batch_norm_forward_train(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                       T* running_mean, T* running_var, index_t batch, index_t channels,
                                       index_t spatial, T eps, T momentum) {
    detail::launch_per_item(channels, detail::batch_norm_forward_train_kernel<T>, x, gamma, beta, y, save_mean,
                            save_invstd, running_mean, running_var, batch, channels, spatial, eps, momentum);
  }
  template <class T>
  static void batch_norm_count_batch(T* num_batches_tracked) {
    detail::count_batch_kernel<T><<<1, 1, 0, kiln::cuda::current_stream()>>>(num_batches_tracked);
    KILN_CUDA_CHECK(cudaGetLastError());
  }
  template <class T>
  static void batch_norm_forward_eval(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                      const T* running_mean, const T* running_var, index_t batch, index_t channels,
                                      index_t spatial, T eps) {
    detail::launch_per_item(channels, detail::batch_norm_forward_eval_kernel<T>, x, gamma, beta, y, save_mean,
                            save_invstd, running_mean, running_var, batch, channels, spatial, eps);
  }
  template <class T>
  static void batch_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta,
                                  const T* mean, const T* invstd, index_t batch, index_t channels, index_t spatial,
                                  bool batch_statistics, bool accumulate) {
    detail::launch_per_item(channels, detail::batch_norm_backward_kernel<T>, x, gamma, dy, dx, dgamma, dbeta, mean,
                            invstd, batch, channels, spatial, batch_statistics, accumulate);
  }
  template <class T>
  static void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                 index_t rows, index_t cols, T eps) {
    detail::launch_per_item(rows, detail::layer_norm_forward_kernel<T>, x, gamma, beta, y, save_mean, save_invstd,
                            cols, eps);
  }
  template <class T>
  static void layer_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta, const T* mean,
                                  const T* invstd, index_t rows, index_t cols, bool accumulate) {
    if (dx)
      detail::launch_per_item(rows, detail::layer_norm_backward_rows_kernel<T>, x, gamma, dy, dx, mean, invstd,
                              cols);
    if (dgamma || dbeta)
      detail::launch_elementwise(cols, detail::layer_norm_backward_params_kernel<T>, x, dy, dgamma, dbeta, mean,
                                 invstd, rows, cols, accumulate);
  }
};

}  // namespace kiln::kernels::cuda
