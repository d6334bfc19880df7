// One training step of a one-hidden-layer MLP as a single kernel launch: x -> Dense(hidden, ReLU) -> Dense(out) ->
// softmax cross-entropy (mean) -> gradients -> Adam on every parameter. The ladder's rung 7 ("fully fused kernel,
// GPU, small MLPs"): where rung 6 replays a graph of some twenty launches, this is one launch and two grid-wide
// barriers, and the only intermediate values that pass through device memory are the hidden layer's outputs.
//
// How the work is split: block b owns hidden units [b * units, (b + 1) * units), units being 1, 2, 4 or 8: their
// rows of W1 and b1, their columns of W2, and every gradient and Adam update of those. Its W1 rows wait in shared
// memory for the forward product. The head (out x hidden, with out at most 32) is small, so every block computes
// the logits, the loss and dL/dlogits of the whole batch itself rather than wait for one block to share them: the
// only values a block needs from the others are the hidden activations, hence the first barrier. The second keeps
// every block from updating its columns of W2 before all have read W2 for the logits.
//
// Arithmetic is kiln's (the loss and Adam as in the CUDA policies' kernels, each product a plain FMA-free sum since
// kiln builds its CUDA code with --fmad=false), but the products sum in another order than cuBLAS: losses agree with
// the unfused rungs to float rounding, not bit for bit.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/cuda/adam_capturable.cuh"
#include "kiln/kernels/cuda/launch.cuh"
#include "kiln/kernels/cuda/optim.cuh"
#include "kiln/kernels/fused_parameter.hpp"

