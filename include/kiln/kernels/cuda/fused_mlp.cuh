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
  float* bias_corrections;         // Adam's two for step t at [2 (t % 2)]: set by fused_mlp_prepare_adam for the first
                                   // step, then by each step for the next
  float* loss;                     // the batch's loss, reduction mean
  long long* bad_label;            // cleared by the step, then the lowest row whose label is outside [0, out)
  float loss_scale;                // 1 / batch, as the loss kernels' reduction_scale gives it
  adam_step_args<float> adam;      // lr, betas, eps, weight decay, decoupled; step and amsgrad unused
};

namespace detail {

// Adam on this launch's elements: adam_element (kernels/cuda/optim.cuh) with the constants of the step count on the
// device (adam_constants_at's, as the capturable Adam's). The bias corrections, two double-precision powers, were
// computed by the step before (or fused_mlp_prepare_adam), so that no thread waits for them at the start.
struct fused_adam {
  adam_step_args<float> a;
  adam_constants<float> c;
  __device__ fused_adam(const adam_step_args<float>& args, adam_bias_corrections<float> b)
      : a(args), c(adam_constants_from(args, b)) {}
  // The values and moments of up to N elements, loaded before the gradient is known so that their round trips overlap
  // the gradient's own loads.
  template <int N>
  struct state {
    float value[N], m[N], v[N];
  };
  // Loads the first `count` of N elements at index[k] of p. Every load is issued before any store, since the compiler
  // may not move a load above a store to memory that might alias it, and loads one after another would each wait for
  // the last.
  template <int N>
  __device__ void load(const fused_parameter& p, const index_t (&index)[N], int count, state<N>& s) const {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < count) {
        s.value[k] = p.value[index[k]];
        s.m[k] = p.exp_avg[index[k]];
        s.v[k] = p.exp_avg_sq[index[k]];
      }
  }
  // Stores grads[k] as the gradient and the updated value and moments of the elements that load read.
  template <int N>
  __device__ void store(const fused_parameter& p, const index_t (&index)[N], const float (&grads)[N], int count,
                        state<N>& s) const {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < count) {
        float g = grads[k];
        p.grad[index[k]] = g;
        step(s.value[k], s.m[k], s.v[k], g);
        p.exp_avg[index[k]] = s.m[k];
        p.exp_avg_sq[index[k]] = s.v[k];
        p.value[index[k]] = s.value[k];
      }
  }
  // Both for the one element at index i.
  __device__ void update(const fused_parameter& p, index_t i, float g) const {
    const index_t index[1] = {i};
    const float grads[1] = {g};
    state<1> s;
    load(p, index, 1, s);
    store(p, index, grads, 1, s);
  }
  // One element's update: adam_element, as adam_op (amsgrad off).
  __device__ void step(float& value, float& m, float& v, float g) const {
    float unused_max = 0.0f;
    adam_element(value, m, v, unused_max, g, a, c);
  }
};

// Stores Adam's bias corrections for step `step` where that step reads them: at [2 (step % 2)] of the buffer, so that
// a step writes the next one's pair beside its own.
__device__ inline void store_fused_bias_corrections(const adam_step_args<float>& a, long long step, float* buffer) {
  const adam_bias_corrections<float> b = adam_bias_corrections_at(a, step);
  buffer[2 * (step % 2)] = b.first;
  buffer[2 * (step % 2) + 1] = b.second;
}

// Dynamic shared memory of a block of `units` hidden units, in floats: its W1 rows, the batch's dL/dlogits, its
// units' hidden values and dL/dhidden, and its columns of dW2.
inline index_t fused_mlp_shared_floats(int units, index_t batch, index_t in, index_t out) {
  return units * in + batch * out + 2 * batch * units + out * units;
}

