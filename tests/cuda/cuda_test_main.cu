// The main of every CUDA test executable: runs the doctest suites when a CUDA device can be used, and otherwise says
// why not and exits with 77, which CTest (SKIP_RETURN_CODE 77) reports as a skipped test. Machines without a GPU (CI)
// thus build every CUDA test and skip them cleanly.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kiln/core/cuda/device.cuh"

int main(int argc, char** argv) {
  const cudaError_t status = kiln::cuda::device_status();
  if (status != cudaSuccess) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cudaGetErrorString(status));
    return 77;
  }
  std::printf("CUDA device: %s\n", kiln::cuda::describe_device().c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
