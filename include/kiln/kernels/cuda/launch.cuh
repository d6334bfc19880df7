// What kiln's CUDA kernels share: launch shapes, grid-stride loops, 128-bit vector loads and stores, and block-wide
// reductions in a fixed order (so sums do not change from run to run).
//
// Element-wise kernels are written once as an "op": a struct whose apply<W>(i) handles elements [i, i + W). launch_map
// runs it with W = 16 bytes / sizeof(T) (one 128-bit load per array) when every array it touches is 16-byte aligned,
// and with W = 1 otherwise; the tail that does not fill a vector runs with W = 1 in the same launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/stream.cuh"

namespace kiln::kernels::cuda::detail {

// Threads per block of the element-wise kernels and of the reductions.
inline constexpr int block_threads = 256;
// Most blocks a reduction's first pass uses: its partial sums are then added by one block.
inline constexpr int max_reduce_blocks = 1024;

// Blocks for a grid-stride loop over `items` work items: as many as the work needs, at most enough for a few waves of
// full occupancy (more blocks would only loop less).
inline unsigned grid_for(index_t items, int threads = block_threads) {
  const index_t needed = (items + threads - 1) / threads;
  const index_t cap = index_t(kiln::cuda::multiprocessor_count()) * (2048 / threads) * 4;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, std::max<index_t>(cap, 1)));
}

// A grid for kernels over a rows x cols matrix whose threads run along the columns (x, coalesced) and whose blocks
// stride over the rows (y): as many blocks in all as grid_for would give for the whole matrix.
inline dim3 matrix_grid(index_t rows, index_t cols) {
  const index_t column_blocks = std::clamp<index_t>((cols + block_threads - 1) / block_threads, 1, 65535);
  const index_t row_blocks = std::clamp<index_t>(index_t(grid_for(rows * cols)) / column_blocks, 1, 65535);
  return dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(std::clamp<index_t>(rows, 1, row_blocks)));
}

__device__ inline index_t global_thread() { return index_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline index_t global_threads() { return index_t(gridDim.x) * blockDim.x; }

// W values of T loaded or stored at once: 16 bytes (one LDG.128 / STG.128) when W * sizeof(T) == 16.
template <class T, int W>
struct alignas(sizeof(T) * W) vec {
  T v[W];
};
template <int W, class T>
__device__ inline vec<T, W> load(const T* p) {
  return *reinterpret_cast<const vec<T, W>*>(p);
}
template <int W, class T>
__device__ inline void store(T* p, const vec<T, W>& x) {
  *reinterpret_cast<vec<T, W>*>(p) = x;
}

template <int W, class Op>
__global__ void map_kernel(index_t n, Op op) {
  const index_t packs = n / W;
  const index_t first = global_thread(), stride = global_threads();
  for (index_t p = first; p < packs; p += stride) op.template apply<W>(p * W);
  if constexpr (W > 1)
    for (index_t i = packs * W + first; i < n; i += stride) op.template apply<1>(i);
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Runs op over n elements on the kiln stream, vectorised when every pointer given is 16-byte aligned (null pointers,
// for optional arrays, count as aligned).
template <class T, class Op, class... Pointers>
void launch_map(index_t n, const Op& op, const Pointers*... pointers) {
  if (n <= 0) return;
  constexpr int W = 16 / int(sizeof(T)) > 0 ? 16 / int(sizeof(T)) : 1;
  const cudaStream_t stream = kiln::cuda::current_stream();
  if (W > 1 && n >= W && (aligned16(pointers) && ...))
    map_kernel<W><<<grid_for((n + W - 1) / W), block_threads, 0, stream>>>(n, op);
  else
    map_kernel<1><<<grid_for(n), block_threads, 0, stream>>>(n, op);
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- reductions -----------------------------------------------------------------------------------------------------

struct sum_op {
  template <class S>
  __device__ S operator()(S a, S b) const {
    return a + b;
  }
};
struct max_op {
  template <class S>
  __device__ S operator()(S a, S b) const {
    return a > b ? a : b;
  }
};

// Reduces v over the 32 lanes of a warp; every lane gets the result. A butterfly in a fixed pattern: deterministic.
template <class S, class Op>
__device__ inline S warp_reduce(S v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduces v over the block_threads threads of a block; every thread gets the result. Every thread must call it.
template <class S, class Op>
__device__ inline S block_reduce(S v, Op op, S identity) {
  __shared__ S partial[block_threads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call may still be reading partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < block_threads / 32 ? partial[lane] : identity;
  return warp_reduce(v, op);
}

}  // namespace kiln::kernels::cuda::detail
