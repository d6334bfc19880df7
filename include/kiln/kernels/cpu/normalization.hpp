// Batch and layer normalisation on the CPU. Statistics are summed in double for float data, in a fixed order, so the
// results never depend on the thread count. Both forward passes save (mean, 1/sqrt(var + eps)) for the backward.
// Batch norm's channels are independent: large batches split them over the threads, each channel computed by the same
// code on any thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

namespace kiln::kernels::cpu {

// The normalisation kernels of the CPU policies. Batch norm sees x as (batch, channels, spatial); layer norm as
// (rows, cols) with each row normalised on its own. gamma / beta may be null (no affine transform).
struct normalization_kernels {
  // Training: batch statistics per channel (biased variance normalises; the unbiased one, n / (n - 1) times it,
  // enters the running variance, as in PyTorch). running_mean / running_var are updated when not null:
  // running = (1 - momentum) running + momentum batch.
  template <class T>
  KILN_KERNEL static void batch_norm_forward_train(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                       T* running_mean, T* running_var, index_t batch, index_t channels,
                                       index_t spatial, T eps, T momentum) {
    using S = sum_type<T>;
    const S count = S(batch * spatial);
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c) {
        const S mean = channel_sums<T>(batch, channels, spatial, c, [&](index_t i) { return S(x[i]); }) / count;
        const S squares = channel_squares(x, c, mean, batch, channels, spatial);
        normalize_by_statistics(x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, c, mean,
                                squares, count, batch, channels, spatial, eps, momentum);
      }
    });
  }
  // num_batches_tracked += 1 (a single value kept with the running statistics, in the policy's memory).
  template <class T>
  KILN_KERNEL static void batch_norm_count_batch(T* num_batches_tracked) {
    *num_batches_tracked += T(1);
  }
  // Evaluation: the running statistics normalise; they are also saved as (mean, invstd) for the backward.
  template <class T>
  KILN_KERNEL static void batch_norm_forward_eval(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                      const T* running_mean, const T* running_var, index_t batch, index_t channels,
                                      index_t spatial, T eps) {
    for (index_t c = 0; c < channels; ++c) {
      const T invstd = static_cast<T>(1 / std::sqrt(static_cast<sum_type<T>>(running_var[c]) + eps));
      save_mean[c] = running_mean[c];
      save_invstd[c] = invstd;
      normalize_channel(x, gamma, beta, y, c, running_mean[c], invstd, batch, channels, spatial);
    }
  }
  // dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)) when the batch statistics normalised (training), or
  // gamma invstd dy with fixed statistics; dgamma = sum dy xhat, dbeta = sum dy (added with accumulate).
  // dx may be null; it is overwritten otherwise.
  template <class T>
  KILN_KERNEL static void batch_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta,
                                  const T* mean, const T* invstd, index_t batch, index_t channels, index_t spatial,
                                  bool batch_statistics, bool accumulate) {
    using S = sum_type<T>;
    const S count = S(batch * spatial);
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c) {
        const auto [sum_dy, sum_dy_xhat] = channel_gradient_sums(x, dy, c, mean[c], invstd[c], batch, channels,
                                                                 spatial);
        if (dgamma) dgamma[c] = accumulate ? dgamma[c] + static_cast<T>(sum_dy_xhat) : static_cast<T>(sum_dy_xhat);
        if (dbeta) dbeta[c] = accumulate ? dbeta[c] + static_cast<T>(sum_dy) : static_cast<T>(sum_dy);
        if (!dx) continue;
        const T mean_dy = batch_statistics ? static_cast<T>(sum_dy / count) : T(0);
        const T mean_dy_xhat = batch_statistics ? static_cast<T>(sum_dy_xhat / count) : T(0);
        input_gradient(x, gamma, dy, dx, c, mean[c], invstd[c], mean_dy, mean_dy_xhat, batch, channels, spatial);
      }
    });
  }

  // Batch norm over a batch split between the replicas of a data-parallel model (SyncBatchNorm): the statistics of
  // the whole batch come from per-replica sums, which the caller sums over the replicas between these kernels. Each
  // computes what batch_norm_forward_train and batch_norm_backward compute from the sums over the one batch, by the
  // same code: with one replica, the same bits. count is the number of values per channel over every replica.
  //
  // sums[c] = the sum of channel c's values on this replica.
  template <class T>
  KILN_KERNEL static void batch_norm_channel_sums(const T* x, sum_type<T>* sums, index_t batch, index_t channels,
                                                  index_t spatial) {
    using S = sum_type<T>;
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c)
        sums[c] = channel_sums<T>(batch, channels, spatial, c, [&](index_t i) { return S(x[i]); });
    });
  }
  // squares[c] = the sum over channel c's values on this replica of (x - mean)^2, mean = sums[c] / count (sums over
  // every replica).
  template <class T>
  KILN_KERNEL static void batch_norm_channel_squares(const T* x, const sum_type<T>* sums, sum_type<T> count,
                                                     sum_type<T>* squares, index_t batch, index_t channels,
                                                     index_t spatial) {
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c)
        squares[c] = channel_squares(x, c, sums[c] / count, batch, channels, spatial);
    });
  }
  // batch_norm_forward_train's normalisation and running statistics, from the sums and squares over every replica.
  template <class T>
  KILN_KERNEL static void batch_norm_forward_from_sums(const T* x, const T* gamma, const T* beta, T* y, T* save_mean,
                                                       T* save_invstd, T* running_mean, T* running_var,
                                                       const sum_type<T>* sums, const sum_type<T>* squares,
                                                       sum_type<T> count, index_t batch, index_t channels,
                                                       index_t spatial, T eps, T momentum) {
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c)
        normalize_by_statistics(x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, c,
                                sums[c] / count, squares[c], count, batch, channels, spatial, eps, momentum);
    });
  }
  // sums[c] = sum of dy and sums[channels + c] = sum of dy xhat over channel c on this replica; dgamma and dbeta
  // (skipped when null) are overwritten with them: the parameters' gradient from this replica's samples.
  template <class T>
  KILN_KERNEL static void batch_norm_backward_sums(const T* x, const T* dy, T* dgamma, T* dbeta, const T* mean,
                                                   const T* invstd, sum_type<T>* sums, index_t batch,
                                                   index_t channels, index_t spatial) {
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c) {
        const auto [sum_dy, sum_dy_xhat] = channel_gradient_sums(x, dy, c, mean[c], invstd[c], batch, channels,
                                                                 spatial);
        sums[c] = sum_dy;
        sums[channels + c] = sum_dy_xhat;
        if (dgamma) dgamma[c] = static_cast<T>(sum_dy_xhat);
        if (dbeta) dbeta[c] = static_cast<T>(sum_dy);
      }
    });
  }
  // dx (overwritten) as batch_norm_backward's in training, from batch_norm_backward_sums's sums over every replica.
  template <class T>
  KILN_KERNEL static void batch_norm_backward_from_sums(const T* x, const T* gamma, const T* dy, T* dx, const T* mean,
                                                        const T* invstd, const sum_type<T>* sums, sum_type<T> count,
                                                        index_t batch, index_t channels, index_t spatial) {
    each_channel_slice(batch, channels, spatial, [&](index_t first, index_t last) {
      for (index_t c = first; c < last; ++c) {
        const T mean_dy = static_cast<T>(sums[c] / count);
        const T mean_dy_xhat = static_cast<T>(sums[channels + c] / count);
        input_gradient(x, gamma, dy, dx, c, mean[c], invstd[c], mean_dy, mean_dy_xhat, batch, channels, spatial);
      }
    });
  }

  // Each row of x normalised by its own mean and biased variance, then scaled by gamma and shifted by beta (per
  // column).
  template <class T>
  KILN_KERNEL static void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                 index_t rows, index_t cols, T eps) {
    using S = sum_type<T>;
    for (index_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      S total = 0;
      for (index_t c = 0; c < cols; ++c) total += xr[c];
      const S mean = total / S(cols);
      S squares = 0;
      for (index_t c = 0; c < cols; ++c) {
        const S d = S(xr[c]) - mean;
        squares += d * d;
      }
      const T m = static_cast<T>(mean);
      const T is = static_cast<T>(1 / std::sqrt(squares / S(cols) + S(eps)));
      save_mean[r] = m;
      save_invstd[r] = is;
      for (index_t c = 0; c < cols; ++c) {
        T v = (xr[c] - m) * is;
        if (gamma) v = v * gamma[c];
        if (beta) v = v + beta[c];
        yr[c] = v;
      }
    }
  }
  // dx = invstd (g - mean(g) - xhat mean(g xhat)) with g = gamma dy; dgamma = sum over rows of dy xhat, dbeta =
  // sum of dy (added with accumulate). dx may be null; it is overwritten otherwise.
  template <class T>
  KILN_KERNEL static void layer_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta, const T* mean,
                                  const T* invstd, index_t rows, index_t cols, bool accumulate) {
    using S = sum_type<T>;
    if (dgamma && !accumulate)
      for (index_t c = 0; c < cols; ++c) dgamma[c] = T(0);
    if (dbeta && !accumulate)
      for (index_t c = 0; c < cols; ++c) dbeta[c] = T(0);
    for (index_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      const T m = mean[r], is = invstd[r];
      S sum_g = 0, sum_g_xhat = 0;
      for (index_t c = 0; c < cols; ++c) {
        const T xhat = (xr[c] - m) * is;
        const T g = gamma ? dyr[c] * gamma[c] : dyr[c];
        sum_g += g;
        sum_g_xhat += S(g) * S(xhat);
        if (dgamma) dgamma[c] += dyr[c] * xhat;
        if (dbeta) dbeta[c] += dyr[c];
      }
      if (!dx) continue;
      const T mean_g = static_cast<T>(sum_g / S(cols)), mean_g_xhat = static_cast<T>(sum_g_xhat / S(cols));
      T* dxr = dx + r * cols;
      for (index_t c = 0; c < cols; ++c) {
        const T xhat = (xr[c] - m) * is;
        const T g = gamma ? dyr[c] * gamma[c] : dyr[c];
        dxr[c] = is * (g - mean_g - xhat * mean_g_xhat);
      }
    }
  }

 private:
  // The number of lanes of channel_sums.
  static constexpr int channel_lanes = 16;
  // The sum of value(i) over channel c's elements i (batch x spatial of them), in sum_type<T>: lane j gathers the
  // positions j, j + 16, ... of each sample's plane, and the lanes are added in order at the end. The order depends on
  // the shape alone, and the lanes are independent, so the loop vectorises.
  template <class T, class Value>
  static sum_type<T> channel_sums(index_t batch, index_t channels, index_t spatial, index_t c, Value&& value) {
    using S = sum_type<T>;
    S lanes[channel_lanes] = {};
    for (index_t n = 0; n < batch; ++n) {
      const index_t o = (n * channels + c) * spatial;
      index_t s = 0;
      for (; s + channel_lanes <= spatial; s += channel_lanes)
        for (int j = 0; j < channel_lanes; ++j) lanes[j] += value(o + s + j);
      for (int j = 0; s < spatial; ++s, ++j) lanes[j] += value(o + s);
    }
    S total = 0;
    for (const S lane : lanes) total += lane;
    return total;
  }
  // Calls body(first, last) over the channels, split over the threads where each gets enough values.
  template <class Body>
  static void each_channel_slice(index_t batch, index_t channels, index_t spatial, Body&& body) {
    const index_t per_channel = std::max<index_t>(batch * spatial, 1);
    parallel_row_slices(channels, (parallel_min_elements_per_thread + per_channel - 1) / per_channel, body);
  }
  template <class T>
  static void normalize_channel(const T* x, const T* gamma, const T* beta, T* y, index_t c, T mean, T invstd,
                                index_t batch, index_t channels, index_t spatial) {
    const T scale = gamma ? gamma[c] * invstd : invstd;
    const T shift = (beta ? beta[c] : T(0)) - mean * scale;
    for (index_t n = 0; n < batch; ++n) {
      const index_t o = (n * channels + c) * spatial;
      for (index_t s = 0; s < spatial; ++s) y[o + s] = x[o + s] * scale + shift;
    }
  }
  // The sum of (x - mean)^2 over channel c's values, mean in sum_type<T>.
  template <class T>
  static sum_type<T> channel_squares(const T* x, index_t c, sum_type<T> mean, index_t batch, index_t channels,
                                     index_t spatial) {
    using S = sum_type<T>;
    return channel_sums<T>(batch, channels, spatial, c, [&](index_t i) {
      const S d = S(x[i]) - mean;
      return d * d;
    });
  }
  // Channel c normalised by the batch statistics (mean, and squares / count the biased variance), which are saved as
  // (mean, invstd) and enter the running statistics when those are not null (the unbiased variance, squares /
  // (count - 1)).
  template <class T>
  static void normalize_by_statistics(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                                      T* running_mean, T* running_var, index_t c, sum_type<T> mean,
                                      sum_type<T> squares, sum_type<T> count, index_t batch, index_t channels,
                                      index_t spatial, T eps, T momentum) {
    using S = sum_type<T>;
    const S var = squares / count;
    const T m = static_cast<T>(mean);
    const T invstd = static_cast<T>(1 / std::sqrt(var + S(eps)));
    save_mean[c] = m;
    save_invstd[c] = invstd;
    if (running_mean) running_mean[c] = (T(1) - momentum) * running_mean[c] + momentum * m;
    if (running_var) {
      const T unbiased = static_cast<T>(count > 1 ? squares / (count - 1) : var);
      running_var[c] = (T(1) - momentum) * running_var[c] + momentum * unbiased;
    }
    normalize_channel(x, gamma, beta, y, c, m, invstd, batch, channels, spatial);
  }
  // The sums over channel c of dy and of dy xhat, xhat = (x - mean) invstd.
  template <class T>
  static std::pair<sum_type<T>, sum_type<T>> channel_gradient_sums(const T* x, const T* dy, index_t c, T mean,
                                                                   T invstd, index_t batch, index_t channels,
                                                                   index_t spatial) {
    using S = sum_type<T>;
    const S sum_dy = channel_sums<T>(batch, channels, spatial, c, [&](index_t i) { return S(dy[i]); });
    const S sum_dy_xhat = channel_sums<T>(batch, channels, spatial, c,
                                          [&](index_t i) { return S(dy[i]) * S((x[i] - mean) * invstd); });
    return {sum_dy, sum_dy_xhat};
  }
  // dx = gamma invstd (dy - mean_dy - xhat mean_dy_xhat) over channel c.
  template <class T>
  static void input_gradient(const T* x, const T* gamma, const T* dy, T* dx, index_t c, T mean, T invstd, T mean_dy,
                             T mean_dy_xhat, index_t batch, index_t channels, index_t spatial) {
    const T scale = (gamma ? gamma[c] : T(1)) * invstd;
    for (index_t n = 0; n < batch; ++n) {
      const index_t o = (n * channels + c) * spatial;
      for (index_t s = 0; s < spatial; ++s) {
        const T xhat = (x[o + s] - mean) * invstd;
        dx[o + s] = scale * (dy[o + s] - mean_dy - xhat * mean_dy_xhat);
      }
    }
  }
};

}  // namespace kiln::kernels::cpu
