// Splits an element-wise loop over the CPU threads: contiguous chunks, one per thread, cut at multiples of 64 bytes so
// that no two threads write into one cache line, sized by each thread's recent speed (thread_balance.hpp). Each
// element is computed by the same code whatever the thread count and the split, so results are bit-identical on one
// thread and on many.
#pragma once

#include <algorithm>

#include "kiln/core/config.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"

namespace kiln::kernels::cpu {

// Below this many elements per thread a parallel region (a few microseconds to wake and join) costs more than it saves.
inline constexpr index_t parallel_min_elements_per_thread = 32 * 1024;

// Calls body(begin, end) over [0, n), on up to num_threads() threads when n is large enough.
template <class T, class Body>
void parallel_chunks(index_t n, Body&& body) {
  const int threads = int(std::min<index_t>(num_threads(), n / parallel_min_elements_per_thread));
  if (threads <= 1) {
    body(index_t{0}, n);
    return;
  }
#if defined(_OPENMP)
  constexpr index_t line = 64 / index_t(sizeof(T)) > 0 ? 64 / index_t(sizeof(T)) : 1;
  const index_t lines = (n + line - 1) / line;
  // One balance per loop: Body is each call site's own lambda.
  static thread_balance balance;
  const thread_split split = balance.split(threads);
  run_clock clock;
#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), id = omp_get_thread_num();
    // The team may be smaller than asked for (nested parallelism, dynamic adjustment): then split equally.
    const thread_split mine = split.over(team);
    const index_t begin = std::min(n, mine.begin(lines, id) * line);
    const index_t end = std::min(n, mine.end(lines, id) * line);
    if (begin < end) body(begin, end);
    clock.finish(id, team);
  }
  balance.record(split, lines, clock);
#else
  body(index_t{0}, n);
#endif
}

// Calls body(begin, end) over [0, rows) cut into one contiguous slice per thread, for work whose rows are independent
// from start to end (a recurrent layer's batch rows through all its time steps): one parallel region for the whole
// job instead of one per kernel call. Splits only when every slice gets at least min_rows rows, and the slices follow
// the threads' speeds (thread_balance.hpp) as long as each keeps min_rows: a kernel may take another path below them
// (policy::cpu's batch slices keep 16 rows, above which the AMX path's choice does not depend on the rows).
template <class Body>
void parallel_row_slices(index_t rows, index_t min_rows, Body&& body) {
  min_rows = std::max<index_t>(min_rows, 1);
  const int threads = int(std::min<index_t>(num_threads(), rows / min_rows));
  if (threads <= 1) {
    body(index_t{0}, rows);
    return;
  }
#if defined(_OPENMP)
  // One balance per call site: Body is each caller's own lambda.
  static thread_balance balance;
  const thread_split split = balance.split(threads, rows, min_rows);
  run_clock clock;
#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), id = omp_get_thread_num();
    // A smaller team than asked for (nested parallelism, dynamic adjustment) splits equally.
    const thread_split mine = split.over(team);
    const index_t begin = mine.begin(rows, id), end = mine.end(rows, id);
    if (begin < end) body(begin, end);
    clock.finish(id, team);
  }
  balance.record(split, rows, clock);
#else
  body(index_t{0}, rows);
#endif
}

}  // namespace kiln::kernels::cpu