namespace kiln::kernels::cuda {

// Threads per block and the widest head the fused step takes.
inline constexpr int fused_mlp_threads = 256;
inline constexpr index_t fused_mlp_max_out = 32;

using kernels::fused_parameter;  // kernels/fused_parameter.hpp

// Everything one fused step reads and writes. Device memory throughout except the sizes and hyper-parameters.
struct fused_mlp_step_arguments {
  const float* x;              // batch x in, row-major
  const std::int64_t* labels;  // batch class indices
  index_t batch, in, hidden, out;
  fused_parameter w1, b1, w2, b2;  // (hidden x in), (hidden), (out x hidden), (out): PyTorch's Linear layouts
  float* hidden_values;            // batch x hidden scratch: the hidden layer's output
  long long* step;                 // Adam's steps taken so far; the launch advances it by one
  float* loss;                     // the batch's loss, reduction mean
  long long* bad_label;            // the lowest row whose label is outside [0, out) is atomicMin'ed in
  float loss_scale;                // 1 / batch, as the loss kernels' reduction_scale gives it
  adam_step_args<float> adam;      // lr, betas, eps, weight decay, decoupled; step and amsgrad unused
};

namespace detail {

// Adam on this launch's elements: adam_element (kernels/cuda/optim.cuh) with the constants of the step count on the
// device (adam_constants_at, as the capturable Adam).
struct fused_adam {
  adam_step_args<float> a;
  adam_constants<float> c;
  __device__ fused_adam(const adam_step_args<float>& args, long long step)
      : a(args), c(adam_constants_at(args, step)) {}
  // Stores grads[k] as the gradient and updates value and moments at index[k] of p, for the first `count` of N
  // elements. Every load is issued before any store, since the compiler may not move a load above a store to memory
  // that might alias it, and loads one after another would each wait for the last (with 8 units per block, the MNIST
  // MLP's step went from 115.8 to 101.7 us on an H100).
  template <int N>
  __device__ void update(const fused_parameter& p, const index_t (&index)[N], const float (&grads)[N],
                         int count) const {
    float value[N], m[N], v[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < count) {
        value[k] = p.value[index[k]];
        m[k] = p.exp_avg[index[k]];
        v[k] = p.exp_avg_sq[index[k]];
      }
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < count) {
        float g = grads[k];
        p.grad[index[k]] = g;
        step(value[k], m[k], v[k], g);
        p.exp_avg[index[k]] = m[k];
        p.exp_avg_sq[index[k]] = v[k];
        p.value[index[k]] = value[k];
      }
  }
  // The same for the one element at index i.
  __device__ void update(const fused_parameter& p, index_t i, float g) const {
    const index_t index[1] = {i};
    const float grads[1] = {g};
    update(p, index, grads, 1);
  }
  // One element's update: adam_element, as adam_op (amsgrad off).
  __device__ void step(float& value, float& m, float& v, float g) const {
    float unused_max = 0.0f;
    adam_element(value, m, v, unused_max, g, a, c);
  }
};

// Dynamic shared memory of a block of `units` hidden units, in floats: its W1 rows, the batch's dL/dlogits, its
// units' dL/dhidden and its columns of dW2.
inline index_t fused_mlp_shared_floats(int units, index_t batch, index_t in, index_t out) {
  return units * in + batch * out + batch * units + out * units;
}

// The loops over samples and inputs are unrolled so that their loads (L2 round trips: the batch and the hidden values
// are shared by every block) are in flight together rather than one after another.
template <int units>
__global__ void __launch_bounds__(fused_mlp_threads) fused_mlp_step_kernel(fused_mlp_step_arguments g) {
  namespace cg = cooperative_groups;
  extern __shared__ float shared[];
  constexpr int warps = fused_mlp_threads / 32;
  float* w1_rows = shared;                          // units x in
  float* dlogits = w1_rows + units * g.in;          // batch x out
  float* dhidden = dlogits + g.batch * g.out;       // batch x units
  float* dw2_columns = dhidden + g.batch * units;   // out x units
  const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
  const index_t first_unit = index_t(blockIdx.x) * units;
  const int my_units = int(g.hidden - first_unit < units ? g.hidden - first_unit : units);
  // Every block reads the count now; block 0 writes the new one after the last barrier.
  const long long step = *g.step + 1;
  const fused_adam adam(g.adam, step);

  // Forward, hidden layer: hidden[s, u] = relu(b1[u] + x[s, :] . W1[u, :]) for this block's units, a warp per sample,
  // its lanes along the inputs.
  for (index_t i = thread; i < units * g.in; i += fused_mlp_threads) {
    const index_t u = i / g.in;
    w1_rows[i] = u < my_units ? g.w1.value[(first_unit + u) * g.in + i % g.in] : 0.0f;
  }
  __syncthreads();
  for (index_t s = warp; s < g.batch; s += warps) {
    float sums[units] = {};
    const float* x = g.x + s * g.in;
#pragma unroll 4
    for (index_t f = lane; f < g.in; f += 32) {
      const float value = x[f];
#pragma unroll
      for (int u = 0; u < units; ++u) sums[u] += value * w1_rows[u * g.in + f];
    }
#pragma unroll
    for (int u = 0; u < units; ++u) {
      const float total = warp_reduce(sums[u], sum_op{});
      if (lane == u && u < my_units) {
        const float z = total + g.b1.value[first_unit + u];
        g.hidden_values[s * g.hidden + first_unit + u] = z > 0.0f ? z : 0.0f;
      }
    }
  }
  cg::this_grid().sync();

  // Head, loss and dL/dlogits of the whole batch, in every block: a warp per sample. __ldcg reads the hidden values
  // from L2, past this SM's L1, since other blocks wrote them during this launch.
  double block_loss = 0;
  for (index_t s = warp; s < g.batch; s += warps) {
    // Each lane loads its hidden values once and adds them into every class's sum: lanes along the hidden units.
    const float* hidden = g.hidden_values + s * g.hidden;
    float sums[fused_mlp_max_out] = {};
#pragma unroll 2
    for (index_t h = lane; h < g.hidden; h += 32) {
      const float value = __ldcg(hidden + h);
#pragma unroll
      for (int c = 0; c < fused_mlp_max_out; ++c)
        if (c < g.out) sums[c] += value * g.w2.value[c * g.hidden + h];
    }
    float logit = 0.0f;  // lane c keeps logit c
#pragma unroll
    for (int c = 0; c < fused_mlp_max_out; ++c) {
      if (c >= g.out) break;
      const float total = warp_reduce(sums[c], sum_op{}) + g.b2.value[c];
      if (lane == c) logit = total;
    }
    const bool in_row = lane < g.out;
    const float max_value = warp_reduce(in_row ? logit : -INFINITY, max_op{});
    const float exp_sum = warp_reduce(in_row ? expf(logit - max_value) : 0.0f, sum_op{});
    const std::int64_t label = g.labels[s];
    const bool valid = label >= 0 && label < g.out;
    if (!valid && lane == 0 && blockIdx.x == 0)
      atomicMin(reinterpret_cast<unsigned long long*>(g.bad_label), static_cast<unsigned long long>(s));
    const float label_logit = __shfl_sync(0xffffffffu, logit, valid ? int(label) : 0);
    // log(sum) - (x[label] - max) and (softmax - onehot) * factor, as softmax_cross_entropy_kernel computes them.
    if (lane == 0 && valid) block_loss += double(logf(exp_sum) - (label_logit - max_value));
    if (in_row) {
      const float factor = g.loss_scale;
      const float p = expf(logit - max_value) * (1.0f / exp_sum) * factor;
      dlogits[s * g.out + lane] = valid && lane == label ? p - factor : p;
    }
  }
  block_loss = block_reduce(block_loss, sum_op{}, 0.0);  // also the barrier that publishes dlogits
  if (blockIdx.x == 0 && thread == 0) *g.loss = static_cast<float>(block_loss) * g.loss_scale;

  // Backward through this block's units: dL/dhidden (through the ReLU: the output is positive where it passed), the
  // head's weight columns, the biases.
  for (index_t i = thread; i < g.batch * units; i += fused_mlp_threads) {
    const index_t s = i / units;
    const int u = int(i % units);
    float d = 0.0f;
    if (u < my_units) {
      const index_t h = first_unit + u;
      for (index_t c = 0; c < g.out; ++c) d += dlogits[s * g.out + c] * g.w2.value[c * g.hidden + h];
      if (!(__ldcg(g.hidden_values + s * g.hidden + h) > 0.0f)) d = 0.0f;
    }
    dhidden[i] = d;
  }
  for (index_t i = thread; i < g.out * units; i += fused_mlp_threads) {
    const index_t c = i / units;
    const int u = int(i % units);
    float d = 0.0f;
    if (u < my_units) {
      const float* hidden = g.hidden_values + first_unit + u;
#pragma unroll 16
      for (index_t s = 0; s < g.batch; ++s) d += dlogits[s * g.out + c] * __ldcg(hidden + s * g.hidden);
    }
    dw2_columns[i] = d;
  }
  __syncthreads();
  if (thread < my_units) {
    float d = 0.0f;
    for (index_t s = 0; s < g.batch; ++s) d += dhidden[s * units + thread];
    adam.update(g.b1, first_unit + thread, d);
  }
  // dW1 rows, each thread a column of inputs: dW1[u, f] = sum over samples of dhidden[s, u] x[s, f]; then Adam.
  for (index_t f = thread; f < g.in; f += fused_mlp_threads) {
    float sums[units] = {};
#pragma unroll 16
    for (index_t s = 0; s < g.batch; ++s) {
      const float value = g.x[s * g.in + f];
#pragma unroll
      for (int u = 0; u < units; ++u) sums[u] += dhidden[s * units + u] * value;
    }
    index_t index[units];
#pragma unroll
    for (int u = 0; u < units; ++u) index[u] = (first_unit + u) * g.in + f;
    adam.update(g.w1, index, sums, my_units);
  }
  cg::this_grid().sync();

  // Every block has read W2 and b2 for its logits: now each updates its columns, and block 0 the head's bias.
  for (index_t i = thread; i < g.out * units; i += fused_mlp_threads) {
    const index_t c = i / units;
    const int u = int(i % units);
    if (u < my_units) adam.update(g.w2, c * g.hidden + first_unit + u, dw2_columns[i]);
  }
  if (blockIdx.x == 0) {
    for (index_t c = thread; c < g.out; c += fused_mlp_threads) {
      float d = 0.0f;
      for (index_t s = 0; s < g.batch; ++s) d += dlogits[s * g.out + c];
      adam.update(g.b2, c, d);
    }
    if (thread == 0) *g.step = step;
  }
}

}  // namespace detail

