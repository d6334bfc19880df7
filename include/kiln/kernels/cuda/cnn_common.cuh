// What the CNN and recurrent CUDA kernels add to launch.cuh: launching a plain __global__ function over n elements
// (grid-stride) or with one block per item (a channel, a row, a plane), and the block-wide sum of two values that the
// per-channel and per-row reductions (batch norm, layer norm, channel sums) are built on.
#pragma once

#include <type_traits>

#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda::detail {

// Launches kernel over n elements on the kiln stream (nothing for n <= 0); the kernel loops from global_thread() in
// steps of global_threads().
template <class Kernel, class... Args>
void launch_elementwise(index_t n, Kernel kernel, Args... args) {
  if (n <= 0) return;
  kernel<<<grid_for(n), block_threads, 0, kiln::cuda::current_stream()>>>(args...);
  KILN_CUDA_CHECK_LAUNCH();
}
// Launches kernel with one block of block_threads threads per item (nothing for items <= 0).
template <class Kernel, class... Args>
void launch_per_item(index_t items, Kernel kernel, Args... args) {
  if (items <= 0) return;
  kernel<<<static_cast<unsigned>(items), block_threads, 0, kiln::cuda::current_stream()>>>(args...);
  KILN_CUDA_CHECK_LAUNCH();
}

// a and b summed over the block, each in the fixed order of block_reduce; every thread gets both sums and must call.
template <class S>
__device__ inline void block_sum2(S& a, S& b) {
  a = block_reduce(a, sum_op{}, S(0));
  b = block_reduce(b, sum_op{}, S(0));
}

// Accumulator of the CUDA reductions, as the CPU's sum_type: double for float data.
template <class T>
using cuda_sum_type = std::conditional_t<(sizeof(T) < sizeof(double)), double, T>;

}  // namespace kiln::kernels::cuda::detail
