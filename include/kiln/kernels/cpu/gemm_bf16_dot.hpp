// Products of bfloat16 operands on AVX512-BF16's dot-product instruction, for CPUs that have it but no AMX tiles
// (AMD Zen 4 and later, Intel Cooper Lake).
//
// VDPBF16PS adds to each of 16 float lanes the products of two bfloat16 pairs, acc += a[2i] b[2i] + a[2i+1] b[2i+1]:
// 64 flop per instruction where a float FMA does 32, at the same rate on Zen 4 (docs/benchmarks.md). Each product of
// two bfloat16 values is exact in float, so a bfloat16 product (product_precision::bfloat16) costs half the float FMAs'
// time with the same float sums over the rounded operands that AMX tiles give.
//
// The operands come packed in the AMX path's layout (gemm_amx.hpp), which is already what this instruction reads: an
// A tile is 16 rows of 32 bfloat16 values along k, so one 32-bit word holds a row's pair (k = 2d, 2d + 1); a B tile is
// 16 rows of such pairs by 16 columns, the "VNNI" words (B(2d, j), B(2d + 1, j)), so one row of it is a register of
// 16 columns. The register blocking broadcasts the pair words of 8 rows of A against the rows of one or two B column
// tiles: 8 x 2 accumulators, 2 B loads and 8 broadcasts per 16 dot products. Every element's sum runs over the chunks,
// and within a chunk over the 16 pairs, in order, whatever the block or the thread, so any partition of C gives the
// same bits; a product computed as its transpose (C^T = B^T A^T) adds the same exact pair products, in the same
// order, and gets the same bits too. The bits differ from the tiles' (a different adder) and from single precision's.
//
// Limits: the instruction reads bfloat16 subnormals as zero and flushes float subnormal results, as the tiles do.
// set_bf16_dot_gemm(false), or KILN_BF16_DOT=0 in the environment, turns this path off.
#pragma once

#include <atomic>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"

// (Not in code that nvcc compiles, like the AMX path.)
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__x86_64__) && !defined(__CUDACC__)
#define KILN_HAS_BF16_DOT 1
#include <immintrin.h>
#else
#define KILN_HAS_BF16_DOT 0
#endif

namespace kiln::kernels::cpu {

namespace bf16_dot_detail {
// Whether the user allows the path: the switch run_switch::bf16_dot (core/switches.hpp, KILN_BF16_DOT), which
// set_bf16_dot_gemm sets.
inline std::atomic<bool>& bf16_dot_allowed() { return switches_detail::state(run_switch::bf16_dot); }
}  // namespace bf16_dot_detail

// Turns the AVX512-BF16 path of bfloat16 products on or off for every later call (on by default where the build
// targets a CPU with AVX512-BF16; KILN_BF16_DOT=0 in the environment starts it off). Off, bfloat16 products run in
// single precision on CPUs without AMX, as they did before this path.
inline void set_bf16_dot_gemm(bool enabled) {
  bf16_dot_detail::bf16_dot_allowed().store(enabled, std::memory_order_relaxed);
}

// Whether the build has the path (it targets AVX512-BF16: the build's own packing code already uses the instruction
// set, so a binary that runs has it) and it is not turned off.
inline bool bf16_dot_gemm_active() {
  return KILN_HAS_BF16_DOT && bf16_dot_detail::bf16_dot_allowed().load(std::memory_order_relaxed);
}

#if KILN_HAS_BF16_DOT
namespace bf16_dot_detail {

inline constexpr index_t tile_rows = 16;        // rows of an A tile, B tile rows (k pairs), columns of a tile
inline constexpr index_t tile_row_values = 32;  // bfloat16 values in one row of a tile (64 bytes)
inline constexpr int strip_rows = 8;            // rows of A whose accumulators stay in registers together

// Rows [r0, r0 + 8) of the C block: 8 x Cols accumulators over `chunks` chunks, from acc (resume) or zero, ending in
// acc. a points at the rows' row tile (chunk c at + c * ChunkStride), b at the first column tile (column tile t at
// + t * b_tile_stride).
template <int Cols, index_t ChunkStride>
KILN_ALWAYS_INLINE void strip_product(const std::uint16_t* a, index_t r0, const std::uint16_t* b,
                                      index_t b_tile_stride, index_t chunks, float* acc, index_t acc_stride,
                                      bool resume) {
  __m512 sums[strip_rows][Cols];
#pragma GCC unroll 8
  for (int r = 0; r < strip_rows; ++r)
#pragma GCC unroll 2
    for (int t = 0; t < Cols; ++t)
      sums[r][t] = resume ? _mm512_loadu_ps(acc + (r0 + r) * acc_stride + t * tile_rows) : _mm512_setzero_ps();
  for (index_t c = 0; c < chunks; ++c) {
    const std::uint16_t* a_rows = a + c * ChunkStride + r0 * tile_row_values;
    const std::uint16_t* b_rows = b + c * ChunkStride;
#pragma GCC unroll 2
    for (index_t d = 0; d < tile_rows; ++d) {
      __m512bh b_pairs[Cols];
#pragma GCC unroll 2
      for (int t = 0; t < Cols; ++t)
        b_pairs[t] = (__m512bh)_mm512_loadu_si512(b_rows + t * b_tile_stride + d * tile_row_values);
#pragma GCC unroll 8
      for (int r = 0; r < strip_rows; ++r) {
        std::int32_t word;  // row r's pair (k = 2d, 2d + 1)
        __builtin_memcpy(&word, a_rows + r * tile_row_values + 2 * d, sizeof(word));
        const __m512bh a_pair = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 2
        for (int t = 0; t < Cols; ++t) sums[r][t] = _mm512_dpbf16_ps(sums[r][t], a_pair, b_pairs[t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < strip_rows; ++r)
#pragma GCC unroll 2
    for (int t = 0; t < Cols; ++t) _mm512_storeu_ps(acc + (r0 + r) * acc_stride + t * tile_rows, sums[r][t]);
}

// The AMX path's block product (gemm_amx.hpp's block_product, bfloat16 operands) on dot-product instructions: C tiles
// of Rows row tiles x Cols column tiles (each 1 or 2) += A rows x B columns over `chunks` chunks. Row tile r holds
// its chunks at a + r * a_tile_stride, chunk c at + c * ChunkStride; column tile t at b + t * b_tile_stride, the same
// way. The sums start from acc (resume) or zero and end in acc, row tile r and column tile t at
// acc + (16 r) * acc_stride + 16 t (any stride: acc may be C itself).
template <int Rows, int Cols, index_t ChunkStride>
KILN_NOINLINE void block_product(const std::uint16_t* a, index_t a_tile_stride, const std::uint16_t* b,
                                 index_t b_tile_stride, index_t chunks, float* acc, index_t acc_stride, bool resume) {
  for (int rt = 0; rt < Rows; ++rt)
    for (index_t r0 = 0; r0 < tile_rows; r0 += strip_rows)
      strip_product<Cols, ChunkStride>(a + rt * a_tile_stride, r0, b, b_tile_stride, chunks,
                                       acc + rt * tile_rows * acc_stride, acc_stride, resume);
}

}  // namespace bf16_dot_detail
#endif  // KILN_HAS_BF16_DOT

}  // namespace kiln::kernels::cpu
