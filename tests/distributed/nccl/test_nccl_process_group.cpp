// The NCCL process group, run as one rank under mpirun (NCCL refuses two ranks on one GPU): all-reduce, average,
// broadcast and barrier on device memory, ordering after another stream's work, and errors that name the operation.
// Without a usable GPU it says why and exits with 77, which CTest reports as a skipped test: CI builds it and skips it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "kiln/distributed/nccl_process_group.hpp"
#include "kiln/distributed/process_group.hpp"

namespace dist = kiln::distributed;

namespace {

// Device memory holding a copy of the values, freed at the end of the scope.
template <class T>
struct device_values {
  explicit device_values(const std::vector<T>& host) : count(host.size()) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&data), count * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(data, host.data(), count * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  device_values(const device_values&) = delete;
  device_values& operator=(const device_values&) = delete;
  ~device_values() { cudaFree(data); }
  std::span<T> span() { return {data, count}; }
  std::vector<T> host() const {
    std::vector<T> out(count);
    REQUIRE(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  T* data = nullptr;
  std::size_t count;
};

}  // namespace

TEST_CASE("NCCL process group: all-reduce, average, broadcast and barrier on one rank") {
  dist::process_group group;
  dist::nccl_process_group nccl(group);
  CHECK(nccl.rank() == group.rank());
  CHECK(nccl.size() == group.size());
  const float n = static_cast<float>(nccl.size());

  device_values<float> values(std::vector<float>{1.0f, 2.0f, 3.0f});
  nccl.all_reduce(values.span());
  CHECK(values.host() == std::vector<float>{n * 1.0f, n * 2.0f, n * 3.0f});
  nccl.all_reduce(values.span(), dist::reduce_op::average);
  CHECK(values.host() == std::vector<float>{n * 1.0f, n * 2.0f, n * 3.0f});

  // Ordered after another stream's work: the copy into `counts` is enqueued there, and the all-reduce waits for it.
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  device_values<std::int64_t> counts(std::vector<std::int64_t>{0, 0});
  const std::int64_t mine[2] = {7, 8};
  REQUIRE(cudaMemcpyAsync(counts.data, mine, sizeof mine, cudaMemcpyHostToDevice, other) == cudaSuccess);
  auto request = nccl.start_all_reduce(counts.span(), dist::reduce_op::sum, "all_reduce of the counts", other);
  nccl.wait(request);
  CHECK(counts.host() == std::vector<std::int64_t>{7 * nccl.size(), 8 * nccl.size()});
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);

  nccl.broadcast(values.span(), 0);
  nccl.barrier();
  CHECK_THROWS_WITH_AS(nccl.broadcast(values.span(), nccl.size()),
                       doctest::Contains("broadcast of 3 values (12 bytes): expected a root rank below"),
                       kiln::error);
  CHECK(!nccl.failed());
}

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
