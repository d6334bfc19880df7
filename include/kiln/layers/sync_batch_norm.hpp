// SyncBatchNorm1d / SyncBatchNorm2d (PyTorch's SyncBatchNorm, static mode): batch normalisation whose training
// statistics are those of the whole batch across the replicas of a data-parallel model, for when each rank's share
// of a batch is too small for statistics of its own:
//
//   using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<3, 32, 32>, kiln::Conv2D<16, 3>,
//                                kiln::SyncBatchNorm2d<>, kiln::ReLU, ...>;
//   Net net(32, 42);
//   kiln::distributed::static_data_parallel ddp(net, group);  // 2 ranks x 32 normalise as one batch of 64
//
// BatchNorm1d / 2d keep per-rank statistics, the default; SyncBatchNorm is the option. Its template arguments,
// parameters and buffers are BatchNorm's, under BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts move between the two. It reaches the replicas through layer_context::replicas
// (core/replicas.hpp), which static_data_parallel lends the model it wraps; this header needs no MPI.
//
// In training, per channel, over every replica's values: mean = (sum over the replicas of the local sums) / count,
// then var = (sum over the replicas of the local sums of (x - mean)^2) / count, two passes in double as precise as
// the one-process kernel's; y = (x - mean) invstd weight + bias, and the running statistics take the global mean and
// the global unbiased variance. The backward sums sum(dy) and sum(dy xhat) per channel over the replicas:
// dx = weight invstd (dy - sum_all(dy) / count - xhat sum_all(dy xhat) / count), and the parameters' gradients are
// this replica's own sums (dweight = sum dy xhat, dbias = sum dy over its samples).
//
// Why that trains as one process on the whole batch. Let S be the sum of every replica's loss. Every replica's y
// depends on every replica's x through the statistics, and dS/dx is the whole batch's batch-norm backward applied to
// every replica's dy together; its rows for this replica's samples are the dx above, whose sums over the replicas are
// the sums over the whole batch. So every parameter's gradient on a replica is the part of dS/dW that passes through
// that replica's samples (the layers below through the dx above, weight and bias through the local sums, the layers
// above as in any model), and the parts add up over the replicas to dS/dW.
// static_data_parallel averages the gradients over the R ranks, giving dS/dW / R. Each rank's loss is the mean over
// its n / R samples, so S / R is the mean over all n: one process's loss on the whole batch, whose gradient that is.
//
// In evaluation it is BatchNorm: the running statistics, no communication. Without replicas (a model alone) it runs
// BatchNorm's own kernels: the same bits. Each training pass is a collective: every replica runs it at the same point.
#pragma once

#include <array>
#include <span>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/core/replicas.hpp"
#include "kiln/layers/batchnorm.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

// Training-mode batch norm over a batch split between replicas: as batch_norm_forward in training, with the
// statistics of every replica's values together. sums holds channels + 1 values and squares channels (host memory
// the caller provides, so that a step allocates nothing); the sums are in double, the precision of the CPU kernels'
// sums for float and double data.
template <class Policy, class T>
void sync_batch_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd,
                             const batch_norm_state<T>& state, index_t batch, index_t channels, index_t spatial, T eps,
                             T momentum, replica_reducer& replicas, std::span<double> sums,
                             std::span<double> squares) {
  static_assert(Policy::host_accessible,
                "kiln::SyncBatchNorm: the sums over the replicas are taken in host memory; a model on a GPU policy "
                "trains without replicas");
  Policy::batch_norm_channel_sums(x, sums.data(), batch, channels, spatial);
  sums[static_cast<std::size_t>(channels)] = static_cast<double>(batch * spatial);  // this replica's count, summed too
  replicas.sum(sums);
  const double count = sums[static_cast<std::size_t>(channels)];
  // As BatchNorm: one value per channel has no spread to normalise by, and its unbiased variance would divide by 0.
  if (count < 2)
    fail("SyncBatchNorm: expected more than 1 value per channel across the replicas when training, found ", count);
  Policy::batch_norm_channel_squares(x, sums.data(), count, squares.data(), batch, channels, spatial);
  replicas.sum(squares);
  Policy::batch_norm_forward_from_sums(x, gamma, beta, y, save_mean, save_invstd, state.running_mean,
                                       state.running_var, sums.data(), squares.data(), count, batch, channels, spatial,
                                       eps, momentum);
  if (state.num_batches_tracked) Policy::batch_norm_count_batch(state.num_batches_tracked);
}
// Its backward: dx (overwritten), dgamma and dbeta (overwritten, skipped when null) from the statistics the forward
// saved. sums holds 2 channels + 1 values, host memory as the forward's.
template <class Policy, class T>
void sync_batch_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta, const T* save_mean,
                              const T* save_invstd, index_t batch, index_t channels, index_t spatial,
                              replica_reducer& replicas, std::span<double> sums) {
  static_assert(Policy::host_accessible, "kiln::SyncBatchNorm: the sums over the replicas are taken in host memory");
  Policy::batch_norm_backward_sums(x, dy, dgamma, dbeta, save_mean, save_invstd, sums.data(), batch, channels,
                                   spatial);
  // Every replica takes part even without a dx to write (the first layer): the sum is a collective.
  sums[static_cast<std::size_t>(2 * channels)] = static_cast<double>(batch * spatial);
  replicas.sum(sums);
  if (dx)
    Policy::batch_norm_backward_from_sums(x, gamma, dy, dx, save_mean, save_invstd, sums.data(),
                                          sums[static_cast<std::size_t>(2 * channels)], batch, channels, spatial);
}

