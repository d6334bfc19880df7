// The cuBLAS, cuBLASLt and cuDNN handles of kiln's CUDA backend: created on first use (creating one costs
// milliseconds, and a program that never multiplies a matrix should not pay it), one each for the process, always
// bound to the kiln stream. The backend is driven from one host thread at a time, as the stream is.
//
// Each library gets a fixed workspace, allocated once with the handle, so that no call allocates device memory on its
// own: that keeps steady-state steps free of cudaMalloc and lets a step be captured into a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <mutex>

#include "kiln/core/cuda/caching_allocator.cuh"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"

namespace kiln::cuda {

// Workspace sizes: NVIDIA recommends 32 MiB for cuBLAS on Hopper (less costs some algorithms), and cuBLASLt's
// heuristics choose among the kernels that fit the size they are told.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20;
inline constexpr std::size_t cublaslt_workspace_bytes = std::size_t{32} << 20;

namespace detail {

// One library handle, its workspace, and the stream it was last bound to.
template <class Handle>
struct bound_handle {
  Handle handle = nullptr;
  device_block workspace;
  cudaStream_t stream = nullptr;
  std::once_flag created;
};

}  // namespace detail

// The cuBLAS handle, bound to the kiln stream with its own workspace.
inline cublasHandle_t cublas_handle() {
  static auto* h = new detail::bound_handle<cublasHandle_t>;  // never destroyed: see the caching allocator
  std::call_once(h->created, [] {
    KILN_CUBLAS_CHECK(cublasCreate(&h->handle));
    h->workspace = allocate_device(cublas_workspace_bytes);
    h->stream = current_stream();
    KILN_CUBLAS_CHECK(cublasSetStream(h->handle, h->stream));
    KILN_CUBLAS_CHECK(cublasSetWorkspace(h->handle, h->workspace.data, h->workspace.bytes));
  });
  if (const cudaStream_t stream = current_stream(); stream != h->stream) {
    h->stream = stream;
    KILN_CUBLAS_CHECK(cublasSetStream(h->handle, stream));
    // cublasSetStream puts the default workspace back; kiln's own keeps calls free of allocation.
    KILN_CUBLAS_CHECK(cublasSetWorkspace(h->handle, h->workspace.data, h->workspace.bytes));
  }
  return h->handle;
}

namespace detail {
inline bound_handle<cublasLtHandle_t>& cublaslt_state() {
  static auto* h = new bound_handle<cublasLtHandle_t>;
  std::call_once(h->created, [] {
    KILN_CUBLASLT_CHECK(cublasLtCreate(&h->handle));
    h->workspace = allocate_device(cublaslt_workspace_bytes);
  });
  return *h;
}
}  // namespace detail

// The cuBLASLt handle. cuBLASLt takes the stream and the workspace with every matmul, so only the handle is kept.
inline cublasLtHandle_t cublaslt_handle() { return detail::cublaslt_state().handle; }
// The workspace every cuBLASLt matmul of kiln passes (kernels run in stream order, so one is enough).
inline device_block cublaslt_workspace() { return detail::cublaslt_state().workspace; }

// The cuDNN handle, bound to the kiln stream. cuDNN takes workspaces per call; kiln's come from the caching allocator.
inline cudnnHandle_t cudnn_handle() {
  static auto* h = new detail::bound_handle<cudnnHandle_t>;
  std::call_once(h->created, [] {
    KILN_CUDNN_CHECK(cudnnCreate(&h->handle));
    h->stream = current_stream();
    KILN_CUDNN_CHECK(cudnnSetStream(h->handle, h->stream));
  });
  if (const cudaStream_t stream = current_stream(); stream != h->stream) {
    h->stream = stream;
    KILN_CUDNN_CHECK(cudnnSetStream(h->handle, stream));
  }
  return h->handle;
}

}  // namespace kiln::cuda