// Blocks of a fused step over `hidden` units, `units` to a block.
inline index_t fused_mlp_blocks(index_t hidden, int units) { return (hidden + units - 1) / units; }

// The hidden units a block owns unless the caller chooses: the fewest of 2, 4 and 8 that need no more blocks than the
// device has SMs. Fewer units per block means more blocks at work, each reading the whole batch twice (forward and
// dW1); the MNIST MLP's step on an H100 took 74.7 us with 2 units (64 blocks), 82.7 with 4 and 115.8 with 8.
inline int fused_mlp_auto_units(index_t hidden) {
  for (int units : {2, 4})
    if (fused_mlp_blocks(hidden, units) <= kiln::cuda::multiprocessor_count()) return units;
  return 8;
}

namespace detail {
// The kernel for 1, 2, 4 or 8 units per block.
inline const void* fused_mlp_kernel_for(int units) {
  switch (units) {
    case 1: return reinterpret_cast<const void*>(fused_mlp_step_kernel<1>);
    case 2: return reinterpret_cast<const void*>(fused_mlp_step_kernel<2>);
    case 4: return reinterpret_cast<const void*>(fused_mlp_step_kernel<4>);
    case 8: return reinterpret_cast<const void*>(fused_mlp_step_kernel<8>);
    default: fail("fused MLP step: expected 1, 2, 4 or 8 hidden units per block, found ", units);
  }
}
}  // namespace detail

