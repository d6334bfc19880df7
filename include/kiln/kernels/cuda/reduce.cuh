// Reductions on the GPU: column sums (a Dense layer's bias gradient) and the full sums that return a scalar to the
// host (sum, sum_abs, sum_squares, and through the same machinery the losses).
//
// A full sum runs in two passes, both in double as the CPU's sum_type: the first pass gives one partial per block
// (grid-stride, then a block tree), the second adds the partials in one block. The shape of both is fixed for a given n
// and device, so a sum does not change from run to run (no atomics). Its result goes through a small pinned slot and
// the host waits for it: these functions synchronise. The scratch they need is allocated once, on first use.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <mutex>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/caching_allocator.cuh"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/pinned_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

namespace detail {

// What the second pass of a full reduction hands back: the sum, and the first index a kernel flagged as invalid
// (LLONG_MAX when none: softmax_cross_entropy flags labels out of range this way).
struct reduce_result {
  double value;
  long long flagged;
};
inline constexpr long long no_flag = LLONG_MAX;

// The device and pinned memory of the full reductions, shared by all of them (they run in stream order).
class reduce_scratch {
 public:
  double* partials() { return static_cast<double*>(partials_.data); }
  long long* flag() { return static_cast<long long*>(flag_.data); }
  reduce_result* device_result() { return static_cast<reduce_result*>(result_.data); }
  reduce_result* host_result() { return host_.data(); }
  std::mutex& mutex() { return mutex_; }

  static reduce_scratch& instance() {
    static reduce_scratch* scratch = new reduce_scratch;  // never destroyed: see the caching allocator
    return *scratch;
  }

 private:
  reduce_scratch()
      : partials_(kiln::cuda::allocate_device(sizeof(double) * max_reduce_blocks)),
        flag_(kiln::cuda::allocate_device(sizeof(long long))),
        result_(kiln::cuda::allocate_device(sizeof(reduce_result))),
        host_(1) {
    const long long none = no_flag;
    KILN_CUDA_CHECK(cudaMemcpyAsync(flag_.data, &none, sizeof none, cudaMemcpyHostToDevice,
                                    kiln::cuda::current_stream()));
    KILN_CUDA_CHECK(cudaStreamSynchronize(kiln::cuda::current_stream()));  // `none` lives on this stack frame
  }

