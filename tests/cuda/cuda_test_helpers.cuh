// Helpers of the CUDA tests: random host data, device copies of it, and comparisons of GPU results with the CPU's
// that report the worst element when they fail.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/pinned_buffer.cuh"
#include "kiln/core/random.hpp"

namespace kiln::cuda_test {

// n values uniform in [low, high), from a fixed stream so failures reproduce.
template <class T>
std::vector<T> random_values(index_t n, std::uint64_t seed, T low = T(-1), T high = T(1)) {
  random_generator rng(seed, 7);
  std::vector<T> values(static_cast<std::size_t>(n));
  for (auto& v : values) v = rng.uniform<T>(low, high);
  return values;
}

template <class T>
kiln::cuda::device_buffer<T> to_device(const std::vector<T>& host) {
  kiln::cuda::device_buffer<T> buffer(static_cast<index_t>(host.size()));
  kiln::cuda::copy_to_device(host.data(), buffer.data(), buffer.size());
  return buffer;
}
template <class T>
std::vector<T> to_host(const T* device, index_t n) {
  std::vector<T> host(static_cast<std::size_t>(n));
  kiln::cuda::copy_to_host(device, host.data(), n);
  return host;
}
template <class T>
std::vector<T> to_host(const kiln::cuda::device_buffer<T>& buffer) {
  return to_host(buffer.data(), buffer.size());
}

// Checks |gpu[i] - cpu[i]| <= abs_tol + rel_tol * |cpu[i]| for every i; on failure reports the worst element.
template <class T>
void check_close(const std::vector<T>& gpu, const std::vector<T>& cpu, double rel_tol, double abs_tol,
                 const std::string& what) {
  REQUIRE_MESSAGE(gpu.size() == cpu.size(), what);
  double worst_excess = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double c = double(cpu[i]), g = double(gpu[i]);
    const bool both_nan = std::isnan(c) && std::isnan(g);
    const double error = both_nan ? 0.0 : std::abs(g - c);
    const double excess = std::isnan(error) ? 1e300 : error - (abs_tol + rel_tol * std::abs(c));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream message;
  if (worst_excess > 0)
    message << what << ": element " << worst << " is " << double(gpu[worst]) << " on the GPU, " << double(cpu[worst])
            << " on the CPU (rel_tol " << rel_tol << ", abs_tol " << abs_tol << ")";
  CHECK_MESSAGE(worst_excess <= 0, message.str());
}

// Checks gpu and cpu hold the same bits.
template <class T>
void check_identical(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::string& what) {
  REQUIRE_MESSAGE(gpu.size() == cpu.size(), what);
  const auto mismatch = std::mismatch(gpu.begin(), gpu.end(), cpu.begin(), [](T a, T b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  });
  std::ostringstream message;
  if (mismatch.first != gpu.end())
    message << what << ": element " << (mismatch.first - gpu.begin()) << " is " << double(*mismatch.first)
            << " on the GPU, " << double(*mismatch.second) << " on the CPU";
  CHECK_MESSAGE(mismatch.first == gpu.end(), message.str());
}

}  // namespace kiln::cuda_test
