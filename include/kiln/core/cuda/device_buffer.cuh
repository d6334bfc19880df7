// kiln::cuda::device_buffer<T>: an owning array in device memory, the `buffer` of the CUDA policies (what
// aligned_buffer<T> is to the CPU ones). Its memory comes from the caching allocator; its contents start undefined.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/caching_allocator.cuh"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"

namespace kiln::cuda {

// An owning, uninitialised array of trivially copyable T in device memory. data() is a device pointer: pass it to
// kernels and to the CUDA policies, never dereference it on the host. Copies are device-to-device on the kiln stream.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device_buffer holds trivially copyable values only");

 public:
  device_buffer() = default;
  explicit device_buffer(index_t count)
      : block_(allocate_device(static_cast<std::size_t>(count) * sizeof(T))), size_(count) {}
  device_buffer(const device_buffer& other) : device_buffer(other.size_) {
    if (size_ > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(data(), other.data(), bytes(), cudaMemcpyDeviceToDevice, current_stream()));
  }
  device_buffer(device_buffer&& other) noexcept
      : block_(std::exchange(other.block_, device_block{})), size_(std::exchange(other.size_, 0)) {}
  device_buffer& operator=(device_buffer other) noexcept {
    std::swap(block_, other.block_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~device_buffer() { free_device(block_); }

  T* data() { return static_cast<T*>(block_.data); }
  const T* data() const { return static_cast<const T*>(block_.data); }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(T); }

 private:
  device_block block_;
  index_t size_ = 0;
};

}  // namespace kiln::cuda
