// Basic types and compiler switches shared by every kiln header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/cpu_check.hpp"

namespace kiln {

// Signed index type for extents and strides, as in Eigen: loops over sizes never wrap around.
using index_t = std::ptrdiff_t;

}  // namespace kiln

#if defined(__GNUC__) || defined(__clang__)
#define KILN_RESTRICT __restrict__
#define KILN_ALWAYS_INLINE inline __attribute__((always_inline))
#define KILN_NOINLINE __attribute__((noinline))
#else
#define KILN_RESTRICT
#define KILN_ALWAYS_INLINE inline
#define KILN_NOINLINE
#endif

// Lets the compiler vectorise a function's loops with 512-bit vectors where AVX-512 is enabled. GCC and Clang prefer
// 256-bit vectors for auto-vectorised loops on every AVX-512 CPU, which suits most of kiln's element-wise loops (a
// CNN's step is slower built with 512-bit vectors throughout) but not the recurrent cells' arithmetic-heavy gate loops,
// which are faster with them. Each marked function is out of line (KILN_NOINLINE), so the preference stays inside it;
// the arithmetic and its rounding do not depend on the width.
#if defined(__AVX512F__) && defined(__clang__)
#define KILN_WIDE_VECTOR_LOOPS __attribute__((min_vector_width(512)))
#elif defined(__AVX512F__) && defined(__GNUC__) && !defined(__CUDACC__)
#define KILN_WIDE_VECTOR_LOOPS __attribute__((target("prefer-vector-width=512")))
#else
#define KILN_WIDE_VECTOR_LOOPS
#endif

// Marks the few scalar functions that CUDA kernels share with the CPU (activations, the Philox generator), so both
// backends compute them from one definition. Expands to nothing outside nvcc.
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