// The sums over a warp's lanes of N = 16 or 32 values, as warp_reduce adds each (the same pairs at each step, so the
// same bits), in 16 or 31 shuffles instead of 5 N: at each step a lane keeps half of the values it still holds and
// hands the other half to its partner. Lane l returns the total of value l / (32 / N).
template <int M>
__device__ inline void warp_sum_halves(const float (&values)[2 * M], float (&kept)[M], int offset) {
  const bool upper = (threadIdx.x & offset) != 0;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float theirs = __shfl_xor_sync(0xffffffffu, upper ? values[i] : values[i + M], offset);
    kept[i] = (upper ? values[i + M] : values[i]) + theirs;
  }
}
template <int N>
__device__ inline float warp_sum_scatter(const float (&values)[N]) {
  static_assert(N == 16 || N == 32, "warp_sum_scatter: expected 16 or 32 values");
  float v8[8], v4[4], v2[2], v1[1];
  if constexpr (N == 32) {
    float v16[16];
    warp_sum_halves<16>(values, v16, 16);
    warp_sum_halves<8>(v16, v8, 8);
    warp_sum_halves<4>(v8, v4, 4);
    warp_sum_halves<2>(v4, v2, 2);
    warp_sum_halves<1>(v2, v1, 1);
    return v1[0];
  } else {
    warp_sum_halves<8>(values, v8, 16);
    warp_sum_halves<4>(v8, v4, 8);
    warp_sum_halves<2>(v4, v2, 4);
    warp_sum_halves<1>(v2, v1, 2);
    return v1[0] + __shfl_xor_sync(0xffffffffu, v1[0], 1);
  }
}

// Samples a warp takes at once in the forward product, and classes of the head's widest kernel for a head of `out`.
inline constexpr int fused_mlp_forward_samples = 8;
inline constexpr int fused_mlp_head_width(index_t out) { return out <= 16 ? 16 : 32; }

// Rows of x and of the hidden values are shared by every block and read from L2, so a warp keeps many of those loads
// in flight at once: it takes several samples together (8 in the forward, 128 / head_width in the head), and the dW1
// sums run two columns at a time, 16 samples to an unrolled group, with Adam's loads issued before them. Each
// sample's sums are added in the same order whatever the grouping of samples and units (the lanes along the inputs or
// hidden units, then warp_reduce's butterfly), so the step's bits do not depend on the units per block.
template <int units, int head_width>
__global__ void __launch_bounds__(fused_mlp_threads, 1) fused_mlp_step_kernel(fused_mlp_step_arguments g) {
  namespace cg = cooperative_groups;
  extern __shared__ float shared[];
  constexpr int warps = fused_mlp_threads / 32;
  constexpr int forward_samples = fused_mlp_forward_samples;
  constexpr int head_samples = 128 / head_width;
  float* w1_rows = shared;                          // units x in
  float* dlogits = w1_rows + units * g.in;          // batch x out
  float* my_hidden = dlogits + g.batch * g.out;     // batch x units: this block's hidden values
  float* dhidden = my_hidden + g.batch * units;     // batch x units
  float* dw2_columns = dhidden + g.batch * units;   // out x units
  const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
  const index_t first_unit = index_t(blockIdx.x) * units;
  const int my_units = int(g.hidden - first_unit < units ? g.hidden - first_unit : units);
  // Every block reads the count and both pairs of bias corrections now (the step's pair waits on the count
  // otherwise); block 0 writes the next step's pair in the other slot once every block has passed the first barrier.
  // Block 0 alone flags bad labels, after that barrier, so it clears the flag here rather than a memset launch before
  // each step.
  const long long step = *g.step + 1;
  const float even_first = g.bias_corrections[0], even_second = g.bias_corrections[1];
  const float odd_first = g.bias_corrections[2], odd_second = g.bias_corrections[3];
  const int slot = int(step % 2);
  const fused_adam adam(g.adam, {slot ? odd_first : even_first, slot ? odd_second : even_second});
  if (blockIdx.x == 0 && thread == 0) *g.bad_label = -1;

  // The batch's first reads come from device memory: every block asks for its share of the lines now, so that they
  // are in L2 by the time the warps read them.
  {
    constexpr index_t line_floats = 32;
    const index_t lines = (g.batch * g.in + line_floats - 1) / line_floats;
    for (index_t line = index_t(blockIdx.x) * fused_mlp_threads + thread; line < lines;
         line += index_t(gridDim.x) * fused_mlp_threads)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(g.x + line * line_floats));
  }

  // Forward, hidden layer: hidden[s, u] = relu(b1[u] + x[s, :] . W1[u, :]) for this block's units, a warp per group
  // of samples (s = warp + warps * k), its lanes along the inputs. A group past the batch's end reads the last row and
  // drops the sums.
#pragma unroll
  for (int u = 0; u < units; ++u) {
    const float* row = g.w1.value + (first_unit + (u < my_units ? u : 0)) * g.in;
#pragma unroll 4
    for (index_t f = thread; f < g.in; f += fused_mlp_threads) w1_rows[u * g.in + f] = u < my_units ? row[f] : 0.0f;
  }
  float b1[units];  // loaded once: a load after each hidden value's store would wait for it
