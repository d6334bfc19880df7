// The kiln stream: every kernel, copy and library call of kiln's CUDA backend is issued on this one stream, so they run
// in program order without any synchronisation between them, the host only waits where it reads a result, and a whole
// training step can be captured into a CUDA graph (capture needs a stream other than the legacy default one).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kiln/core/cuda/check.cuh"

namespace kiln::cuda {

namespace detail {

// The stream kiln created for itself: non-blocking, so it never waits for work on the legacy default stream. It lives
// as long as the process (destroying it at exit could run after the CUDA runtime has shut down).
inline cudaStream_t own_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

struct stream_slot {
  std::atomic<cudaStream_t> stream{nullptr};
  std::atomic<bool> user_set{false};
};
inline stream_slot& current_stream_slot() {
  static stream_slot slot;
  return slot;
}

}  // namespace detail

// The stream kiln issues its work on: kiln's own stream unless set_stream chose another.
inline cudaStream_t current_stream() {
  auto& slot = detail::current_stream_slot();
  if (slot.user_set.load(std::memory_order_acquire)) return slot.stream.load(std::memory_order_acquire);
  return detail::own_stream();
}

// Makes kiln issue its work on `stream` from now on (for example a stream of the caller's own, to overlap kiln with
// other work or to capture it). The caller keeps ownership and must keep the stream alive while kiln uses it.
// Work already issued stays on the previous stream: synchronise it first if later work depends on it.
inline void set_stream(cudaStream_t stream) {
  auto& slot = detail::current_stream_slot();
  slot.stream.store(stream, std::memory_order_release);
  slot.user_set.store(true, std::memory_order_release);
}
// Goes back to kiln's own stream.
inline void reset_stream() { detail::current_stream_slot().user_set.store(false, std::memory_order_release); }

// Waits until everything issued on the kiln stream has finished, and reports any error a kernel raised.
inline void synchronize() { KILN_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

// Sets the kiln stream for one scope and puts the previous one back at its end.
class stream_scope {
 public:
  explicit stream_scope(cudaStream_t stream)
      : previous_(current_stream()), previous_user_set_(detail::current_stream_slot().user_set.load()) {
    set_stream(stream);
  }
  stream_scope(const stream_scope&) = delete;
  stream_scope& operator=(const stream_scope&) = delete;
  ~stream_scope() {
    if (previous_user_set_)
      set_stream(previous_);
    else
      reset_stream();
  }

 private:
  cudaStream_t previous_;
  bool previous_user_set_;
};

}  // namespace kiln::cuda
