// Dropout on the GPU with the CPU's mask, bit for bit. The CPU kernel (kernels/cpu/dropout.hpp) gives element i the
// generator's next 32-bit number, i.e. number (position + i) of its Philox stream; here element i computes that same
// number (core/random.hpp's philox4x32_rounds), and the host generator is then moved past the n numbers used, so CPU
// and GPU runs from one seed drop the same elements and stay on the same stream afterwards.
//
// One Philox block gives four consecutive numbers, so one thread computes one block and serves the (up to) four
// elements that draw from it: a quarter of the arithmetic of one block per element.
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/random.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace detail {

template <class T>
__global__ void dropout_forward_kernel(const T* x, T* y, T* mask, index_t n, random_stream_position start,
                                       std::uint32_t threshold, T keep_scale) {
  const std::uint64_t first_block = start.position >> 2;
  const std::uint64_t blocks = ((start.position + std::uint64_t(n) - 1) >> 2) - first_block + 1;
  for (std::uint64_t b = global_thread(); b < blocks; b += global_threads()) {
    const std::uint64_t block = first_block + b;
    std::uint32_t draw[4] = {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                             static_cast<std::uint32_t>(start.stream), static_cast<std::uint32_t>(start.stream >> 32)};
    philox4x32_rounds(draw[0], draw[1], draw[2], draw[3], static_cast<std::uint32_t>(start.seed),
                      static_cast<std::uint32_t>(start.seed >> 32));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      // Element i draws number position + i; this block holds numbers 4 block .. 4 block + 3.
      const std::int64_t i = static_cast<std::int64_t>(block * 4 + lane - start.position);
      if (i < 0 || i >= n) continue;
      const T m = (draw[lane] >> 8) >= threshold ? keep_scale : T(0);
      mask[i] = m;
      y[i] = x[i] * m;
    }
  }
}

template <class T>
struct dropout_backward_op {
  const T *dy, *mask;
  T* dx;
  bool accumulate;
  template <int W>
  __device__ void apply(index_t i) const {
    const vec<T, W> g = load<W>(dy + i), m = load<W>(mask + i);
    vec<T, W> out{};
    if (accumulate) out = load<W>(dx + i);
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = accumulate ? out.v[k] + g.v[k] * m.v[k] : g.v[k] * m.v[k];
    store<W>(dx + i, out);
  }
};

}  // namespace detail

// The dropout kernels of the CUDA policies.
struct dropout_kernels {
  // mask[i] = 1 / (1 - p) with probability 1 - p, else 0; y = x * mask. p = 1 drops everything. rng moves past the
  // n numbers drawn.
  template <class T>
  static void dropout_forward(const T* x, T* y, T* mask, index_t n, T p, random_generator& rng) {
    if (n <= 0) return;
    // The CPU's threshold and scale, computed the CPU's way: keep when the 24-bit uniform bits / 2^24 >= p.
    const T keep_scale = p < T(1) ? T(1) / (T(1) - p) : T(0);
    const double scaled = std::ceil(static_cast<double>(p) * 16777216.0);
    const std::uint32_t threshold =
        scaled >= 16777216.0 ? (1u << 24) : static_cast<std::uint32_t>(scaled > 0 ? scaled : 0);
    const random_stream_position start = random_stream_position_of(rng);
    const index_t blocks = index_t(((start.position + std::uint64_t(n) - 1) >> 2) - (start.position >> 2) + 1);
    detail::dropout_forward_kernel<<<detail::grid_for(blocks), detail::block_threads, 0,
                                     kiln::cuda::current_stream()>>>(x, y, mask, n, start, threshold, keep_scale);
    KILN_CUDA_CHECK_LAUNCH();
    advance(rng, static_cast<std::uint64_t>(n));
  }
  // dx (+)= dy * mask.
  template <class T>
  static void dropout_backward(const T* dy, const T* mask, T* dx, index_t n, bool accumulate) {
    detail::launch_map<T>(n, detail::dropout_backward_op<T>{dy, mask, dx, accumulate}, dy, mask, dx);
  }
};

}  // namespace kiln::kernels::cuda