#pragma unroll
  for (int u = 0; u < units; ++u) b1[u] = g.b1.value[first_unit + (u < my_units ? u : 0)];
  __syncthreads();
  for (index_t first = warp; first < g.batch; first += warps * forward_samples) {
    float sums[forward_samples][units] = {};
    const float* rows[forward_samples];
#pragma unroll
    for (int k = 0; k < forward_samples; ++k) {
      const index_t s = first + warps * k;
      rows[k] = g.x + (s < g.batch ? s : g.batch - 1) * g.in;
    }
#pragma unroll 4
    for (index_t f = lane; f < g.in; f += 32) {
      float w[units];
#pragma unroll
      for (int u = 0; u < units; ++u) w[u] = w1_rows[u * g.in + f];
#pragma unroll
      for (int k = 0; k < forward_samples; ++k) {
        const float value = rows[k][f];
#pragma unroll
        for (int u = 0; u < units; ++u) sums[k][u] += value * w[u];
      }
    }
    // Every group's sums are reduced, past the batch's end too, so that the reductions interleave; only the stores
    // are conditional.
#pragma unroll
    for (int k = 0; k < forward_samples; ++k) {
      const index_t s = first + warps * k;
#pragma unroll
      for (int u = 0; u < units; ++u) {
        const float total = warp_reduce(sums[k][u], sum_op{});
        if (lane == u && u < my_units && s < g.batch) {
          const float z = total + b1[u];
          const float h = z > 0.0f ? z : 0.0f;
          g.hidden_values[s * g.hidden + first_unit + u] = h;
          my_hidden[s * units + u] = h;
        }
      }
    }
  }
  cg::this_grid().sync();

  // Head, loss and dL/dlogits of the whole batch, in every block: a warp per group of samples, its lanes along the
  // hidden units. __ldcg reads the hidden values from L2, past this SM's L1, since other blocks wrote them during this
  // launch. The loss adds each warp's samples in increasing order.
  double block_loss = 0;
  const float b2 = g.b2.value[lane < g.out ? lane : 0];  // lane c adds b2[c]
  const bool vector_rows = g.hidden % 128 == 0 && reinterpret_cast<std::uintptr_t>(g.w2.value) % 16 == 0;
  for (index_t first = warp; first < g.batch; first += warps * head_samples) {
    float sums[head_samples][head_width] = {};
    const float* hidden[head_samples];
    std::int64_t labels[head_samples];
#pragma unroll
    for (int k = 0; k < head_samples; ++k) {
      const index_t s = first + warps * k;
      hidden[k] = g.hidden_values + (s < g.batch ? s : g.batch - 1) * g.hidden;
      labels[k] = g.labels[s < g.batch ? s : g.batch - 1];
    }
    // Every class of the kernel's width is summed, those past the head's end from W2's last row, so that no branch
    // stands between the loads (with one per class, each load of W2 would wait for the last).
    // Where the rows are whole 16-byte vectors (hidden a multiple of 128, W2 aligned), each lane reads four
    // consecutive units of a row in one load: one round trip for all the rows of the group.
    if (vector_rows) {
#pragma unroll 1
      for (index_t h = 4 * lane; h < g.hidden; h += 128) {
        float4 values[head_samples];
#pragma unroll
        for (int k = 0; k < head_samples; ++k) values[k] = __ldcg(reinterpret_cast<const float4*>(hidden[k] + h));
#pragma unroll
        for (int c = 0; c < head_width; ++c) {
          const float4 w = *reinterpret_cast<const float4*>(g.w2.value + (c < g.out ? c : g.out - 1) * g.hidden + h);
#pragma unroll
          for (int k = 0; k < head_samples; ++k) {
            sums[k][c] += values[k].x * w.x;
            sums[k][c] += values[k].y * w.y;
            sums[k][c] += values[k].z * w.z;
            sums[k][c] += values[k].w * w.w;
          }
        }
      }
    } else {
#pragma unroll 1
      for (index_t h = lane; h < g.hidden; h += 32) {
        float values[head_samples];
#pragma unroll
        for (int k = 0; k < head_samples; ++k) values[k] = __ldcg(hidden[k] + h);
#pragma unroll
        for (int c = 0; c < head_width; ++c) {
          const float w = g.w2.value[(c < g.out ? c : g.out - 1) * g.hidden + h];
#pragma unroll
          for (int k = 0; k < head_samples; ++k) sums[k][c] += values[k] * w;
        }
      }
    }
    // As in the forward, every sample of the group is reduced and only the effects are conditional.
#pragma unroll
    for (int k = 0; k < head_samples; ++k) {
      const index_t s = first + warps * k;
      const bool in_batch = s < g.batch;
      // The class sums as warp_reduce adds them, gathered so that lane c keeps logit c.
      const float total = warp_sum_scatter(sums[k]);
      const float logit = __shfl_sync(0xffffffffu, total, lane * (32 / head_width) % 32) + b2;
      const bool in_row = lane < g.out;
      const float max_value = warp_reduce(in_row ? logit : -INFINITY, max_op{});
      const float exp_sum = warp_reduce(in_row ? expf(logit - max_value) : 0.0f, sum_op{});
      const std::int64_t label = labels[k];
      const bool valid = label >= 0 && label < g.out;
      if (!valid && in_batch && lane == 0 && blockIdx.x == 0)
        atomicMin(reinterpret_cast<unsigned long long*>(g.bad_label), static_cast<unsigned long long>(s));
      const float label_logit = __shfl_sync(0xffffffffu, logit, valid ? int(label) : 0);
      // log(sum) - (x[label] - max) and (softmax - onehot) * factor, as softmax_cross_entropy_kernel computes them.
      if (lane == 0 && valid && in_batch) block_loss += double(logf(exp_sum) - (label_logit - max_value));
      if (in_row && in_batch) {
        const float factor = g.loss_scale;
        const float p = expf(logit - max_value) * (1.0f / exp_sum) * factor;
        dlogits[s * g.out + lane] = valid && lane == label ? p - factor : p;
      }
    }
  }
  block_loss = block_reduce(block_loss, sum_op{}, 0.0);  // also the barrier that publishes dlogits
  if (blockIdx.x == 0 && thread == 0) *g.loss = static_cast<float>(block_loss) * g.loss_scale;

  // Backward through this block's units: dL/dhidden (through the ReLU: the output is positive where it passed), the
  // head's weight columns, the biases. The block's own hidden values wait in shared memory since the forward.
  // Meanwhile block 0's last thread, idle in these loops when batch * units and out * units are below the block's
  // threads, computes the next step's bias corrections (two double-precision powers) into the slot this step does not
  // read.
  if (blockIdx.x == 0 && thread == fused_mlp_threads - 1)
    store_fused_bias_corrections(g.adam, step + 1, g.bias_corrections);
  for (index_t i = thread; i < g.batch * units; i += fused_mlp_threads) {
    const index_t s = i / units;
    const int u = int(i % units);
    float d = 0.0f;
    if (u < my_units) {
      const index_t h = first_unit + u;
      for (index_t c = 0; c < g.out; ++c) d += dlogits[s * g.out + c] * g.w2.value[c * g.hidden + h];
      if (!(my_hidden[i] > 0.0f)) d = 0.0f;
    }
    dhidden[i] = d;
  }
  for (index_t i = thread; i < g.out * units; i += fused_mlp_threads) {
    const index_t c = i / units;
    const int u = int(i % units);
    float d = 0.0f;
    if (u < my_units) {
#pragma unroll 16
      for (index_t s = 0; s < g.batch; ++s) d += dlogits[s * g.out + c] * my_hidden[s * units + u];
    }
    dw2_columns[i] = d;
  }
  __syncthreads();
  // dW1 rows, each thread two columns of inputs at once (two independent chains): dW1[u, f] = sum over samples of
  // dhidden[s, u] x[s, f]; then Adam. A column past the inputs' end reads the last one and stores nothing.
  for (index_t f0 = thread; f0 < g.in; f0 += 2 * fused_mlp_threads) {
    const index_t f1 = f0 + fused_mlp_threads < g.in ? f0 + fused_mlp_threads : g.in - 1;
    const int count1 = f0 + fused_mlp_threads < g.in ? my_units : 0;
    index_t index0[units], index1[units];
#pragma unroll
    for (int u = 0; u < units; ++u) {
      index0[u] = (first_unit + u) * g.in + f0;
      index1[u] = (first_unit + u) * g.in + f1;
    }
    fused_adam::state<units> state0, state1;
    adam.load(g.w1, index0, my_units, state0);
    adam.load(g.w1, index1, count1, state1);
    float sums0[units] = {}, sums1[units] = {};
#pragma unroll 16
    for (index_t s = 0; s < g.batch; ++s) {
      const float value0 = g.x[s * g.in + f0], value1 = g.x[s * g.in + f1];
#pragma unroll
      for (int u = 0; u < units; ++u) {
        sums0[u] += dhidden[s * units + u] * value0;
        sums1[u] += dhidden[s * units + u] * value1;
      }
    }
    adam.store(g.w1, index0, sums0, my_units, state0);
    adam.store(g.w1, index1, sums1, count1, state1);
  }
  // b1 on the last warp: the first warps hold the columns of a partial last pair.
  if (const int u = thread - (fused_mlp_threads - units); u >= 0 && u < my_units) {
    float d = 0.0f;
#pragma unroll 16
    for (index_t s = 0; s < g.batch; ++s) d += dhidden[s * units + u];
    adam.update(g.b1, first_unit + u, d);
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
#pragma unroll 16
      for (index_t s = 0; s < g.batch; ++s) d += dlogits[s * g.out + c];
      adam.update(g.b2, c, d);
    }
    if (thread == 0) *g.step = step;
  }
}

