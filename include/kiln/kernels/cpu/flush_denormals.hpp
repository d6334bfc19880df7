// A scope in which the calling thread's float arithmetic flushes subnormal results to zero and reads subnormal inputs
// as zero (the SSE control register's FTZ and DAZ bits, restored on leaving). For loops over values that decay
// geometrically into the subnormal range, where on x86 every operation on them takes a microcode assist of ~100
// cycles. Elsewhere (no SSE) it does nothing.
#pragma once

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace kiln::kernels::cpu {

// Per thread: a parallel region sets it in each thread's part of the work.
class flush_denormals_scope {
 public:
#if defined(__SSE__) || defined(_M_X64)
  static constexpr unsigned flush_to_zero = 0x8000, denormals_are_zero = 0x0040;
  flush_denormals_scope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | flush_to_zero | denormals_are_zero); }
  ~flush_denormals_scope() { _mm_setcsr(saved_); }
#else
  flush_denormals_scope() = default;
#endif
  flush_denormals_scope(const flush_denormals_scope&) = delete;
  flush_denormals_scope& operator=(const flush_denormals_scope&) = delete;

 private:
#if defined(__SSE__) || defined(_M_X64)
  unsigned saved_;
#endif
};

}  // namespace kiln::kernels::cpu
