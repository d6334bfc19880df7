// Error checks for the CUDA runtime, cuBLAS, cuBLASLt and cuDNN. Every call into those libraries goes through one of
// the KILN_*_CHECK macros, which turn a failed status into a kiln::error naming the call, the library's own text for
// the status, and the file and line, so a failure on a GPU machine reads like any other kiln error.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kiln/core/error.hpp"

namespace kiln::cuda {

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  fail("CUDA error in ", call, ": ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ") at ", file, ":",
       line);
}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("cuBLAS error in ", call, ": ", cublasGetStatusString(status), " (", cublasGetStatusName(status), ") at ",
       file, ":", line);
}
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  fail("cuDNN error in ", call, ": ", cudnnGetErrorString(status), " at ", file, ":", line);
}

}  // namespace detail

// Throws if a kernel launch failed (bad configuration, no device). Kernel faults surface at the next synchronising
// call, which is checked too.
inline void check_launch(const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) detail::throw_cuda_error(status, "kernel launch", file, line);
}

}  // namespace kiln::cuda

// Runtime API (cudaMalloc, cudaMemcpyAsync, ...).
#define KILN_CUDA_CHECK(call)                                                                    \
  do {                                                                                           \
    const cudaError_t kiln_status_ = (call);                                                     \
    if (kiln_status_ != cudaSuccess)                                                             \
      ::kiln::cuda::detail::throw_cuda_error(kiln_status_, #call, __FILE__, __LINE__);           \
  } while (0)

// cuBLAS and cuBLASLt (both return cublasStatus_t).
#define KILN_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                           \
    const cublasStatus_t kiln_status_ = (call);                                                  \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::kiln::cuda::detail::throw_cublas_error(kiln_status_, #call, __FILE__, __LINE__);         \
  } while (0)
#define KILN_CUBLASLT_CHECK(call) KILN_CUBLAS_CHECK(call)

// cuDNN.
#define KILN_CUDNN_CHECK(call)                                                                   \
  do {                                                                                           \
    const cudnnStatus_t kiln_status_ = (call);                                                   \
    if (kiln_status_ != CUDNN_STATUS_SUCCESS)                                                    \
      ::kiln::cuda::detail::throw_cudnn_error(kiln_status_, #call, __FILE__, __LINE__);          \
  } while (0)

// After a <<<...>>> launch.
#define KILN_CUDA_CHECK_LAUNCH() ::kiln::cuda::check_launch(__FILE__, __LINE__)
