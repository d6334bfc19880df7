// Which CUDA devices there are. Tests ask device_status() first and skip (exit code 77) on a machine without a usable
// GPU; everything else in kiln's CUDA backend runs on the current device (cudaSetDevice picks another).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kiln/core/cuda/check.cuh"

namespace kiln::cuda {

// cudaSuccess when at least one device can be used, otherwise why not (no driver, no device, driver too old...).
// Never throws: it is the question to ask before anything else.
inline cudaError_t device_status() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls are not blamed for it
    return status;
  }
  return count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
inline bool device_available() { return device_status() == cudaSuccess; }

// The number of usable devices (0 without a driver).
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// The device this thread runs on.
inline int current_device() {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

inline cudaDeviceProp device_properties(int device) {
  cudaDeviceProp properties{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  return properties;
}
inline cudaDeviceProp device_properties() { return device_properties(current_device()); }

inline std::string device_name(int device) { return device_properties(device).name; }
inline std::string device_name() { return device_name(current_device()); }

// Streaming multiprocessors of the current device, cached: grid sizes are derived from it on every launch.
inline int multiprocessor_count() {
  static const int count = [] {
    int value = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, current_device()));
    return value;
  }();
  return count;
}

// One line for logs and bench headers: "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB".
inline std::string describe_device(int device) {
  const cudaDeviceProp p = device_properties(device);
  const double gib = static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  std::string text = std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
                     std::to_string(p.multiProcessorCount) + " SMs, ";
  const int tenths = static_cast<int>(gib * 10.0 + 0.5);
  return text + std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " GiB";
}
inline std::string describe_device() { return describe_device(current_device()); }

}  // namespace kiln::cuda