// Throws a kiln::error naming what does not fit: a head wider than 32 classes, a grid larger than the device holds at
// once (a cooperative launch needs every block resident), or shared memory beyond the block's limit.
inline void check_fused_mlp(index_t batch, index_t in, index_t hidden, index_t out, int units) {
  const void* kernel = detail::fused_mlp_kernel_for(units);
  if (out < 1 || out > fused_mlp_max_out)
    fail("fused MLP step: expected at most ", fused_mlp_max_out, " outputs (a warp's lanes), found ", out);
  const std::size_t shared_bytes =
      std::size_t(detail::fused_mlp_shared_floats(units, batch, in, out)) * sizeof(float);
  int device = 0, shared_limit = 0, cooperative = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  if (!cooperative) fail("fused MLP step: the device does not support cooperative launches");
  if (shared_bytes > std::size_t(shared_limit))
    fail("fused MLP step: a batch of ", batch, " with ", in, " inputs needs ", shared_bytes,
         " bytes of shared memory per block, more than the device's ", shared_limit);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  int per_multiprocessor = 0;
  KILN_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, fused_mlp_threads, shared_bytes));
  const index_t resident = index_t(per_multiprocessor) * kiln::cuda::multiprocessor_count();
  if (fused_mlp_blocks(hidden, units) > resident)
    fail("fused MLP step: ", hidden, " hidden units need ", fused_mlp_blocks(hidden, units),
         " blocks at once, more than the ", resident, " the device holds");
}

// Enqueues one fused step on kiln's stream, `units` hidden units to a block; nothing waits. The caller has checked
// the sizes (check_fused_mlp with the largest batch) and preset *bad_label to all bits set.
inline void fused_mlp_step(const fused_mlp_step_arguments& arguments, int units) {
  const fused_mlp_step_arguments& a = arguments;
  const std::size_t shared_bytes =
      std::size_t(detail::fused_mlp_shared_floats(units, a.batch, a.in, a.out)) * sizeof(float);
  void* parameters[] = {const_cast<fused_mlp_step_arguments*>(&a)};
  KILN_CUDA_CHECK(cudaLaunchCooperativeKernel(detail::fused_mlp_kernel_for(units),
                                              dim3(unsigned(fused_mlp_blocks(a.hidden, units))),
                                              dim3(fused_mlp_threads), parameters, shared_bytes,
                                              kiln::cuda::current_stream()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::kernels::cuda