// Adam's bias corrections for the step after *step, where the fused step reads them.
__global__ void fused_mlp_prepare_adam_kernel(adam_step_args<float> a, const long long* step, float* bias_corrections) {
  store_fused_bias_corrections(a, *step + 1, bias_corrections);
}

}  // namespace detail

// Sets the bias corrections that the next fused step reads from its step count (once, before the first step; each
// step then sets them for the one after it).
inline void fused_mlp_prepare_adam(const fused_mlp_step_arguments& a) {
  detail::fused_mlp_prepare_adam_kernel<<<1, 1, 0, kiln::cuda::current_stream()>>>(a.adam, a.step, a.bias_corrections);
  KILN_CUDA_CHECK_LAUNCH();
}

// Blocks of a fused step over `hidden` units, `units` to a block.
inline index_t fused_mlp_blocks(index_t hidden, int units) { return (hidden + units - 1) / units; }

// The hidden units a block owns unless the caller chooses: the fewest of 2, 4 and 8 that need no more blocks than the
// device has SMs. Fewer units per block means more blocks at work, each reading the whole batch twice (forward and
// dW1), and less work in each; the spread over more SMs outweighs the extra reads (docs/benchmarks.md).
inline int fused_mlp_auto_units(index_t hidden) {
  for (int units : {2, 4})
    if (fused_mlp_blocks(hidden, units) <= kiln::cuda::multiprocessor_count()) return units;
  return 8;
}

