// What the GPU benches share: the median time of a call on the GPU, from CUDA events on the kiln stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"

namespace kiln::bench {

// Median seconds per call of f on the GPU: events around `calls` back-to-back calls, calls chosen so that one
// repetition lasts >= min_seconds.
double gpu_seconds_per_call(const std::function<void()>& f, int repetitions, double min_seconds) {
  const cudaStream_t stream = kiln::cuda::current_stream();
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  auto time_calls = [&](long calls) {
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    for (long i = 0; i < calls; ++i) f();
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) * 1e-3;
  };
  time_calls(2);  // warm-up: plan caches, heuristics, clocks
  long calls = 1;
  for (;;) {
    const double s = time_calls(calls);
    if (s >= min_seconds || calls >= (1L << 20)) break;
    calls = s <= 0 ? calls * 10 : std::max(calls * 2, long(double(calls) * min_seconds * 1.2 / s) + 1);
  }
  std::vector<double> per_call;
  for (int r = 0; r < repetitions; ++r) per_call.push_back(time_calls(calls) / double(calls));
  KILN_CUDA_CHECK(cudaEventDestroy(start));
  KILN_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace kiln::bench