  kiln::cuda::device_block partials_, flag_, result_;
  kiln::cuda::pinned_buffer<reduce_result> host_;
  std::mutex mutex_;
};

// The blocks of a first pass over n items: enough to fill the device, at most max_reduce_blocks.
inline unsigned reduce_blocks(index_t n) {
  return std::min<unsigned>(grid_for(n), static_cast<unsigned>(max_reduce_blocks));
}

// First pass: partials[block] = sum of term(i) over the block's share of [0, n).
template <class Term>
__global__ void partial_sums_kernel(index_t n, Term term, double* partials) {
  double total = 0;
  for (index_t i = global_thread(); i < n; i += global_threads()) total += term(i);
  total = block_reduce(total, sum_op{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Second pass, one block: adds `count` partials in a fixed order; hands the flag over and resets it for the next
// reduction. With `out` set, also stores T(total) * scale there (a loss that stays on the device).
template <class T>
__global__ void finish_sum_kernel(const double* partials, int count, long long* flag, reduce_result* result, T* out,
                                  T scale) {
  double total = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) total += partials[i];
  total = block_reduce(total, sum_op{}, 0.0);
  if (threadIdx.x == 0) {
    result->value = total;
    result->flagged = *flag;
    *flag = no_flag;
    if (out) *out = static_cast<T>(total) * scale;
  }
}

// Runs the second pass over the first pass's `blocks` partials and returns the result on the host (synchronises).
// The caller holds the scratch's mutex.
inline reduce_result finish_on_host(reduce_scratch& s, unsigned blocks) {
  const cudaStream_t stream = kiln::cuda::current_stream();
  finish_sum_kernel<double><<<1, block_threads, 0, stream>>>(s.partials(), int(blocks), s.flag(), s.device_result(),
                                                             nullptr, 0.0);
  KILN_CUDA_CHECK_LAUNCH();
  KILN_CUDA_CHECK(cudaMemcpyAsync(s.host_result(), s.device_result(), sizeof(reduce_result), cudaMemcpyDeviceToHost,
                                  stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *s.host_result();
}
// Runs the second pass and leaves T(total) * scale in device memory at `out`, without waiting.
template <class T>
void finish_on_device(reduce_scratch& s, unsigned blocks, T* out, T scale) {
  finish_sum_kernel<T><<<1, block_threads, 0, kiln::cuda::current_stream()>>>(s.partials(), int(blocks), s.flag(),
                                                                              s.device_result(), out, scale);
  KILN_CUDA_CHECK_LAUNCH();
}

// sum over i < n of term(i), in double, returned on the host.
template <class Term>
double sum_of(index_t n, const Term& term) {
  if (n <= 0) return 0;
  auto& s = reduce_scratch::instance();
  std::lock_guard lock(s.mutex());
  const unsigned blocks = reduce_blocks(n);
  partial_sums_kernel<<<blocks, block_threads, 0, kiln::cuda::current_stream()>>>(n, term, s.partials());
  KILN_CUDA_CHECK_LAUNCH();
  return finish_on_host(s, blocks).value;
}

template <class T>
struct value_term {
  const T* x;
  __device__ double operator()(index_t i) const { return double(x[i]); }
};
template <class T>
struct abs_term {
  const T* x;
  __device__ double operator()(index_t i) const { return double(x[i] < T(0) ? -x[i] : x[i]); }
};
template <class T>
struct square_term {
  const T* x;
  __device__ double operator()(index_t i) const { return double(x[i]) * x[i]; }
};

// Column sums, one thread per column, in the CPU's order, bit for bit (kernels/cpu/reduce.hpp): the CPU takes the
// columns in strips of 4 vectors of cpu_width lanes, and a strip of v vectors sums its rows in 4, 2 or 1 interleaved
// chains (v = 1, 2, more), chain k taking the rows k, k + chains, ..., added pairwise at the end and then to the old
// value. The order thus depends on the host's vector width, which the caller passes.
template <class T>
__global__ void sum_rows_sequential_kernel(const T* x, T* sums, index_t rows, index_t cols, bool accumulate,
                                           int cpu_width) {
  for (index_t c = global_thread(); c < cols; c += global_threads()) {
    const index_t strip_start = c / (4 * cpu_width) * (4 * cpu_width);
    const index_t strip = cols - strip_start < 4 * cpu_width ? cols - strip_start : 4 * cpu_width;
    const int chains = cpu::reduce_kernels::sum_rows_chains(int((strip + cpu_width - 1) / cpu_width));
    T chain[4] = {T(0), T(0), T(0), T(0)};
    for (index_t r = 0; r < rows; ++r) {
      const T v = x[r * cols + c];
      // A run-time index would put chain[] in local memory; the unrolled compare keeps it in registers.
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (k == int(r % chains)) chain[k] += v;
    }
    T total = chain[0];
    if (chains == 2) total = chain[0] + chain[1];
    if (chains == 4) total = (chain[0] + chain[1]) + (chain[2] + chain[3]);
    sums[c] = accumulate ? sums[c] + total : total;
  }
}

// Column sums for tall, narrow matrices: a block of 32 columns x 8 row lanes, each lane summing every 8th row in
// double, the 8 lanes then added in order.
inline constexpr int sum_rows_lanes = block_threads / 32;
template <class T>
__global__ void sum_rows_tiled_kernel(const T* x, T* sums, index_t rows, index_t cols, bool accumulate) {
  __shared__ double lanes[sum_rows_lanes][32];
  const index_t c = index_t(blockIdx.x) * 32 + threadIdx.x % 32;
  const int lane = threadIdx.x / 32;
  double total = 0;
  if (c < cols)
    for (index_t r = lane; r < rows; r += sum_rows_lanes) total += double(x[r * cols + c]);
  lanes[lane][threadIdx.x % 32] = total;
  __syncthreads();
  if (lane == 0 && c < cols) {
    double column = 0;
    for (int l = 0; l < sum_rows_lanes; ++l) column += lanes[l][threadIdx.x];
    sums[c] = accumulate ? sums[c] + static_cast<T>(column) : static_cast<T>(column);
  }
}

}  // namespace detail

// The reduction kernels of the CUDA policies. sum, sum_abs and sum_squares return on the host (they synchronise).
struct reduce_kernels {
  // column_sums[c] (+)= sum over rows of x[r, c]: the bias gradient of a Dense layer.
  template <class T>
  static void sum_rows(const T* x, T* column_sums, index_t rows, index_t cols, bool accumulate) {
    if (cols <= 0) return;
    const cudaStream_t stream = kiln::cuda::current_stream();
    // Few rows, or columns enough to fill the device: the CPU's order, so CPU and GPU bias gradients agree exactly.
    if (rows <= 1024 || cols >= 16384) {
      detail::sum_rows_sequential_kernel<<<detail::grid_for(cols), detail::block_threads, 0, stream>>>(
          x, column_sums, rows, cols, accumulate, cpu::gemm_detail::simd<T>::width);
    } else {
      const auto blocks = static_cast<unsigned>((cols + 31) / 32);
      detail::sum_rows_tiled_kernel<<<blocks, detail::block_threads, 0, stream>>>(x, column_sums, rows, cols,
                                                                                 accumulate);
    }
    KILN_CUDA_CHECK_LAUNCH();
  }
  template <class T>
  static T sum(const T* x, index_t n) {
    return static_cast<T>(detail::sum_of(n, detail::value_term<T>{x}));
  }
  template <class T>
  static T sum_abs(const T* x, index_t n) {
    return static_cast<T>(detail::sum_of(n, detail::abs_term<T>{x}));
  }
  template <class T>
  static T sum_squares(const T* x, index_t n) {
    return static_cast<T>(detail::sum_of(n, detail::square_term<T>{x}));
  }
};

}  // namespace kiln::kernels::cuda
