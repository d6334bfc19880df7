// Scaled dot-product attention on the GPU, forward and backward, without the score matrix: the online softmax of
// FlashAttention (Dao et al., 2022) with one warp per query row (forward, dq) or per key row (dk, dv), in kiln's own
// CUDA. policy::cuda's attention_forward / attention_backward, so both modes' attention (scaled_dot_product_attention,
// nn::MultiheadAttention, static mode's MultiheadSelfAttention) run it on the GPU.
//
// Layout and assumptions:
// - q [B, L, E], k [B, S, E], v [B, S, Ev], out [B, L, Ev], lse [B, L]: contiguous, row-major, in device memory, as
//   the CPU kernel (kernels/cpu/attention.hpp) takes them; E and Ev at most max_head_dim (each lane holds
//   max_head_dim / 32 of a row's accumulators in registers).
// - The mask is read in place through the problem's strides; its per-batch offsets (mask_offset, on the host as the
//   CPU kernel takes them) are copied to the device for the call.
// - The forward keeps lse, each query's log-sum-exp of its masked scores, for the backward, which computes the scores
//   again: nothing of size L x S is ever stored. The backward runs three kernels: each query's dO . O (the softmax
//   backward's term, [B, L] of scratch), dq (one warp per query), then dk and dv (one warp per key), each summing in
//   a fixed order: no atomics, the same bits on every run.
// - The formulas (masking, the online softmax's exponentials, dropout's draw of weight (b, i, j)) are
//   kernels/attention_math.hpp's, the CPU kernel's; the order of the sums differs from the CPU's, so results agree to
//   float rounding, not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/attention_math.hpp"
#include "kiln/kernels/cpu/attention.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace attention_detail {

inline constexpr int warps_per_block = 4;
inline constexpr index_t max_head_dim = 256;
inline constexpr int chunks = int(max_head_dim / 32);

