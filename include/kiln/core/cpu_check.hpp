// A program built for less than the CPU it runs on is told so, once, on stderr: kiln's kernels are vectorised for the
// instructions the compiler targets, so a build without -march=native (or at least -mavx2 -mfma) on a CPU with AVX2 or
// AVX-512 runs its products several times slower than it could, with no other sign. The check runs when the program
// starts; the message names what the build leaves out and the flag that fixes it. nvcc's translation units are left
// out: their host code is not where kiln's CPU kernels run.
#pragma once

#include <cstdio>
#include <string>

namespace kiln {

// The vector extensions this CPU has that the build does not use ("" when it uses all that kiln's kernels know).
inline std::string unused_vector_extensions() {
  std::string unused;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  __builtin_cpu_init();
#if !defined(__AVX512F__)
  if (__builtin_cpu_supports("avx512f")) unused += " AVX-512";
#endif
#if !defined(__AVX2__)
  if (__builtin_cpu_supports("avx2")) unused += " AVX2";
#endif
#if !defined(__FMA__)
  if (__builtin_cpu_supports("fma")) unused += " FMA";
#endif
#endif
  return unused;
}

namespace detail {
inline bool report_unused_vector_extensions() {
  const std::string unused = unused_vector_extensions();
  if (!unused.empty())
    std::fprintf(stderr,
                 "kiln: this program was built without%s, which this CPU has: kiln's kernels run much slower than "
                 "they could; build with -march=native (or -mavx2 -mfma)\n",
                 unused.c_str());
  return true;
}
// One per program (an inline variable), so the message is printed once however many files include kiln.
inline const bool vector_extensions_reported = report_unused_vector_extensions();
}  // namespace detail

}  // namespace kiln
