// Basic types and compiler switches shared by every kiln header.
#pragma once

#include <cstddef>
#include <cstdint>

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

// Marks the few scalar functions that CUDA kernels share with the CPU (activations, the Philox generator), so both
// backends compute them from one definition. Expands to nothing outside nvcc.
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