template <class T>
__device__ inline T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <class T>
__device__ inline T warp_max(T v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const T o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = v < o ? o : v;
  }
  return v;
}
// a . b over n values, a in shared memory (the warp's own row), b in global memory.
template <class T>
__device__ inline T dot(const T* a, const T* b, index_t n) {
  T s = T(0);
  for (index_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// The masked, scaled score of query i and key j of batch b (-inf where the mask or the causal cut excludes it).
template <class T>
__device__ inline T score(const cpu::attention_problem<T>& p, const index_t* mask_offset, index_t b, index_t i,
                          index_t j, T dot_qk) {
  if (p.causal && !attention_causal_keeps(i, j)) return T(-INFINITY);
  const T mask = p.mask_kind == attention_mask_kind::none
                     ? T(0)
                     : p.mask[mask_offset[b] + i * p.mask_row_stride + j * p.mask_col_stride];
  return attention_masked_score(p.scale * dot_qk, p.mask_kind, mask);
}
// The dropout factor of weight (b, i, j): 1 without dropout.
template <class T>
__device__ inline T dropout_factor(const cpu::attention_problem<T>& p, T keep_scale, index_t b, index_t i,
                                   index_t j) {
  if (!p.dropout.active) return T(1);
  return attention_dropout_factor(p.dropout, keep_scale,
                                  static_cast<std::uint64_t>((b * p.queries + i) * p.keys + j));
}
template <class T>
__device__ inline void store(T* to, T value, bool accumulate) {
  *to = accumulate ? *to + value : value;
}

// One warp per query row i of batch b (blockIdx.y): out_i and lse_i. Shared memory: the warps' q rows.
template <class T>
__global__ void forward_kernel(cpu::attention_problem<T> p, const index_t* mask_offset, T* out, T* lse) {
  extern __shared__ unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const index_t b = blockIdx.y, i = index_t(blockIdx.x) * warps_per_block + warp;
  if (i >= p.queries) return;
  const index_t E = p.head_dim, Ev = p.value_dim, S = p.keys;
  T* q = shared + warp * E;
  for (index_t d = lane; d < E; d += 32) q[d] = p.q[(b * p.queries + i) * E + d];
  __syncwarp();
  const T keep_scale = attention_keep_scale<T>(p.dropout);
  T acc[chunks];
  for (int c = 0; c < chunks; ++c) acc[c] = T(0);
  T running_max = T(-INFINITY), running_sum = T(0);
  const index_t end = p.causal ? (i + 1 < S ? i + 1 : S) : S;
  for (index_t j0 = 0; j0 < end; j0 += 32) {
    const index_t j = j0 + lane;
    const T s = j < end ? score(p, mask_offset, b, i, j, dot(q, p.k + (b * S + j) * E, E)) : T(-INFINITY);
    const T tile_max = warp_max(s);
    const T new_max = tile_max < running_max ? running_max : tile_max;
    const T rescale = attention_exp(running_max, new_max);
    T weight = j < end ? attention_exp(s, new_max) : T(0);
    running_sum = running_sum * rescale + warp_sum(weight);
    running_max = new_max;
    if (j < end) weight *= dropout_factor(p, keep_scale, b, i, j);
    for (int c = 0; c < chunks; ++c) acc[c] *= rescale;
    const index_t count = end - j0 < 32 ? end - j0 : 32;
    for (index_t t = 0; t < count; ++t) {
      const T w = __shfl_sync(0xffffffffu, weight, int(t));
      const T* v = p.v + (b * S + j0 + t) * Ev;
      for (int c = 0; c < chunks; ++c) {
        const index_t d = lane + 32 * c;
        if (d < Ev) acc[c] += w * v[d];
      }
    }
  }
  const T inverse = running_sum > T(0) ? T(1) / running_sum : T(0);
  for (int c = 0; c < chunks; ++c) {
    const index_t d = lane + 32 * c;
    if (d < Ev) out[(b * p.queries + i) * Ev + d] = acc[c] * inverse;
  }
  if (lane == 0) lse[b * p.queries + i] = attention_logsumexp(running_max, running_sum);
}

// D_i = dO_i . O_i, the softmax backward's term of every query row, once for both gradient kernels: one warp a row.
template <class T>
__global__ void delta_kernel(index_t rows, index_t Ev, const T* out, const T* dout, T* delta) {
  const int lane = int(threadIdx.x % 32);
  const index_t row = index_t(blockIdx.x) * warps_per_block + index_t(threadIdx.x / 32);
  if (row >= rows) return;
  T partial = T(0);
  for (index_t d = lane; d < Ev; d += 32) partial += dout[row * Ev + d] * out[row * Ev + d];
  const T sum = warp_sum(partial);
  if (lane == 0) delta[row] = sum;
}

// dq: one warp per query row. dS_ij = P_ij (f_ij dO_i . v_j - D_i), dq_i = scale sum_j dS_ij k_j. Shared memory: the
// warps' q and dO rows.
template <class T>
__global__ void dq_kernel(cpu::attention_problem<T> p, const index_t* mask_offset, const T* lse, const T* delta,
                          const T* dout, cpu::attention_grad<T> dq) {
  extern __shared__ unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const index_t b = blockIdx.y, i = index_t(blockIdx.x) * warps_per_block + warp;
  if (i >= p.queries) return;
  const index_t E = p.head_dim, Ev = p.value_dim, S = p.keys, row = b * p.queries + i;
  T* q = shared + warp * (E + Ev);
  T* g = q + E;
  for (index_t d = lane; d < E; d += 32) q[d] = p.q[row * E + d];
  for (index_t d = lane; d < Ev; d += 32) g[d] = dout[row * Ev + d];
  const T D = delta[row];
  __syncwarp();
  const T keep_scale = attention_keep_scale<T>(p.dropout);
  const T m = lse[row];
  T acc[chunks];
  for (int c = 0; c < chunks; ++c) acc[c] = T(0);
  const index_t end = m == T(-INFINITY) ? 0 : (p.causal ? (i + 1 < S ? i + 1 : S) : S);
  for (index_t j0 = 0; j0 < end; j0 += 32) {
    const index_t j = j0 + lane;
    T ds = T(0);
    if (j < end) {
      const T s = score(p, mask_offset, b, i, j, dot(q, p.k + (b * S + j) * E, E));
      const T weight = attention_exp(s, m);
      const T dp = dropout_factor(p, keep_scale, b, i, j) * dot(g, p.v + (b * S + j) * Ev, Ev);
      ds = weight * (dp - D);
    }
    const index_t count = end - j0 < 32 ? end - j0 : 32;
    for (index_t t = 0; t < count; ++t) {
      const T w = __shfl_sync(0xffffffffu, ds, int(t));
      const T* k = p.k + (b * S + j0 + t) * E;
      for (int c = 0; c < chunks; ++c) {
        const index_t d = lane + 32 * c;
        if (d < E) acc[c] += w * k[d];
      }
    }
  }
  for (int c = 0; c < chunks; ++c) {
    const index_t d = lane + 32 * c;
    if (d < E) store(dq.data + row * E + d, p.scale * acc[c], dq.accumulate);
  }
}

// dk and dv: one warp per key row j of batch b. dv_j = sum_i P_ij f_ij dO_i, dk_j = scale sum_i dS_ij q_i. Shared
// memory: the warps' k and v rows. dk is stored before dv, so that a k and v that are one tensor add in turn.
template <class T>
__global__ void dkdv_kernel(cpu::attention_problem<T> p, const index_t* mask_offset, const T* lse, const T* delta,
                            const T* dout, cpu::attention_grad<T> dk, cpu::attention_grad<T> dv) {
  extern __shared__ unsigned char shared_bytes[];
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const index_t b = blockIdx.y, j = index_t(blockIdx.x) * warps_per_block + warp;
  if (j >= p.keys) return;
  const index_t E = p.head_dim, Ev = p.value_dim, L = p.queries, key_row = b * p.keys + j;
  T* k = shared + warp * (E + Ev);
  T* v = k + E;
  for (index_t d = lane; d < E; d += 32) k[d] = p.k[key_row * E + d];
  for (index_t d = lane; d < Ev; d += 32) v[d] = p.v[key_row * Ev + d];
  __syncwarp();
  const T keep_scale = attention_keep_scale<T>(p.dropout);
  T acc_k[chunks], acc_v[chunks];
  for (int c = 0; c < chunks; ++c) acc_k[c] = acc_v[c] = T(0);
  const index_t start = p.causal ? (j < L ? j : L) : 0;  // under is_causal only queries i >= j see key j
  for (index_t i0 = start; i0 < L; i0 += 32) {
    const index_t i = i0 + lane;
    T ds = T(0), pv = T(0);
    if (i < L) {
      const index_t row = b * L + i;
      const T m = lse[row];
      if (m != T(-INFINITY)) {
        const T s = score(p, mask_offset, b, i, j, dot(k, p.q + row * E, E));
        const T weight = attention_exp(s, m);
        const T f = dropout_factor(p, keep_scale, b, i, j);
        ds = weight * (f * dot(v, dout + row * Ev, Ev) - delta[row]);
        pv = weight * f;
      }
    }
    const index_t count = L - i0 < 32 ? L - i0 : 32;
    for (index_t t = 0; t < count; ++t) {
      const T ws = __shfl_sync(0xffffffffu, ds, int(t)), wv = __shfl_sync(0xffffffffu, pv, int(t));
      const index_t row = b * L + i0 + t;
      for (int c = 0; c < chunks; ++c) {
        const index_t d = lane + 32 * c;
        if (d < E) acc_k[c] += ws * p.q[row * E + d];
        if (d < Ev) acc_v[c] += wv * dout[row * Ev + d];
      }
    }
  }
  for (int c = 0; c < chunks; ++c) {
    const index_t d = lane + 32 * c;
    if (dk.data && d < E) store(dk.data + key_row * E + d, p.scale * acc_k[c], dk.accumulate);
  }
  __syncwarp();
  for (int c = 0; c < chunks; ++c) {
    const index_t d = lane + 32 * c;
    if (dv.data && d < Ev) store(dv.data + key_row * Ev + d, acc_v[c], dv.accumulate);
  }
}

// The problem's checks, and its mask offsets on the device (empty without a mask).
template <class T>
kiln::cuda::device_buffer<index_t> prepare(const cpu::attention_problem<T>& p, const char* where) {
  if (p.head_dim > max_head_dim || p.value_dim > max_head_dim)
    fail(where, ": the CUDA attention kernel takes head dimensions up to ", max_head_dim, ", found ", p.head_dim,
         " and ", p.value_dim);
  if (p.batch > 65535) fail(where, ": the CUDA attention kernel takes at most 65535 batch entries, found ", p.batch);
  kiln::cuda::device_buffer<index_t> offsets;
  if (p.mask_kind != attention_mask_kind::none) {
    offsets = kiln::cuda::device_buffer<index_t>(p.batch);
    kiln::cuda::copy_to_device(p.mask_offset, offsets.data(), p.batch);
  }
  return offsets;
}
inline dim3 rows_grid(index_t rows, index_t batch) {
  return dim3(static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block), static_cast<unsigned>(batch));
}

}  // namespace attention_detail