// The static layer behind SyncBatchNorm1d and SyncBatchNorm2d: BatchNorm's layer (its shapes, memory, names, initial
// values and evaluation), whose training goes across the replicas when the pass has them.
template <bool TwoD, double Momentum, double Eps, bool Affine>
struct sync_batch_norm_layer : batch_norm_layer<TwoD, Momentum, Eps, Affine> {
  static constexpr const char* name = TwoD ? "SyncBatchNorm2d" : "SyncBatchNorm1d";

  template <class In>
  struct bind : batch_norm_layer<TwoD, Momentum, Eps, Affine>::template bind<In> {
    using batch_norm = typename batch_norm_layer<TwoD, Momentum, Eps, Affine>::template bind<In>;
    using batch_norm::channels;
    using batch_norm::spatial;

    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      if (!ctx.replicas || !ctx.training) {
        batch_norm::template forward<Policy>(params, buffers, x, y, scratch, ctx, fuse);
      } else if constexpr (Policy::host_accessible) {
        std::array<double, channels + 1> sums;
        std::array<double, channels> squares;
        batch_norm_state<T> state{buffers, buffers + channels, buffers + 2 * channels};
        sync_batch_norm_forward<Policy>(x, Affine ? params : nullptr, Affine ? params + channels : nullptr, y, scratch,
                                        scratch + channels, state, ctx.batch, channels, spatial, T(Eps), T(Momentum),
                                        *ctx.replicas, sums, squares);
      } else {
        fail(name, ": expected a model on a host policy when it has replicas (the sums over them are taken in host "
             "memory), found one on ", Policy::name);
      }
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      if (!ctx.replicas || !ctx.training) {
        batch_norm::template backward<Policy>(params, x, y, dy, dx, dparams, scratch, ctx);
      } else if constexpr (Policy::host_accessible) {
        std::array<double, 2 * channels + 1> sums;
        sync_batch_norm_backward<Policy>(x, Affine ? params : nullptr, dy, dx, Affine ? dparams : nullptr,
                                         Affine ? dparams + channels : nullptr, scratch, scratch + channels, ctx.batch,
                                         channels, spatial, *ctx.replicas, sums);
      } else {
        fail(name, ": expected a model on a host policy when it has replicas, found one on ", Policy::name);
      }
    }
    static std::string description() { return name; }
  };
};

// Batch normalisation of (C,) or (C, L) samples with the statistics of the whole batch across the replicas (PyTorch's
// SyncBatchNorm on BatchNorm1d's inputs); BatchNorm1d without replicas.
template <double Momentum = 0.1, double Eps = 1e-5, bool Affine = true>
struct SyncBatchNorm1d : sync_batch_norm_layer<false, Momentum, Eps, Affine> {};
// The same for (C, H, W) samples; BatchNorm2d without replicas.
template <double Momentum = 0.1, double Eps = 1e-5, bool Affine = true>
struct SyncBatchNorm2d : sync_batch_norm_layer<true, Momentum, Eps, Affine> {};

}  // namespace kiln