namespace detail {
// The kernel for 1, 2, 4 or 8 units per block, its head as wide as a head of `out` classes needs.
template <int head_width>
inline const void* fused_mlp_kernel_for(int units) {
  switch (units) {
    case 1: return reinterpret_cast<const void*>(fused_mlp_step_kernel<1, head_width>);
    case 2: return reinterpret_cast<const void*>(fused_mlp_step_kernel<2, head_width>);
    case 4: return reinterpret_cast<const void*>(fused_mlp_step_kernel<4, head_width>);
    case 8: return reinterpret_cast<const void*>(fused_mlp_step_kernel<8, head_width>);
    default: fail("fused MLP step: expected 1, 2, 4 or 8 hidden units per block, found ", units);
  }
}
inline const void* fused_mlp_kernel_for(int units, index_t out) {
  return fused_mlp_head_width(out) == 16 ? fused_mlp_kernel_for<16>(units) : fused_mlp_kernel_for<32>(units);
}
}  // namespace detail

// Throws a kiln::error naming what does not fit: a head wider than 32 classes, a grid larger than the device holds at
// once (a cooperative launch needs every block resident), or shared memory beyond the block's limit.
inline void check_fused_mlp(index_t batch, index_t in, index_t hidden, index_t out, int units) {
  if (out < 1 || out > fused_mlp_max_out)
    fail("fused MLP step: expected at most ", fused_mlp_max_out, " outputs (a warp's lanes), found ", out);
  const void* kernel = detail::fused_mlp_kernel_for(units, out);
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
// the sizes (check_fused_mlp with the largest batch). The step clears *bad_label itself.
inline void fused_mlp_step(const fused_mlp_step_arguments& arguments, int units) {
  const fused_mlp_step_arguments& a = arguments;
  const std::size_t shared_bytes =
      std::size_t(detail::fused_mlp_shared_floats(units, a.batch, a.in, a.out)) * sizeof(float);
  void* parameters[] = {const_cast<fused_mlp_step_arguments*>(&a)};
  KILN_CUDA_CHECK(cudaLaunchCooperativeKernel(detail::fused_mlp_kernel_for(units, a.out),
                                              dim3(unsigned(fused_mlp_blocks(a.hidden, units))),
                                              dim3(fused_mlp_threads), parameters, shared_bytes,
                                              kiln::cuda::current_stream()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::kernels::cuda
