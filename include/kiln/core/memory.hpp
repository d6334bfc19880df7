// Aligned heap memory: every tensor buffer starts on a 64-byte boundary so vector loads never split a cache line.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "kiln/core/config.hpp"

namespace kiln {

inline constexpr std::size_t memory_alignment = 64;

inline void* aligned_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::size_t rounded = (bytes + memory_alignment - 1) / memory_alignment * memory_alignment;
  void* p = std::aligned_alloc(memory_alignment, rounded);
  if (!p) throw std::bad_alloc();
  return p;
}
inline void aligned_free(void* p) { std::free(p); }

// An owning, uninitialised, 64-byte aligned array of trivially copyable T.
template <class T>
class aligned_buffer {
 public:
  aligned_buffer() = default;
  explicit aligned_buffer(index_t count)
      : data_(static_cast<T*>(aligned_allocate(static_cast<std::size_t>(count) * sizeof(T)))), size_(count) {}
  aligned_buffer(const aligned_buffer& other) : aligned_buffer(other.size_) {
    if (size_) std::memcpy(data_, other.data_, static_cast<std::size_t>(size_) * sizeof(T));
  }
  aligned_buffer(aligned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~aligned_buffer() { aligned_free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  index_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace kiln
