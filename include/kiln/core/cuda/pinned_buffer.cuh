// Page-locked (pinned) host memory, and the host <-> device copies of the CUDA policies' upload / download.
//
// The GPU's copy engines can only read and write pinned host memory; a copy from ordinary (pageable) memory is first
// copied by the driver into a pinned bounce buffer, synchronously. kiln does that staging itself, through two pinned
// chunks used in turn: while the copy engine moves one chunk, the host fills the other, and an upload returns as soon
// as the caller's memory has been read, without waiting for the kernels queued before it (the stream keeps them in
// order). A training loop that uploads its next batch therefore overlaps the host's work with the GPU's.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/stream.cuh"

namespace kiln::cuda {

// An owning, uninitialised array of trivially copyable T in pinned host memory (cudaMallocHost): readable and writable
// on the host like any array, and copied to or from the device at the full speed of the bus, asynchronously.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "pinned_buffer holds trivially copyable values only");

 public:
  pinned_buffer() = default;
  explicit pinned_buffer(index_t count) : size_(count) {
    if (count > 0) KILN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), bytes()));
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  pinned_buffer(pinned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~pinned_buffer() {
    if (data_) (void)cudaFreeHost(data_);  // never throws; at exit the runtime may already be gone
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  index_t size() const { return size_; }
  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(T); }
  T& operator[](index_t i) { return data_[i]; }
  const T& operator[](index_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

namespace detail {

// Two pinned chunks and the events that say when the copy engine is done with each. One for the process, guarded by a
// mutex, never destroyed (see the caching allocator).
class staging_area {
 public:
  static constexpr std::size_t chunk_bytes = std::size_t{8} << 20;

  // Host -> device through the chunks; returns once `host` has been read.
  void upload(const void* host, void* device, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    ensure();
    const cudaStream_t stream = current_stream();
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t piece = std::min(chunk_bytes, bytes - done);
      const int slot = next_;
      next_ ^= 1;
      KILN_CUDA_CHECK(cudaEventSynchronize(ready_[slot]));  // the copy that last read this chunk has finished
      std::memcpy(chunk_[slot].data(), static_cast<const char*>(host) + done, piece);
      KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(device) + done, chunk_[slot].data(), piece,
                                      cudaMemcpyHostToDevice, stream));
      KILN_CUDA_CHECK(cudaEventRecord(ready_[slot], stream));
      done += piece;
    }
  }

  // Device -> host through the chunks; returns once `host` holds the values (after the work queued before it).
  void download(const void* device, void* host, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    ensure();
    const cudaStream_t stream = current_stream();
    std::size_t pending_offset = 0, pending_bytes = 0;
    int pending_slot = 0;
    auto drain = [&] {
      if (pending_bytes == 0) return;
      KILN_CUDA_CHECK(cudaEventSynchronize(ready_[pending_slot]));
      std::memcpy(static_cast<char*>(host) + pending_offset, chunk_[pending_slot].data(), pending_bytes);
      pending_bytes = 0;
    };
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t piece = std::min(chunk_bytes, bytes - done);
      const int slot = next_;
      next_ ^= 1;
      KILN_CUDA_CHECK(cudaEventSynchronize(ready_[slot]));  // an upload may still be reading this chunk
      KILN_CUDA_CHECK(cudaMemcpyAsync(chunk_[slot].data(), static_cast<const char*>(device) + done, piece,
                                      cudaMemcpyDeviceToHost, stream));
      KILN_CUDA_CHECK(cudaEventRecord(ready_[slot], stream));
      drain();  // the previous chunk, while this one is in flight
      pending_offset = done;
      pending_bytes = piece;
      pending_slot = slot;
      done += piece;
    }
    drain();
  }

 private:
  void ensure() {
    if (ready_[0]) return;
    for (int slot = 0; slot < 2; ++slot) {
      chunk_[slot] = pinned_buffer<unsigned char>(static_cast<index_t>(chunk_bytes));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[slot], cudaEventDisableTiming));
    }
  }

  std::mutex mutex_;
  pinned_buffer<unsigned char> chunk_[2];
  cudaEvent_t ready_[2] = {nullptr, nullptr};
  int next_ = 0;
};

inline staging_area& global_staging_area() {
  static staging_area* area = new staging_area;
  return *area;
}

}  // namespace detail

// Copies n values from host memory (pageable or pinned) to device memory, on the kiln stream after the work already
// queued there. Returns as soon as `host` may be reused; the device copy completes in stream order. Not for use while
// the stream is being captured into a graph (it waits on the host).
template <class T>
void copy_to_device(const T* host, T* device, index_t n) {
  if (n <= 0) return;
  detail::global_staging_area().upload(host, device, static_cast<std::size_t>(n) * sizeof(T));
}

// Copies n values from device memory to host memory once the work queued on the kiln stream has produced them;
// returns when `host` holds them.
template <class T>
void copy_to_host(const T* device, T* host, index_t n) {
  if (n <= 0) return;
  detail::global_staging_area().download(device, host, static_cast<std::size_t>(n) * sizeof(T));
}

// Device -> device on the kiln stream (asynchronous).
template <class T>
void copy_on_device(const T* from, T* to, index_t n) {
  if (n <= 0 || from == to) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                  current_stream()));
}

}  // namespace kiln::cuda
