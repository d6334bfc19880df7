// The caching allocator behind dynamic mode's tensor storage (the ladder's rung 2). Dynamic mode creates a fresh
// output buffer for every op it runs; returning those buffers to malloc and asking for them again on the next step
// is most of what "heap tensors" cost. This allocator keeps freed blocks in per-thread free lists by size class
// (powers of two from 64 bytes), so after one warm-up step a training step finds every buffer it needs already there
// and calls malloc not at all, as PyTorch's CUDA caching allocator does for GPU memory.
//
// Switch it off at run time with kiln::nn::set_caching_allocator(false): every block then comes from and goes back to
// the system allocator (the ladder's rung 1, "dynamic eager without caching"), and the blocks cached so far are freed.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "kiln/core/memory.hpp"

namespace kiln::nn {

// Counters of the calling thread's cache, for tests and the benchmark ladder ("allocations per step").
struct allocator_stats {
  std::uint64_t system_allocations = 0;  // blocks obtained from the system allocator
  std::uint64_t system_frees = 0;        // blocks given back to it
  std::uint64_t cache_hits = 0;          // requests served from a free list
  std::uint64_t bytes_cached = 0;        // bytes now sitting in the free lists
};

namespace detail {

// Process-wide switch: read on every allocation, so a relaxed atomic (a plain load on x86).
inline std::atomic<bool>& caching_enabled_flag() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

// One thread's free lists. A freed block stores the next pointer of its list in its own first bytes, so the lists
// themselves never allocate.
class block_cache {
 public:
  static constexpr int class_count = 48;
  static constexpr std::size_t min_block = memory_alignment;  // 64 bytes: one cache line, holds the link

  block_cache() = default;
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;
  ~block_cache() {
    release();
    destroyed() = true;
  }

  // True once this thread's cache has been destroyed (thread exit): late frees go straight to the system.
  static bool& destroyed() {
    static thread_local bool flag = false;  // trivially destructible, so it outlives the cache
    return flag;
  }
  static block_cache& instance() {
    static thread_local block_cache cache;
    return cache;
  }

  // The size class of a request: the smallest power of two >= bytes, at least 64 bytes.
  static int size_class(std::size_t bytes) {
    return bytes <= min_block ? 6 : static_cast<int>(std::bit_width(bytes - 1));
  }

  void* take(int cls) {
    void* block = heads_[cls];
    if (block) {
      heads_[cls] = *static_cast<void**>(block);
      ++stats_.cache_hits;
      stats_.bytes_cached -= std::size_t{1} << cls;
    }
    return block;
  }
  void give(void* block, int cls) {
    *static_cast<void**>(block) = heads_[cls];
    heads_[cls] = block;
    stats_.bytes_cached += std::size_t{1} << cls;
  }
  // Frees every cached block.
  void release() {
    for (auto& head : heads_) {
      while (head) {
        void* next = *static_cast<void**>(head);
        aligned_free(head);
        ++stats_.system_frees;
        head = next;
      }
    }
    stats_.bytes_cached = 0;
  }
  allocator_stats& stats() { return stats_; }

 private:
  void* heads_[class_count] = {};
  allocator_stats stats_;
};

}  // namespace detail

// Turns the caching allocator on (the default) or off for every thread; turning it off frees the calling thread's
// cached blocks. Blocks in use stay valid either way: each one remembers its size and goes back the right way.
inline void set_caching_allocator(bool enabled) {
  detail::caching_enabled_flag().store(enabled, std::memory_order_relaxed);
  if (!enabled && !detail::block_cache::destroyed()) detail::block_cache::instance().release();
}
inline bool caching_allocator_enabled() { return detail::caching_enabled_flag().load(std::memory_order_relaxed); }
// Gives the calling thread's cached blocks back to the system (like torch.cuda.empty_cache()).
inline void release_cached_memory() {
  if (!detail::block_cache::destroyed()) detail::block_cache::instance().release();
}
// The calling thread's counters.
inline allocator_stats caching_allocator_stats() {
  if (detail::block_cache::destroyed()) return {};
  return detail::block_cache::instance().stats();
}

// A block of raw storage: where it starts and how many bytes it really holds (a size class when cached).
struct storage_block {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// At least `bytes` bytes, 64-byte aligned; {nullptr, 0} for zero bytes.
inline storage_block allocate_storage(std::size_t bytes) {
  if (bytes == 0) return {};
  if (caching_allocator_enabled() && !detail::block_cache::destroyed()) {
    auto& cache = detail::block_cache::instance();
    int cls = detail::block_cache::size_class(bytes);
    if (cls < detail::block_cache::class_count) {
      if (void* block = cache.take(cls)) return {block, std::size_t{1} << cls};
      std::size_t rounded = std::size_t{1} << cls;
      ++cache.stats().system_allocations;
      return {aligned_allocate(rounded), rounded};
    }
  }
  std::size_t rounded = (bytes + memory_alignment - 1) / memory_alignment * memory_alignment;
  if (!detail::block_cache::destroyed()) ++detail::block_cache::instance().stats().system_allocations;
  return {aligned_allocate(rounded), rounded};
}

// Returns a block to the cache when caching is on and the block is a whole size class, else to the system.
inline void free_storage(storage_block block) {
  if (!block.data) return;
  bool whole_class = std::has_single_bit(block.bytes) && block.bytes >= detail::block_cache::min_block;
  if (whole_class && caching_allocator_enabled() && !detail::block_cache::destroyed()) {
    int cls = detail::block_cache::size_class(block.bytes);
    if (cls < detail::block_cache::class_count) {
      detail::block_cache::instance().give(block.data, cls);
      return;
    }
  }
  aligned_free(block.data);
  if (!detail::block_cache::destroyed()) ++detail::block_cache::instance().stats().system_frees;
}

}  // namespace kiln::nn
