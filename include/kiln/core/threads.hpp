// The number of CPU threads kiln's kernels use (OpenMP underneath; one thread when built without it).
#pragma once

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln {

// Sets the threads every later kernel call may use; benches and examples expose it as --threads N.
inline void set_num_threads(int threads) {
#if defined(_OPENMP)
  omp_set_num_threads(threads < 1 ? 1 : threads);
#else
  (void)threads;
#endif
}
// Inside a parallel region (kiln's own, splitting a recurrent layer's batch, or the user's) kernels run on the calling
// thread alone: one.
inline int num_threads() {
#if defined(_OPENMP)
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace kiln
