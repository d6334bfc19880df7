// The CUDA core: error checks, device queries, the kiln stream, the caching allocator, device and pinned buffers, the
// staged host <-> device copies behind upload / download, and the library handles.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/core/cuda/caching_allocator.cuh"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/handles.cuh"
#include "kiln/core/cuda/pinned_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/policy_cuda.cuh"

using namespace kiln;
using namespace kiln::cuda_test;

TEST_CASE("check macros throw kiln::error naming the call, the status and the place") {
  try {
    KILN_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const kiln::error& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("invalid argument") != std::string::npos);
    CHECK(what.find("test_cuda_core.cu") != std::string::npos);
  }
  CHECK_THROWS_AS(KILN_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE), kiln::error);
  CHECK_THROWS_AS(KILN_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM), kiln::error);
}

TEST_CASE("device queries") {
  CHECK(kiln::cuda::device_available());
  CHECK(kiln::cuda::device_count() >= 1);
  CHECK(!kiln::cuda::device_name().empty());
  CHECK(kiln::cuda::multiprocessor_count() > 0);
  MESSAGE(kiln::cuda::describe_device());
}

TEST_CASE("kiln runs on its own non-default stream, which set_stream and stream_scope can replace") {
  const cudaStream_t own = kiln::cuda::current_stream();
  CHECK(own != nullptr);
  cudaStream_t other = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&other));
  {
    kiln::cuda::stream_scope scope(other);
    CHECK(kiln::cuda::current_stream() == other);
    // The handles follow the stream.
    cudaStream_t bound = nullptr;
    KILN_CUBLAS_CHECK(cublasGetStream(kiln::cuda::cublas_handle(), &bound));
    CHECK(bound == other);
  }
  CHECK(kiln::cuda::current_stream() == own);
  cudaStream_t bound = nullptr;
  KILN_CUBLAS_CHECK(cublasGetStream(kiln::cuda::cublas_handle(), &bound));
  CHECK(bound == own);
  KILN_CUDA_CHECK(cudaStreamDestroy(other));
  CHECK(kiln::cuda::cudnn_handle() != nullptr);
  CHECK(kiln::cuda::cublaslt_handle() != nullptr);
}

TEST_CASE("the caching allocator serves a steady state without cudaMalloc") {
  REQUIRE(kiln::cuda::caching_allocator_enabled());
  CHECK(kiln::cuda::detail::device_cache::size_class(1) == 512);
  CHECK(kiln::cuda::detail::device_cache::size_class(4096) == 4096);
  CHECK(kiln::cuda::detail::device_cache::size_class(4097) == 4096 + 512);
  CHECK(kiln::cuda::detail::device_cache::size_class(1000000) >= 1000000);
  CHECK(kiln::cuda::detail::device_cache::size_class(1000000) <= 1000000 * 9 / 8);
  auto step = [] {
    kiln::cuda::device_buffer<float> a(1000), b(123457), c(7);
    return a.data() != nullptr && b.data() != nullptr && c.data() != nullptr;
  };
  CHECK(step());  // warm-up
  kiln::cuda::reset_caching_allocator_counters();
  for (int i = 0; i < 5; ++i) CHECK(step());
  const auto stats = kiln::cuda::caching_allocator_stats();
  CHECK(stats.device_allocations == 0);
  CHECK(stats.cache_hits == 15);

  kiln::cuda::set_caching_allocator(false);
  CHECK(kiln::cuda::caching_allocator_stats().bytes_cached == 0);
  kiln::cuda::reset_caching_allocator_counters();
  CHECK(step());
  CHECK(kiln::cuda::caching_allocator_stats().device_allocations == 3);
  CHECK(kiln::cuda::caching_allocator_stats().device_frees == 3);
  kiln::cuda::set_caching_allocator(true);
  kiln::cuda::release_cached_memory();
  CHECK(kiln::cuda::caching_allocator_stats().bytes_cached == 0);
}

TEST_CASE("device buffers are movable and copyable, and empty buffers hold nothing") {
  kiln::cuda::device_buffer<double> empty;
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
  const auto values = random_values<double>(1001, 3);
  auto a = to_device(values);
  kiln::cuda::device_buffer<double> b = a;  // device-to-device copy
  kiln::cuda::device_buffer<double> c = std::move(a);
  CHECK(a.size() == 0);
  check_identical(to_host(b), values, "copy");
  check_identical(to_host(c), values, "move");
}

TEST_CASE("upload and download round-trip any size, through the pinned chunks") {
  for (index_t n : {index_t(0), index_t(1), index_t(1000), index_t(5'000'001)}) {  // the last spans three chunks
    std::vector<float> host(static_cast<std::size_t>(n));
    std::iota(host.begin(), host.end(), 0.5f);
    policy::cuda::buffer<float> device(n);
    policy::cuda::upload(host.data(), device.data(), n);
    std::vector<float> back(static_cast<std::size_t>(n), -1.0f);
    policy::cuda::download(device.data(), back.data(), n);
    check_identical(back, host, "round trip of " + std::to_string(n));
  }
}

TEST_CASE("an upload returns once the host memory may be reused") {
  std::vector<int> host(3'000'000, 1);
  kiln::cuda::device_buffer<int> device(static_cast<index_t>(host.size()));
  kiln::cuda::copy_to_device(host.data(), device.data(), device.size());
  std::fill(host.begin(), host.end(), 2);  // must not reach the device
  const auto back = to_host(device);
  CHECK(std::all_of(back.begin(), back.end(), [](int v) { return v == 1; }));
}

TEST_CASE("pinned buffers") {
  kiln::cuda::pinned_buffer<float> pinned(10);
  for (index_t i = 0; i < 10; ++i) pinned[i] = float(i);
  kiln::cuda::device_buffer<float> device(10);
  kiln::cuda::copy_to_device(pinned.data(), device.data(), 10);
  const auto back = to_host(device);
  CHECK(back[9] == 9.0f);
  cudaPointerAttributes attributes{};
  KILN_CUDA_CHECK(cudaPointerGetAttributes(&attributes, pinned.data()));
  CHECK(attributes.type == cudaMemoryTypeHost);
}

TEST_CASE("the memory contract of the CUDA policies") {
  static_assert(!policy::cuda::host_accessible);
  static_assert(!policy::cudnn::host_accessible);
  static_assert(!policy::cuda_tf32::host_accessible);
  static_assert(std::is_same_v<policy::cuda::buffer<float>, kiln::cuda::device_buffer<float>>);
  static_assert(std::is_same_v<policy::cudnn::buffer<double>, kiln::cuda::device_buffer<double>>);
  static_assert(std::is_nothrow_move_constructible_v<policy::cuda::buffer<float>>);
  policy::cuda::synchronize();
  policy::cudnn::synchronize();
}