struct attention_kernels {
  template <class T>
  static void attention_forward(const cpu::attention_problem<T>& p, T* out, T* lse) {
    namespace ad = attention_detail;
    if (p.batch == 0 || p.queries == 0) return;
    const auto offsets = ad::prepare(p, "attention_forward");
    const std::size_t shared = sizeof(T) * std::size_t(ad::warps_per_block * p.head_dim);
    ad::forward_kernel<T><<<ad::rows_grid(p.queries, p.batch), 32 * ad::warps_per_block, shared,
                            kiln::cuda::current_stream()>>>(p, offsets.data(), out, lse);
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static void attention_backward(const cpu::attention_problem<T>& p, const T* out, const T* lse, const T* dout,
                                 const cpu::attention_grad<T>& dq, const cpu::attention_grad<T>& dk,
                                 const cpu::attention_grad<T>& dv) {
    namespace ad = attention_detail;
    if (p.batch == 0) return;
    const auto offsets = ad::prepare(p, "attention_backward");
    const std::size_t shared = sizeof(T) * std::size_t(ad::warps_per_block * (p.head_dim + p.value_dim));
    const cudaStream_t stream = kiln::cuda::current_stream();
    const index_t rows = p.batch * p.queries;
    kiln::cuda::device_buffer<T> delta(rows);
    if (rows > 0) {
      ad::delta_kernel<T><<<ad::rows_grid(rows, 1), 32 * ad::warps_per_block, 0, stream>>>(rows, p.value_dim, out, dout,
                                                                                        delta.data());
      KILN_CUDA_CHECK_LAUNCH();
    }
    if (p.queries > 0 && dq.data) {
      ad::dq_kernel<T><<<ad::rows_grid(p.queries, p.batch), 32 * ad::warps_per_block, shared, stream>>>(
          p, offsets.data(), lse, delta.data(), dout, dq);
      KILN_CUDA_CHECK_LAUNCH();
    }
    if (p.keys > 0 && (dk.data || dv.data)) {
      ad::dkdv_kernel<T><<<ad::rows_grid(p.keys, p.batch), 32 * ad::warps_per_block, shared, stream>>>(
          p, offsets.data(), lse, delta.data(), dout, dk, dv);
      KILN_CUDA_CHECK_LAUNCH();
    }
  }
};

}  // namespace kiln::kernels::cuda
