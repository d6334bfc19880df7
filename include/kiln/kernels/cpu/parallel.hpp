// Splits a parallel loop over the CPU threads: the work cut into more chunks than threads, each thread taking the
// chunks of its own equal share first and then helping with the others' shares, so that a thread slowed by another
// process on its core does fewer of them. Nothing is kept from one call to the next. Each element is computed by the
// same code whatever the thread count and the chunk that holds it, so results are bit-identical on one thread and on
// many.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/threads.hpp"

namespace kiln::kernels::cpu {

// Below this many elements per thread a parallel region (a few microseconds to wake and join) costs more than it saves.
inline constexpr index_t parallel_min_elements_per_thread = 32 * 1024;

// How many chunks per thread a parallel loop cuts its work into, where its units allow: enough that a thread running
// at half speed ends about when the others do, few enough that each chunk's fixed costs (its packing, its loop's
// start) stay small beside its work.
inline constexpr int chunks_per_thread = 4;

// Chunks [0, chunks) shared out in `parts` equal ranges of consecutive chunks, one per thread of a team. Each thread
// takes its own range's chunks from the front, in order, then the other ranges' from their back. Where the threads run
// alike each does its own range, the same chunks on the same thread from call to call, so that a product's outputs
// and the update after it meet on one core; a thread slowed by another process leaves the end of its range to the
// others. For one call: every chunk is handed out once.
class chunk_ranges {
 public:
  static constexpr int max_parts = 64;

  chunk_ranges(int parts, index_t chunks) : parts_(std::clamp(parts, 1, max_parts)) {
    for (int p = 0; p < parts_; ++p)
      ranges_[p].bounds.store(pack(chunks * p / parts_, chunks * (p + 1) / parts_), std::memory_order_relaxed);
  }
  int parts() const { return parts_; }

  // Called by thread `id` of the team (any number of threads up to parts(), each id once): body(chunk) for its own
  // range's chunks, then for whatever the other ranges still hold.
  template <class Body>
  void run(int id, Body&& body) {
    if (id < 0 || id >= parts_) return;
    for (index_t chunk; (chunk = take(id, false)) >= 0;) body(chunk);
    for (int k = 1; k < parts_; ++k)
      for (index_t chunk; (chunk = take((id + k) % parts_, true)) >= 0;) body(chunk);
  }

 private:
  static std::uint64_t pack(index_t begin, index_t end) {
    return std::uint64_t(std::uint32_t(begin)) | (std::uint64_t(std::uint32_t(end)) << 32);
  }
  // The next chunk of range p, from its front or its back; -1 where it is empty.
  index_t take(int p, bool from_back) {
    std::atomic<std::uint64_t>& bounds = ranges_[p].bounds;
    std::uint64_t now = bounds.load(std::memory_order_relaxed);
    for (;;) {
      const index_t begin = index_t(std::uint32_t(now)), end = index_t(now >> 32);
      if (begin >= end) return -1;
      const std::uint64_t next = from_back ? pack(begin, end - 1) : pack(begin + 1, end);
      if (bounds.compare_exchange_weak(now, next, std::memory_order_relaxed)) return from_back ? end - 1 : begin;
    }
  }

  struct alignas(64) range {  // a cache line each: the threads take from their own without sharing a line
    std::atomic<std::uint64_t> bounds;
  };
  range ranges_[max_parts];
  int parts_;
};

// Calls body(chunk) for every chunk in [0, chunks) on `threads` threads of one parallel region (chunk_ranges); on the
// calling thread alone where threads <= 1 or there is no OpenMP.
template <class Body>
void parallel_dynamic_chunks(int threads, index_t chunks, Body&& body) {
#if defined(_OPENMP)
  if (threads > 1 && chunks > 1) {
    chunk_ranges ranges(int(std::min<index_t>(threads, chunks)), chunks);
#pragma omp parallel num_threads(ranges.parts())
    ranges.run(omp_get_thread_num(), body);
    return;
  }
#endif
  (void)threads;
  for (index_t chunk = 0; chunk < chunks; ++chunk) body(chunk);
}

// The start of chunk `chunk` of `chunks` equal chunks of `units` units (chunk == chunks: units).
inline index_t chunk_begin(index_t units, index_t chunks, index_t chunk) { return units * chunk / chunks; }

// Calls body(begin, end) over [0, n), on up to num_threads() threads when n is large enough, in chunks cut at multiples
// of 64 bytes so that no two threads write into one cache line.
template <class T, class Body>
void parallel_chunks(index_t n, Body&& body) {
  const int threads = int(std::min<index_t>(num_threads(), n / parallel_min_elements_per_thread));
  if (threads <= 1) {
    body(index_t{0}, n);
    return;
  }
  constexpr index_t line = 64 / index_t(sizeof(T)) > 0 ? 64 / index_t(sizeof(T)) : 1;
  const index_t lines = (n + line - 1) / line;
  const index_t chunks = std::min<index_t>(index_t(threads) * chunks_per_thread, lines);
  parallel_dynamic_chunks(threads, chunks, [&](index_t chunk) {
    const index_t begin = std::min(n, chunk_begin(lines, chunks, chunk) * line);
    const index_t end = std::min(n, chunk_begin(lines, chunks, chunk + 1) * line);
    if (begin < end) body(begin, end);
  });
}

// Calls body(begin, end) over [0, rows) cut into contiguous slices, for work whose rows are independent from start to
// end (a recurrent layer's batch rows through all its time steps): one parallel region for the whole job instead of
// one per kernel call. Splits only when every slice gets at least min_rows rows: a kernel may take another path below
// them (policy::cpu's batch slices keep 16 rows, above which the AMX path's choice does not depend on the rows).
template <class Body>
void parallel_row_slices(index_t rows, index_t min_rows, Body&& body) {
  min_rows = std::max<index_t>(min_rows, 1);
  const int threads = int(std::min<index_t>(num_threads(), rows / min_rows));
  if (threads <= 1) {
    body(index_t{0}, rows);
    return;
  }
  const index_t slices = std::min<index_t>(index_t(threads) * chunks_per_thread, rows / min_rows);
  parallel_dynamic_chunks(threads, slices, [&](index_t slice) {
    body(chunk_begin(rows, slices, slice), chunk_begin(rows, slices, slice + 1));
  });
}

}  // namespace kiln::kernels::cpu
