// The caching allocator behind kiln's device memory. cudaMalloc and cudaFree cost tens of microseconds each and
// cudaFree synchronises the whole device, so a training step that created and freed its buffers through them would
// spend more time there than in its kernels (dynamic mode creates a fresh output for every op). This allocator keeps
// freed blocks in free lists by size class; after one warm-up step every request is served from a list and the device
// allocator is not called at all, as PyTorch's CUDA caching allocator does, and as dynamic mode's host caching
// allocator (kiln/dynamic/allocator.hpp) does for host memory. Static mode plans one arena for its whole model, so it
// needs this only for scratch (cuBLASLt and cuDNN workspaces).
//
// Reuse is stream-ordered: a freed block is handed out again at once, which is safe because every kernel runs on the
// one kiln stream, in order. After set_stream() to a different stream, synchronise before freeing buffers that work
// on the old stream still uses.
//
// Switch it off with kiln::cuda::set_caching_allocator(false): blocks then go straight back to cudaFree, and the blocks
// cached so far are released.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/core/cuda/check.cuh"

namespace kiln::cuda {

// Counters of the device caching allocator (process-wide), for tests and the benchmark ladder.
struct device_allocator_stats {
  std::uint64_t device_allocations = 0;  // cudaMalloc calls
  std::uint64_t device_frees = 0;        // cudaFree calls
  std::uint64_t cache_hits = 0;          // requests served from a free list
  std::uint64_t bytes_cached = 0;        // bytes sitting in the free lists
  std::uint64_t bytes_in_use = 0;        // bytes handed out and not yet freed
  std::uint64_t peak_bytes_in_use = 0;
};

// A block of device memory: where it starts and how many bytes it really holds (its size class).
struct device_block {
  void* data = nullptr;
  std::size_t bytes = 0;
};

namespace detail {

class device_cache {
 public:
  // Blocks start on 512-byte boundaries (cudaMalloc gives 256; 512 keeps every class a multiple of it).
  static constexpr std::size_t min_block = 512;

  // The size class of a request: eight classes per power of two, so a block wastes at most 12.5% of its bytes.
  static std::size_t size_class(std::size_t bytes) {
    if (bytes <= min_block) return min_block;
    const int octave = std::bit_width(bytes - 1);  // 2^(octave - 1) < bytes <= 2^octave
    // That octave, 2^(octave - 1) bytes wide, in eight steps.
    const std::size_t step = std::max(min_block, std::size_t{1} << (octave - 4));
    return (bytes + step - 1) / step * step;
  }

  device_block allocate(std::size_t bytes) {
    if (bytes == 0) return {};
    const std::size_t rounded = size_class(bytes);
    std::lock_guard lock(mutex_);
    if (enabled_) {
      auto found = free_.find(rounded);
      if (found != free_.end() && !found->second.empty()) {
        void* data = found->second.back();
        found->second.pop_back();
        ++stats_.cache_hits;
        stats_.bytes_cached -= rounded;
        note_in_use(rounded);
        return {data, rounded};
      }
    }
    void* data = nullptr;
    cudaError_t status = cudaMalloc(&data, rounded);
    if (status == cudaErrorMemoryAllocation && stats_.bytes_cached > 0) {
      // Out of memory with blocks cached: give them back and try once more, as PyTorch does.
      (void)cudaGetLastError();
      release_locked();
      status = cudaMalloc(&data, rounded);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail("kiln::cuda: cannot allocate ", rounded, " bytes of device memory (", bytes, " requested; ",
           stats_.bytes_in_use, " in use): ", cudaGetErrorString(status));
    }
    ++stats_.device_allocations;
    note_in_use(rounded);
    return {data, rounded};
  }

  void free(device_block block) {
    if (!block.data) return;
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use -= block.bytes;
    if (enabled_) {
      free_[block.bytes].push_back(block.data);
      stats_.bytes_cached += block.bytes;
      return;
    }
    // Errors are ignored here: a free must not throw, and at process exit the runtime may already be gone.
    (void)cudaFree(block.data);
    (void)cudaGetLastError();
    ++stats_.device_frees;
  }

  void set_enabled(bool enabled) {
    std::lock_guard lock(mutex_);
    enabled_ = enabled;
    if (!enabled) release_locked();
  }
  bool enabled() {
    std::lock_guard lock(mutex_);
    return enabled_;
  }
  // Frees every cached block (waits for the device first: a cached block may still be read by queued work).
  void release() {
    std::lock_guard lock(mutex_);
    release_locked();
  }
  device_allocator_stats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_counters() {
    std::lock_guard lock(mutex_);
    stats_.device_allocations = stats_.device_frees = stats_.cache_hits = 0;
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

 private:
  void note_in_use(std::size_t bytes) {
    stats_.bytes_in_use += bytes;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  void release_locked() {
    if (stats_.bytes_cached == 0) return;
    (void)cudaDeviceSynchronize();
    for (auto& [bytes, blocks] : free_) {
      for (void* data : blocks) {
        (void)cudaFree(data);
        ++stats_.device_frees;
      }
      blocks.clear();
    }
    (void)cudaGetLastError();
    stats_.bytes_cached = 0;
  }

  std::mutex mutex_;
  bool enabled_ = true;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  device_allocator_stats stats_;
};

// One cache for the process, never destroyed: device buffers held by static objects may be freed after every other
// static has gone, and the driver reclaims the memory at exit anyway.
inline device_cache& global_device_cache() {
  static device_cache* cache = new device_cache;
  return *cache;
}

}  // namespace detail

// At least `bytes` bytes of device memory, 512-byte aligned; {nullptr, 0} for zero bytes. Throws kiln::error when the
// device is out of memory.
inline device_block allocate_device(std::size_t bytes) { return detail::global_device_cache().allocate(bytes); }
// Returns a block from allocate_device (to the cache, or to cudaFree when caching is off). Never throws.
inline void free_device(device_block block) noexcept {
  try {
    detail::global_device_cache().free(block);
  } catch (...) {  // the mutex cannot fail in practice; a free must not throw regardless
  }
}

// Turns the caching allocator on (the default) or off; turning it off frees the cached blocks.
inline void set_caching_allocator(bool enabled) { detail::global_device_cache().set_enabled(enabled); }
inline bool caching_allocator_enabled() { return detail::global_device_cache().enabled(); }
// Gives the cached blocks back to the device (like torch.cuda.empty_cache()).
inline void release_cached_memory() { detail::global_device_cache().release(); }
inline device_allocator_stats caching_allocator_stats() { return detail::global_device_cache().stats(); }
// Zeroes the call counters and restarts the peak at the current use (to count a steady-state step).
inline void reset_caching_allocator_counters() { detail::global_device_cache().reset_counters(); }

}  // namespace kiln::cuda
