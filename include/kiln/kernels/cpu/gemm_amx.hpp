// Single-precision GEMM on Intel AMX tiles (Sapphire Rapids and later) at single precision's accuracy.
//
// AMX multiplies bfloat16 tiles into float accumulators at 16x the rate of AVX-512's float FMAs (1024 against 64
// flop per cycle and core). bfloat16 keeps 8 of a float's 24 significant bits, so each operand is split exactly into
// three bfloat16 pieces, x = hi + mid + lo (hi: x truncated to 8 bits; mid: the next 8 bits of the remainder; lo: the
// last 8, exactly), and the product is the sum of the six piece products whose size can reach the float product's
// rounding: hi*hi, hi*mid, mid*hi, hi*lo, lo*hi and mid*mid. The three dropped ones (mid*lo, lo*mid, lo*lo) are below
// 2^-23 of |a*b| together. Every piece product is exact in float, and the tile unit adds it to a float accumulator,
// rounding each addition as an FMA chain does: the error of a sum over k is that of a float dot product, which the
// tests check against the AVX-512 kernels and a double reference. Six products at 16x the rate: about 2.7x the
// float throughput where the data are in cache.
//
// The layout follows the AMX tile shapes: an A tile is 16 rows x 32 bfloat16 values along k (one row per 64-byte
// line); a B tile is 16 pairs of k x 16 columns, each 32-bit word holding B(2r, j) in its low half and B(2r + 1, j)
// in its high half (the "VNNI" layout); a C tile is 16 x 16 floats. For every 32-deep chunk of k an operand tile is
// packed as three tiles, one per piece. The blocking follows the blocked GEMM's (gemm.hpp): B's column tiles packed
// into L2 (all of k where they fit, else a k block at a time), two row tiles of A at a time packed into L1 for one k
// block and swept across them, C accumulated in 2 x 2 tile registers and finished through the same epilogue as the
// AVX-512 micro-kernel (store_tile), or a plain loop where the epilogue is only alpha and beta.
//
// Products of bfloat16 operands (product_precision::bfloat16, policy::cpu_bf16) round each operand to bfloat16 as it
// is packed, keep the hi tiles alone and run the (hi, hi) product only: one tile product where float operands take
// six, with the packing and the float sums unchanged. Products of bfloat16x3 (product_precision::bfloat16x3) split
// each operand into two pieces, x = hi + lo with hi = x rounded to bfloat16 and lo the remainder rounded (to nearest,
// ties away from zero), and sum three piece products, (hi, hi), (lo, hi) and (hi, lo): about 16 of float's 24
// significant bits, at half the tile work.
//
// Limits: products involving an infinite value give NaN where the float product gives an infinity (the infinity's
// remainder pieces are NaN); float subnormals are read and written as zero (AMX flushes them), as kiln's training
// loops run with denormals flushed anyway. set_amx_gemm(false) or KILN_AMX=0 in the environment turn the path off.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/gemm_bf16_dot.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"
#include "kiln/kernels/cpu/gemm_scratch.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/product_precision.hpp"

// (Not in code that nvcc compiles: its front end does not know the tile intrinsics, and the CPU GEMMs of a CUDA
// program's host code are not the ones that matter.)
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__linux__) && \
    defined(__x86_64__) && !defined(__CUDACC__)
#define KILN_HAS_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define KILN_HAS_AMX 0
#endif
// The packing, blocking and threading below serve two engines of the same layout: AMX tiles (every precision) and,
// for bfloat16 operands on CPUs without AMX, AVX512-BF16's dot products (gemm_bf16_dot.hpp).
#define KILN_HAS_BF16_BLOCKS (KILN_HAS_AMX || KILN_HAS_BF16_DOT)

namespace kiln::kernels::cpu {

namespace amx_detail {

// Whether the user allows the AMX path: the switch run_switch::amx (core/switches.hpp, KILN_AMX), which set_amx_gemm
// sets.
inline std::atomic<bool>& amx_allowed() { return switches_detail::state(run_switch::amx); }

#if KILN_HAS_AMX
// Linux hands out the tile registers' state only to a process that asks for it (arch_prctl); the answer also says
// whether the CPU and the kernel support AMX at all. Asked once per process.
inline bool amx_supported() {
  static const bool supported = [] {
    unsigned eax = 7, ebx = 0, ecx = 0, edx = 0;
    __asm__("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
    const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
    if (!tile || !bf16) return false;
    constexpr long request_permission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long tile_data = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
  }();
  return supported;
}
#else
inline bool amx_supported() { return false; }
#endif

}  // namespace amx_detail

// Turns the AMX path of the single-precision GEMM on or off for every later call (on by default where the CPU has
// AMX; KILN_AMX=0 in the environment starts it off). Off, every product runs on the AVX-512 kernels.
inline void set_amx_gemm(bool enabled) { amx_detail::amx_allowed().store(enabled, std::memory_order_relaxed); }

// Whether single-precision products now run on AMX: the CPU and the kernel support it and it is not turned off.
inline bool amx_gemm_active() {
  return amx_detail::amx_allowed().load(std::memory_order_relaxed) && amx_detail::amx_supported();
}

// Whether products of this precision take the bfloat16 path (operands packed into bfloat16 tiles, below) where their
// shape suits it (gemm.hpp's amx_worthwhile): every precision while AMX is active; bfloat16 operands also on
// AVX512-BF16's dot products while that path is on (gemm_bf16_dot.hpp).
inline bool bfloat16_path_active(product_precision precision) {
  return amx_gemm_active() || (precision == product_precision::bfloat16 && bf16_dot_gemm_active());
}

#if KILN_HAS_BF16_BLOCKS
namespace amx_detail {

inline constexpr index_t tile_rows = 16;    // rows of every tile; columns of a C or B tile
inline constexpr index_t chunk_depth = 32;  // k values per A tile row
inline constexpr index_t float_pieces = 3;  // the pieces of a float operand; a bfloat16 operand is its hi piece alone
inline constexpr index_t tile_values = 512;                        // bfloat16 values per tile (1 KiB)
inline constexpr index_t chunk_values = float_pieces * tile_values;  // one operand tile's three pieces
inline constexpr int group_row_tiles = 2;  // row tiles of A packed together and swept across the B block
// k chunks per block: a group's A tiles (2 rows x 4 chunks x 3 pieces x 1 KiB = 24 KiB) stay in L1 (48 KiB) while
// the B block streams past.
inline constexpr index_t block_chunks = 4;
// The packed B block's budget (all of k for as many column tiles as fit): half of L2, like the blocked GEMM's.
inline constexpr index_t b_block_bytes = 1 << 20;

using bf16_bits = std::uint16_t;

#if KILN_HAS_AMX
// The tile palette: all eight tiles 16 rows of 64 bytes.
struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Each thread loads the configuration before its tile work (cheap) and releases the tiles after, so that a context
// switch saves no tile state for a thread that is not using it.
class tile_session {
 public:
  tile_session() {
    static const tile_config config{};
    _tile_loadconfig(&config);
  }
  ~tile_session() { _tile_release(); }
  tile_session(const tile_session&) = delete;
  tile_session& operator=(const tile_session&) = delete;
};
#endif  // KILN_HAS_AMX

// The three pieces of 16 floats, each a float whose low 16 bits are zero: its bfloat16 is its high half.
struct split_floats {
  __m512i piece[3];
};

KILN_ALWAYS_INLINE split_floats split_pieces(__m512 x) {
  const __m512i high_half = _mm512_set1_epi32(int(0xFFFF0000u));
  const __m512i hi = _mm512_and_si512(_mm512_castps_si512(x), high_half);
  const __m512 rest = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));  // exact: the low 16 bits of x
  const __m512i mid = _mm512_and_si512(_mm512_castps_si512(rest), high_half);
  const __m512 last = _mm512_sub_ps(rest, _mm512_castsi512_ps(mid));  // exact, and at most 8 significant bits
  const __m512i lo = _mm512_and_si512(_mm512_castps_si512(last), high_half);
  return {{hi, mid, lo}};
}

// x rounded to the nearest bfloat16 (ties to even) as round_to_bfloat16 rounds it, as floats whose low 16 bits are
// zero; a NaN stays a quiet NaN.
KILN_ALWAYS_INLINE __m512i rounded_to_bfloat16(__m512 x) {
  constexpr __mmask16 all16 = 0xFFFF;
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_maskz_srli_epi32(all16, bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lowest_kept));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
  return _mm512_and_si512(rounded, _mm512_set1_epi32(int(0xFFFF0000u)));
}

// The pieces that a product of Pieces pieces per operand multiplies, first to last: all three (single precision);
// for products of bfloat16x3 (Pieces = 2), hi = x rounded to bfloat16 and lo = the remainder x - hi (exact in float:
// at most 16 significant bits) rounded, x = hi + lo within 2^-16 of x; for bfloat16 operands (Pieces = 1), x rounded
// to nearest with ties to even, alone. bfloat16x3 rounds both pieces to nearest with ties away from zero, an add and
// a mask each: the ties of hi change nothing (lo then holds the rest exactly), and rounding them to even, by integer
// arithmetic or by the hardware conversion, makes the packing, and a small product with it, slower. (A template
// argument: with a run-time count the packing loops do not unroll.) Where the CPU converts to bfloat16 itself
// (AVX512-BF16), the packers convert bfloat16 operands straight from the floats instead.
template <int Pieces>
KILN_ALWAYS_INLINE split_floats operand_pieces(__m512 x) {
  if constexpr (Pieces == 3) return split_pieces(x);
  const __m512i zero = _mm512_setzero_si512();
  if constexpr (Pieces == 1) return {{rounded_to_bfloat16(x), zero, zero}};
  const __m512i half = _mm512_set1_epi32(0x8000), high_half = _mm512_set1_epi32(int(0xFFFF0000u));
  __m512i hi = _mm512_and_si512(_mm512_add_epi32(_mm512_castps_si512(x), half), high_half);
  // (A NaN whose payload fills its low bits would carry into the sign bit: it is made a quiet NaN by hand.)
  hi = _mm512_mask_mov_epi32(hi, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
  const __m512 rest = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));  // exact; a NaN only where hi is one
  return {{hi, _mm512_and_si512(_mm512_add_epi32(_mm512_castps_si512(rest), half), high_half), zero}};
}

// One piece of two rows of k (even, odd) as VNNI words: (even's bfloat16) | (odd's bfloat16) << 16.
KILN_ALWAYS_INLINE __m512i pair_words(__m512i even, __m512i odd) {
  // (The maskz form: GCC 12 warns that the plain one's undefined pass-through register may be used uninitialised.)
  return _mm512_or_si512(_mm512_maskz_srli_epi32(__mmask16(0xFFFF), even, 16), odd);
}

// One piece of 32 consecutive values of k (first, second: 16 each) as 32 bfloat16 values in order. Every piece has
// at most 8 significant bits, so the hardware conversion (AVX512-BF16, rounding to nearest) is exact; without it, a
// word permute picks the high halves.
KILN_ALWAYS_INLINE __m512i consecutive_words(__m512i first, __m512i second) {
#if defined(__AVX512BF16__)
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(second), _mm512_castsi512_ps(first));
#else
  const __m512i high_halves = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                               27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(first, high_halves, second);
#endif
}

// transpose_16x16 (gemm_pack.hpp): a 16 x 16 matrix of 32-bit words, one row per register, transposed in place.
using gemm_detail::transpose_16x16;

KILN_ALWAYS_INLINE __mmask16 first_lanes(index_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

#if defined(__AVX512BF16__)
// bfloat16 operands packed straight from the floats: the hardware conversion (consecutive_words' instruction) rounds
// to nearest with ties to even as round_to_bfloat16 does, in one instruction for 32 values where rounding first took
// seven per 16. (It reads float subnormals as zero; the tile products read bfloat16 subnormals as zero anyway, so
// the results are the same.) Two rows of k (even, odd) as VNNI words: (even's bfloat16) | (odd's bfloat16) << 16.
KILN_ALWAYS_INLINE __m512i rounded_pair_words(__m512 even, __m512 odd) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, consecutive_words(_mm512_castps_si512(even), _mm512_castps_si512(odd)));
}
#endif

// 32 consecutive floats of k at p (the first `count` real, zeros after them), split into Pieces pieces.
template <int Pieces>
KILN_ALWAYS_INLINE void load_split_run(const float* p, index_t count, split_floats& first, split_floats& second) {
  first = operand_pieces<Pieces>(_mm512_maskz_loadu_ps(first_lanes(count), p));
  second = operand_pieces<Pieces>(_mm512_maskz_loadu_ps(first_lanes(count - 16), p + 16));
}

// The A tiles of `rows` rows of 32 values of k, the first `depth` real, at a with stride lda, one per piece (hi, mid,
// lo at dst, dst + 512, dst + 1024; Pieces of them, see operand_pieces); zero-padded to 16 x 32.
template <int Pieces>
void pack_a_rows(const float* a, index_t lda, index_t rows, index_t depth, bf16_bits* dst) {
#if defined(__AVX512BF16__)
  if constexpr (Pieces == 1) {
    for (index_t r = 0; r < tile_rows; ++r) {
      const float* row = a + r * lda;
      const __m512 first = r < rows ? _mm512_maskz_loadu_ps(first_lanes(depth), row) : _mm512_setzero_ps();
      const __m512 second = r < rows ? _mm512_maskz_loadu_ps(first_lanes(depth - 16), row + 16) : _mm512_setzero_ps();
      // (consecutive_words converts with the hardware here, which rounds floats as round_to_bfloat16 does.)
      _mm512_storeu_si512(dst + r * 32, consecutive_words(_mm512_castps_si512(first), _mm512_castps_si512(second)));
    }
    return;
  }
#endif
  for (index_t r = 0; r < tile_rows; ++r) {
    split_floats first, second;
    if (r < rows) {
      load_split_run<Pieces>(a + r * lda, depth, first, second);
    } else {
      first = second = split_pieces(_mm512_setzero_ps());
    }
    for (int q = 0; q < Pieces; ++q)
      _mm512_storeu_si512(dst + q * tile_values + r * 32, consecutive_words(first.piece[q], second.piece[q]));
  }
}

// The VNNI B tiles of `depth` rows of k (up to 32) of `cols` columns (up to 16) at b with stride ldb, one per piece;
// zero-padded to 32 x 16. Two rows of k give one tile row.
template <int Pieces>
void pack_b_rows(const float* b, index_t ldb, index_t depth, index_t cols, bf16_bits* dst) {
  const __mmask16 columns = first_lanes(cols);
#if defined(__AVX512BF16__)
  if constexpr (Pieces == 1) {
    for (index_t d = 0; d < tile_rows; ++d) {
      const index_t p = 2 * d;
      const __m512 even = p < depth ? _mm512_maskz_loadu_ps(columns, b + p * ldb) : _mm512_setzero_ps();
      const __m512 odd = p + 1 < depth ? _mm512_maskz_loadu_ps(columns, b + (p + 1) * ldb) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + d * 32, rounded_pair_words(even, odd));
    }
    return;
  }
#endif
  for (index_t d = 0; d < tile_rows; ++d) {
    const index_t p = 2 * d;
    const split_floats even =
        operand_pieces<Pieces>(p < depth ? _mm512_maskz_loadu_ps(columns, b + p * ldb) : _mm512_setzero_ps());
    const split_floats odd =
        operand_pieces<Pieces>(p + 1 < depth ? _mm512_maskz_loadu_ps(columns, b + (p + 1) * ldb) : _mm512_setzero_ps());
    for (int q = 0; q < Pieces; ++q)
      _mm512_storeu_si512(dst + q * tile_values + d * 32, pair_words(even.piece[q], odd.piece[q]));
  }
}

// to[c * out_cols + r] = from[r * ld + c]: the transpose of a rows x cols block of floats, zero-padded to
// out_rows x out_cols (multiples of 16, at least cols x rows), in 16 x 16 blocks in registers. An operand whose k
// runs down its columns goes through this first, and then packs as one whose k runs along its rows.
inline void transpose_block(const float* from, index_t ld, index_t rows, index_t cols, index_t out_rows,
                            index_t out_cols, float* KILN_RESTRICT to) {
  for (index_t r0 = 0; r0 < out_cols; r0 += 16) {    // rows of `from` become columns of `to`
    for (index_t c0 = 0; c0 < out_rows; c0 += 16) {  // columns of `from` become rows of `to`
      const __mmask16 columns = first_lanes(cols - c0);
      __m512i block[16];
      for (index_t r = 0; r < 16; ++r)
        block[r] = r0 + r < rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(columns, from + (r0 + r) * ld + c0))
                                 : _mm512_setzero_si512();
      transpose_16x16(block);
      for (index_t r = 0; r < 16; ++r) _mm512_storeu_si512(to + (c0 + r) * out_cols + r0, block[r]);
    }
  }
}

// The three tiles of op(A)'s rows [i0, i0 + rows) and k values [p0, p0 + depth), zero-padded to 16 x 32. A stored
// m x k (untransposed) has op(A)'s rows along k; stored k x m, a 32 x 16 block of it is transposed first.
template <int Pieces>
void pack_a_chunk(bool transpose_a, const float* a, index_t lda, index_t i0, index_t rows, index_t p0, index_t depth,
                  bf16_bits* dst) {
  if (!transpose_a) {
    pack_a_rows<Pieces>(a + i0 * lda + p0, lda, rows, depth, dst);
    return;
  }
  alignas(64) float rows_along_k[16 * 32];
  transpose_block(a + p0 * lda + i0, lda, depth, rows, 16, 32, rows_along_k);
  pack_a_rows<Pieces>(rows_along_k, 32, 16, 32, dst);
}

// The three VNNI tiles of op(B)'s k values [p0, p0 + depth) and columns [j0, j0 + cols), zero-padded to 32 x 16.
// B stored k x n (untransposed) has op(B)'s rows along n; stored n x k, a 16 x 32 block of it is transposed first.
template <int Pieces>
void pack_b_chunk(bool transpose_b, const float* b, index_t ldb, index_t p0, index_t depth, index_t j0, index_t cols,
                  bf16_bits* dst) {
  if (!transpose_b) {
    pack_b_rows<Pieces>(b + p0 * ldb + j0, ldb, depth, cols, dst);
    return;
  }
  alignas(64) float columns_along_n[32 * 16];
  transpose_block(b + j0 * ldb + p0, ldb, cols, depth, 32, 16, columns_along_n);
  pack_b_rows<Pieces>(columns_along_n, 16, 32, 16, dst);
}

#if KILN_HAS_AMX
// The register blocking: 2 x 2 C tiles (0-3), two A row tiles (4, 5) and two B column tiles (6, 7). A tile product
// takes 16 cycles to issue but about three times that to finish, and the next product into the same C tile waits
// for it: four independent accumulators, used in turn, keep the unit busy. (Six products in a row into one C tile, a
// 3 x 1 blocking with all three B pieces loaded, ran at half the unit's rate.) The piece products of a chunk run in
// the order (A hi, B hi), (mid, hi), (lo, hi), (hi, lo), (hi, mid), (mid, mid), each step reloading one side only
// where it can: 16 tile loads for 24 products. A product computed as its transpose (C^T = B^T A^T, see amx_gemm)
// runs the mirrored order, (hi, hi), (hi, mid), (hi, lo), (lo, hi), (mid, hi), (mid, mid): each element of C then
// adds the same exact piece products in the same order either way, and gets the same bits. Macros, not templates:
// GCC's tile intrinsics paste their tile numbers into the assembly text, so these must be literals.
// One group of products after reloading the A tiles, the B tiles or both. Each reload sits just before the first
// product that needs it, after the products that still read the old tile: a tile has no renaming, so its load waits
// for them, and this way only for them.
#define KILN_AMX_STEP_A(Rows, Cols, a0, a1)                     \
  do {                                                          \
    _tile_loadd(4, (a0), 64);                                   \
    _tile_dpbf16ps(0, 4, 6);                                    \
    if constexpr (Cols > 1) _tile_dpbf16ps(1, 4, 7);            \
    if constexpr (Rows > 1) {                                   \
      _tile_loadd(5, (a1), 64);                                 \
      _tile_dpbf16ps(2, 5, 6);                                  \
      if constexpr (Cols > 1) _tile_dpbf16ps(3, 5, 7);          \
    }                                                           \
  } while (0)
#define KILN_AMX_STEP_B(Rows, Cols, b0, b1)                     \
  do {                                                          \
    _tile_loadd(6, (b0), 64);                                   \
    _tile_dpbf16ps(0, 4, 6);                                    \
    if constexpr (Rows > 1) _tile_dpbf16ps(2, 5, 6);            \
    if constexpr (Cols > 1) {                                   \
      _tile_loadd(7, (b1), 64);                                 \
      _tile_dpbf16ps(1, 4, 7);                                  \
      if constexpr (Rows > 1) _tile_dpbf16ps(3, 5, 7);          \
    }                                                           \
  } while (0)
#define KILN_AMX_STEP_AB(Rows, Cols, a0, a1, b0, b1)            \
  do {                                                          \
    _tile_loadd(4, (a0), 64);                                   \
    _tile_loadd(6, (b0), 64);                                   \
    _tile_dpbf16ps(0, 4, 6);                                    \
    if constexpr (Cols > 1) {                                   \
      _tile_loadd(7, (b1), 64);                                 \
      _tile_dpbf16ps(1, 4, 7);                                  \
    }                                                           \
    if constexpr (Rows > 1) {                                   \
      _tile_loadd(5, (a1), 64);                                 \
      _tile_dpbf16ps(2, 5, 6);                                  \
      if constexpr (Cols > 1) _tile_dpbf16ps(3, 5, 7);          \
    }                                                           \
  } while (0)
#define KILN_AMX_START(C, resume, acc, stride_bytes)   \
  do {                                                 \
    if (resume)                                        \
      _tile_loadd(C, (acc), (stride_bytes));           \
    else                                               \
      _tile_zero(C);                                   \
  } while (0)

// C tiles of Rows row tiles x Cols column tiles (each 1 or 2) += A rows x B columns over `chunks` chunks. Row tile r
// holds its chunks at a + r * a_tile_stride, chunk c at + c * chunk_values; column tile t at b + t * b_tile_stride,
// chunk c at + c * chunk_values. The accumulators start from acc (resume) or zero and end in acc, row tile r and
// column tile t at acc + (16 r) * acc_stride + 16 t. Products: 6 (float operands, three pieces each), 3 (bfloat16x3:
// two pieces each, (hi, hi), (lo, hi) and (hi, lo), with lo in the second slot; mirrored (hi, hi), (hi, lo), (lo, hi),
// the same order for each element of C as above) or 1 (bfloat16 operands, (hi, hi) alone).
template <int Rows, int Cols, bool Mirrored, int Products = 6>
KILN_NOINLINE void block_product(const bf16_bits* a, index_t a_tile_stride, const bf16_bits* b, index_t b_tile_stride,
                                 index_t chunks, float* acc, index_t acc_stride, bool resume) {
  const index_t stride_bytes = acc_stride * index_t(sizeof(float));
  float* acc10 = acc + tile_rows * acc_stride;
  KILN_AMX_START(0, resume, acc, stride_bytes);
  if constexpr (Cols > 1) KILN_AMX_START(1, resume, acc + tile_rows, stride_bytes);
  if constexpr (Rows > 1) KILN_AMX_START(2, resume, acc10, stride_bytes);
  if constexpr (Rows > 1 && Cols > 1) KILN_AMX_START(3, resume, acc10 + tile_rows, stride_bytes);
  for (index_t c = 0; c < chunks; ++c) {
    const bf16_bits* a0 = a + c * chunk_values;
    const bf16_bits* a1 = a0 + a_tile_stride;
    const bf16_bits* b0 = b + c * chunk_values;
    const bf16_bits* b1 = b0 + b_tile_stride;
    constexpr index_t hi = 0, mid = tile_values, lo = 2 * tile_values;
    KILN_AMX_STEP_AB(Rows, Cols, a0 + hi, a1 + hi, b0 + hi, b1 + hi);
    if constexpr (Products == 1) {
      continue;
    } else if constexpr (Products == 3) {
      if constexpr (!Mirrored) {
        KILN_AMX_STEP_A(Rows, Cols, a0 + mid, a1 + mid);
        KILN_AMX_STEP_AB(Rows, Cols, a0 + hi, a1 + hi, b0 + mid, b1 + mid);
      } else {
        KILN_AMX_STEP_B(Rows, Cols, b0 + mid, b1 + mid);
        KILN_AMX_STEP_AB(Rows, Cols, a0 + mid, a1 + mid, b0 + hi, b1 + hi);
      }
    } else if constexpr (!Mirrored) {
      KILN_AMX_STEP_A(Rows, Cols, a0 + mid, a1 + mid);
      KILN_AMX_STEP_A(Rows, Cols, a0 + lo, a1 + lo);
      KILN_AMX_STEP_AB(Rows, Cols, a0 + hi, a1 + hi, b0 + lo, b1 + lo);
      KILN_AMX_STEP_B(Rows, Cols, b0 + mid, b1 + mid);
      KILN_AMX_STEP_A(Rows, Cols, a0 + mid, a1 + mid);
    } else {
      KILN_AMX_STEP_B(Rows, Cols, b0 + mid, b1 + mid);
      KILN_AMX_STEP_B(Rows, Cols, b0 + lo, b1 + lo);
      KILN_AMX_STEP_AB(Rows, Cols, a0 + lo, a1 + lo, b0 + hi, b1 + hi);
      KILN_AMX_STEP_A(Rows, Cols, a0 + mid, a1 + mid);
      KILN_AMX_STEP_B(Rows, Cols, b0 + mid, b1 + mid);
    }
  }
  _tile_stored(0, acc, stride_bytes);
  if constexpr (Cols > 1) _tile_stored(1, acc + tile_rows, stride_bytes);
  if constexpr (Rows > 1) _tile_stored(2, acc10, stride_bytes);
  if constexpr (Rows > 1 && Cols > 1) _tile_stored(3, acc10 + tile_rows, stride_bytes);
}
#endif  // KILN_HAS_AMX

// The arguments of one product, as gemm received them.
struct amx_problem {
  bool transpose_a, transpose_b;
  index_t m, n, k;
  float alpha;
  const float* a;
  index_t lda;
  const float* b;
  index_t ldb;
  float beta;
  float* c;
  index_t ldc;
  const float* bias;
  activation act;
  float slope;
  const bf16_bits* b_packed = nullptr;  // op(B) as pack_amx_b laid it out, or null: pack per block
  // The product computed is C^T = op(B)^T op(A)^T: a, b, m, n and the transposes above describe that product, and
  // its element (i, j) is stored to c[j * ldc + i] with bias[i] (see amx_gemm).
  bool transposed_output = false;
  int pieces = int(float_pieces);  // of each operand: 3 (float operands), 2 (bfloat16x3) or 1 (bfloat16 operands)
  // The engine: AMX tiles, or AVX512-BF16 dot products (bfloat16 operands only). Chosen once per product, so that
  // every part of it runs the same arithmetic.
  bool on_tiles = true;
};

// Stores the finished sums of one block of tile rows [i_begin, i_end) x columns [j_begin, j_end) (at most 32 x 32,
// i_begin and j_begin on tile boundaries) from acc (acc_stride floats per row) through the epilogue: alpha, beta * C,
// bias and activation, as the AVX-512 micro-kernel stores a tile. A transposed output transposes each 16 x 16 tile
// first.
inline void finish_block(const amx_problem& g, const float* acc, index_t acc_stride, index_t i_begin, index_t i_end,
                         index_t j_begin, index_t j_end) {
  gemm_detail::tile_epilogue<float> tile{g.alpha, g.beta, nullptr, g.act, g.slope, true, true};
  if (!g.transposed_output && !g.bias && g.act == activation::identity) {
    // alpha * sum + beta * C alone (a weight gradient added to .grad): the same two roundings as store_tile, in a
    // plain loop over whole rows.
    const __m512 alpha = _mm512_set1_ps(g.alpha), beta = _mm512_set1_ps(g.beta);
    for (index_t i = i_begin; i < i_end; ++i) {
      const float* sums = acc + (i - i_begin) * acc_stride;
      float* c = g.c + i * g.ldc;
      for (index_t j = j_begin; j < j_end; j += tile_rows) {
        const __mmask16 lanes = first_lanes(j_end - j);
        __m512 v = _mm512_mul_ps(alpha, _mm512_load_ps(sums + (j - j_begin)));
        if (g.beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(lanes, c + j), v);
        _mm512_mask_storeu_ps(c + j, lanes, v);
      }
    }
    return;
  }
  if (!g.transposed_output) {
    for (index_t i = i_begin; i < i_end; ++i) {
      const float* sums = acc + (i - i_begin) * acc_stride;
      for (index_t j = j_begin; j < j_end; j += tile_rows) {
        tile.bias = g.bias ? g.bias + j : nullptr;
        __m512 row[1][1] = {{_mm512_load_ps(sums + (j - j_begin))}};
        gemm_detail::store_tile<float, 1, 1>(row, g.c + i * g.ldc + j, g.ldc, int(std::min(tile_rows, j_end - j)),
                                             tile);
      }
    }
    return;
  }
  for (index_t it = i_begin; it < i_end; it += tile_rows) {
    tile.bias = g.bias ? g.bias + it : nullptr;
    const int cols = int(std::min(tile_rows, i_end - it));
    for (index_t jt = j_begin; jt < j_end; jt += tile_rows) {
      __m512i rows[16];
      const float* sums = acc + (it - i_begin) * acc_stride + (jt - j_begin);
      for (int r = 0; r < 16; ++r) rows[r] = _mm512_load_si512(sums + r * acc_stride);
      transpose_16x16(rows);
      for (index_t j = jt; j < std::min(j_end, jt + tile_rows); ++j) {
        __m512 row[1][1] = {{_mm512_castsi512_ps(rows[j - jt])}};
        gemm_detail::store_tile<float, 1, 1>(row, g.c + j * g.ldc + it, g.ldc, cols, tile);
      }
    }
  }
}

inline index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

// The bytes one column tile of op(B) takes packed with all of k's chunks.
inline index_t packed_column_tile_bytes(index_t k) {
  return ceil_div(k, chunk_depth) * chunk_values * index_t(sizeof(bf16_bits));
}
// Whether `col_tiles` column tiles of op(B), with all of k, fit the L2 budget of a B packed whole.
inline bool b_fits_whole(index_t k, index_t col_tiles) {
  return col_tiles * packed_column_tile_bytes(k) <= b_block_bytes;
}

// Where op(B)'s column tile `tile`, chunk `chunk`, lies in a B packed whole by pack_amx_b: column tile after column
// tile, each with all of k's chunks.
inline index_t packed_chunk_offset(index_t k, index_t tile, index_t chunk) {
  return (tile * ceil_div(k, chunk_depth) + chunk) * chunk_values;
}

// The number of bfloat16 values op(B) (k x n) takes once packed whole by pack_amx_b.
inline index_t packed_amx_b_size(index_t k, index_t n) {
  return ceil_div(n, tile_rows) * ceil_div(k, chunk_depth) * chunk_values;
}

// Packs op(B)'s chunks [cb, cb + depth) of `tiles` column tiles from column j0 (columns below n real): tile t's
// chunk cb + c at dst + (t * tile_chunks + c) * chunk_values. All of k with tile_chunks = all chunks is the layout of
// a B packed whole (packed_chunk_offset); one k block with tile_chunks = depth, a block's.
// Pieces per operand: 3, 2 for bfloat16x3 or 1 for bfloat16 operands.
template <int Pieces>
void pack_b_tiles(bool transpose_b, const float* b, index_t ldb, index_t k, index_t n, index_t j0, index_t tiles,
                  index_t cb, index_t depth, index_t tile_chunks, bf16_bits* dst) {
  for (index_t t = 0; t < tiles; ++t) {
    const index_t j = j0 + t * tile_rows;
    for (index_t c = 0; c < depth; ++c) {
      const index_t p = (cb + c) * chunk_depth;
      pack_b_chunk<Pieces>(transpose_b, b, ldb, p, std::min(chunk_depth, k - p), j, std::min(tile_rows, n - j),
                           dst + (t * tile_chunks + c) * chunk_values);
    }
  }
}
inline void pack_b_tiles(bool transpose_b, const float* b, index_t ldb, index_t k, index_t n, index_t j0,
                         index_t tiles, index_t cb, index_t depth, index_t tile_chunks, int pieces, bf16_bits* dst) {
  if (pieces == 1)
    pack_b_tiles<1>(transpose_b, b, ldb, k, n, j0, tiles, cb, depth, tile_chunks, dst);
  else if (pieces == 2)
    pack_b_tiles<2>(transpose_b, b, ldb, k, n, j0, tiles, cb, depth, tile_chunks, dst);
  else
    pack_b_tiles<3>(transpose_b, b, ldb, k, n, j0, tiles, cb, depth, tile_chunks, dst);
}

// The pieces each operand is split into for a product of this precision.
inline int pieces_of(product_precision precision) {
  switch (precision) {
    case product_precision::bfloat16: return 1;
    case product_precision::bfloat16x3: return 2;
    case product_precision::single: break;
  }
  return int(float_pieces);
}

// Packs all of op(B) (k x n) for amx_gemm's b_packed: column tile after column tile, each with all of k's chunks.
// A product at a lower precision must find B packed for it (its pieces: see operand_pieces).
inline void pack_amx_b(bool transpose_b, index_t k, index_t n, const float* b, index_t ldb, bf16_bits* packed,
                       product_precision precision = product_precision::single) {
  const index_t chunks = ceil_div(k, chunk_depth);
  pack_b_tiles(transpose_b, b, ldb, k, n, 0, ceil_div(n, tile_rows), 0, chunks, chunks,
               pieces_of(precision), packed);
}

// The AMX path's per-thread scratch, for its packed blocks and accumulators.
inline void* amx_scratch(std::size_t bytes) {
  static thread_local gemm_detail::gemm_scratch scratch;
  return scratch.reserve(bytes);
}

using block_product_fn = void (*)(const bf16_bits*, index_t, const bf16_bits*, index_t, index_t, float*, index_t, bool);
#if KILN_HAS_AMX
// [product_order][(rows - 1) * 2 + (cols - 1)]
inline constexpr block_product_fn block_products[5][4] = {
    {&block_product<1, 1, false>, &block_product<1, 2, false>, &block_product<2, 1, false>,
     &block_product<2, 2, false>},
    {&block_product<1, 1, true>, &block_product<1, 2, true>, &block_product<2, 1, true>, &block_product<2, 2, true>},
    {&block_product<1, 1, false, 1>, &block_product<1, 2, false, 1>, &block_product<2, 1, false, 1>,
     &block_product<2, 2, false, 1>},
    {&block_product<1, 1, false, 3>, &block_product<1, 2, false, 3>, &block_product<2, 1, false, 3>,
     &block_product<2, 2, false, 3>},
    {&block_product<1, 1, true, 3>, &block_product<1, 2, true, 3>, &block_product<2, 1, true, 3>,
     &block_product<2, 2, true, 3>}};
#endif  // KILN_HAS_AMX
#if KILN_HAS_BF16_DOT
// [(rows - 1) * 2 + (cols - 1)]: bfloat16 operands only.
inline constexpr block_product_fn dot_block_products[4] = {
    &bf16_dot_detail::block_product<1, 1, chunk_values>, &bf16_dot_detail::block_product<1, 2, chunk_values>,
    &bf16_dot_detail::block_product<2, 1, chunk_values>, &bf16_dot_detail::block_product<2, 2, chunk_values>};
#endif  // KILN_HAS_BF16_DOT

// The row of block_products a problem takes: float operands 0, or 1 mirrored (a transposed output); bfloat16 operands
// 2 (one product has no order); bfloat16x3 3, or 4 mirrored.
inline int product_order(const amx_problem& g) {
  if (g.pieces == 1) return 2;
  return (g.pieces == 2 ? 3 : 0) + int(g.transposed_output);
}

// The block product of `rows` x `cols` tiles (each 1 or 2) that the problem's engine runs.
inline block_product_fn block_product_for(const amx_problem& g, int rows, int cols) {
#if KILN_HAS_AMX
  if (g.on_tiles) return block_products[product_order(g)][(rows - 1) * 2 + (cols - 1)];
#endif
#if KILN_HAS_BF16_DOT
  if (!g.on_tiles && g.pieces == 1) return dot_block_products[(rows - 1) * 2 + (cols - 1)];
#endif
  fail("the bfloat16 block path: no engine for a product of ", g.pieces, " pieces per operand",
       g.on_tiles ? " on AMX tiles in a build without them" : " without AMX tiles");
}

// The tiles' state for the calling thread while a block of the problem runs on them; nothing on the dot products.
class engine_session {
 public:
  explicit engine_session([[maybe_unused]] const amx_problem& g) {
#if KILN_HAS_AMX
    if (g.on_tiles) tiles_.emplace();
#endif
  }

 private:
#if KILN_HAS_AMX
  std::optional<tile_session> tiles_;
#endif
};

// Whether the epilogue copies the sums unchanged (alpha 1, beta 0, no bias, no activation: a weight gradient): then
// a product over one k block stores each whole 2 x 2 block of tiles straight into C.
inline bool plain_epilogue(const amx_problem& g) {
  return !g.transposed_output && g.alpha == 1.0f && g.beta == 0.0f && !g.bias && g.act == activation::identity;
}

// Packs the A tiles of the row group starting at row i (rows_in_group tiles, rows below i1 real) for chunks
// [cb, cb + depth): row tile r's chunk c at a_group + (r * depth + c) * chunk_values.
inline void pack_a_group(const amx_problem& g, index_t i, index_t i1, int rows_in_group, index_t cb, index_t depth,
                         bf16_bits* a_group) {
  for (int r = 0; r < rows_in_group; ++r) {
    const index_t row = i + r * tile_rows;
    for (index_t c = 0; c < depth; ++c) {
      const index_t p = (cb + c) * chunk_depth;
      const index_t rows = std::min(tile_rows, i1 - row), chunk = std::min(chunk_depth, g.k - p);
      bf16_bits* dst = a_group + (r * depth + c) * chunk_values;
      if (g.pieces == 1)
        pack_a_chunk<1>(g.transpose_a, g.a, g.lda, row, rows, p, chunk, dst);
      else if (g.pieces == 2)
        pack_a_chunk<2>(g.transpose_a, g.a, g.lda, row, rows, p, chunk, dst);
      else
        pack_a_chunk<3>(g.transpose_a, g.a, g.lda, row, rows, p, chunk, dst);
    }
  }
}

// Where one row group's sweep across a block of B's column tiles reads and writes.
struct group_sweep {
  const bf16_bits* a_group;
  int rows_in_group;
  index_t i, i1;            // the group's first row; the end of the rows that exist
  const bf16_bits* b;       // the block's first column tile at the k block's first chunk
  index_t b_tile_stride;    // from one column tile to the next
  index_t block_tiles;      // column tiles in the block
  index_t j, j1;            // the block's first column; the end of the columns that exist
  index_t depth;            // chunks in the k block
  float* acc;               // the group's sums for the block, column tile t at acc + 16 t
  index_t acc_stride;
  bool resume, last;        // continue the sums in acc; finish them into C
  bool into_c;              // a plain product over one k block: whole 2 x 2 blocks go straight into C
};

// The group's 2 x 2 (or smaller) tile products across the block's column pairs, finished into C after the last k
// block.
inline void sweep_column_pairs(const amx_problem& g, const group_sweep& w) {
  const index_t a_stride = w.depth * chunk_values, i_end = w.i + w.rows_in_group * tile_rows;
  for (index_t t = 0; t < w.block_tiles; t += 2) {
    const int cols_in_pair = int(std::min<index_t>(2, w.block_tiles - t));
    const auto product = block_product_for(g, w.rows_in_group, cols_in_pair);
    const bf16_bits* b_column = w.b + t * w.b_tile_stride;
    const index_t j = w.j + t * tile_rows, j_end = j + cols_in_pair * tile_rows;
    if (w.into_c && i_end <= w.i1 && j_end <= w.j1) {
      product(w.a_group, a_stride, b_column, w.b_tile_stride, w.depth, g.c + w.i * g.ldc + j, g.ldc, false);
      continue;
    }
    if (!w.resume && w.last) {  // one k block: the pair's sums go through a 32 x 32 block kept in L1
      alignas(64) float pair_sums[2 * tile_rows * 2 * tile_rows];
      product(w.a_group, a_stride, b_column, w.b_tile_stride, w.depth, pair_sums, 2 * tile_rows, false);
      finish_block(g, pair_sums, 2 * tile_rows, w.i, std::min(w.i1, i_end), j, std::min(w.j1, j_end));
      continue;
    }
    float* acc_tile = w.acc + t * tile_rows;
    product(w.a_group, a_stride, b_column, w.b_tile_stride, w.depth, acc_tile, w.acc_stride, w.resume);
    if (w.last) finish_block(g, acc_tile, w.acc_stride, w.i, std::min(w.i1, i_end), j, std::min(w.j1, j_end));
  }
}

// amx_block for an op(B) whose columns [j0, j1) fit the L2 budget with all of k (or come prepacked): B packed
// whole first, each of its rows in one sweep (the prefetcher follows whole rows, where block by block it met 64
// short streams: a training step's forward reads its new batch from memory); then 2-tile groups of A's rows, and for
// each group the k blocks, whose A tiles are packed into L1 and swept across B's column pairs. A group's sums wait in a
// strip of 32 rows between k blocks, in L1.
inline void amx_block_whole_b(const amx_problem& g, index_t i0, index_t i1, index_t j0, index_t j1) {
  const index_t chunks_total = ceil_div(g.k, chunk_depth);
  const index_t row_tiles = ceil_div(i1 - i0, tile_rows);
  const index_t col_tiles = ceil_div(j1 - j0, tile_rows);
  const index_t block_depth = std::min(block_chunks, chunks_total);
  const index_t column_tile_bytes = packed_column_tile_bytes(g.k);
  const index_t block_col_tiles = std::max<index_t>(1, std::min(col_tiles, b_block_bytes / column_tile_bytes));
  const bool one_k_block = chunks_total <= block_depth;
  const index_t acc_stride = block_col_tiles * tile_rows;

  const std::size_t b_bytes = g.b_packed ? 0 : std::size_t(block_col_tiles * column_tile_bytes);
  const std::size_t a_bytes = std::size_t(group_row_tiles * block_depth * chunk_values) * sizeof(bf16_bits);
  const std::size_t acc_bytes = std::size_t(group_row_tiles * tile_rows * acc_stride) * sizeof(float);
  char* scratch = static_cast<char*>(amx_scratch(b_bytes + a_bytes + acc_bytes));
  auto* b_block = reinterpret_cast<bf16_bits*>(scratch);
  auto* a_group = reinterpret_cast<bf16_bits*>(scratch + b_bytes);
  auto* acc = reinterpret_cast<float*>(scratch + b_bytes + a_bytes);

  const bool into_c = one_k_block && plain_epilogue(g);
  const engine_session session(g);
  for (index_t jt = 0; jt < col_tiles; jt += block_col_tiles) {
    const index_t block_tiles = std::min(block_col_tiles, col_tiles - jt);
    // This block of B, all of k: found in the prepacked whole, or packed here in the same layout.
    const bf16_bits* b_base = g.b_packed ? g.b_packed + packed_chunk_offset(g.k, j0 / tile_rows + jt, 0) : b_block;
    if (!g.b_packed)
      pack_b_tiles(g.transpose_b, g.b, g.ldb, g.k, j1, j0 + jt * tile_rows, block_tiles, 0, chunks_total, chunks_total,
                   g.pieces, b_block);
    for (index_t rt = 0; rt < row_tiles; rt += group_row_tiles) {
      const int rows_in_group = int(std::min<index_t>(group_row_tiles, row_tiles - rt));
      const index_t i = i0 + rt * tile_rows;
      for (index_t cb = 0; cb < chunks_total; cb += block_depth) {
        const index_t depth = std::min(block_depth, chunks_total - cb);
        pack_a_group(g, i, i1, rows_in_group, cb, depth, a_group);
        sweep_column_pairs(g, {a_group, rows_in_group, i, i1, b_base + cb * chunk_values, chunks_total * chunk_values,
                               block_tiles, j0 + jt * tile_rows, j1, depth, acc, acc_stride, cb > 0,
                               cb + depth == chunks_total, into_c});
      }
    }
  }
}

// amx_block for a large op(B): for each column block and k block, B's block packed into L2, then 2-tile groups of
// A's rows packed into L1 and swept across it; every tile's sums wait in acc between k blocks.
inline void amx_block_by_blocks(const amx_problem& g, index_t i0, index_t i1, index_t j0, index_t j1) {
  const index_t chunks_total = ceil_div(g.k, chunk_depth);
  const index_t row_tiles = ceil_div(i1 - i0, tile_rows);
  const index_t col_tiles = ceil_div(j1 - j0, tile_rows);
  const index_t block_depth = std::min(block_chunks, chunks_total);
  const index_t block_col_tiles =
      std::max<index_t>(1, std::min(col_tiles, b_block_bytes / (block_depth * chunk_values * 2)));
  // With several k blocks the sums of every row group wait in acc between them; with one, each group's are finished
  // right away, and acc is one group's strip.
  const bool one_k_block = chunks_total <= block_depth;
  const index_t acc_stride = block_col_tiles * tile_rows;
  const index_t acc_rows = one_k_block ? group_row_tiles * tile_rows : row_tiles * tile_rows;

  const std::size_t b_bytes = std::size_t(block_col_tiles * block_depth * chunk_values) * sizeof(bf16_bits);
  const std::size_t a_bytes = std::size_t(group_row_tiles * block_depth * chunk_values) * sizeof(bf16_bits);
  const std::size_t acc_bytes = std::size_t(acc_rows * acc_stride) * sizeof(float);
  char* scratch = static_cast<char*>(amx_scratch(b_bytes + a_bytes + acc_bytes));
  auto* b_block = reinterpret_cast<bf16_bits*>(scratch);
  auto* a_group = reinterpret_cast<bf16_bits*>(scratch + b_bytes);
  auto* acc = reinterpret_cast<float*>(scratch + b_bytes + a_bytes);

  const bool into_c = one_k_block && plain_epilogue(g);
  const engine_session session(g);
  for (index_t jt = 0; jt < col_tiles; jt += block_col_tiles) {
    const index_t block_tiles = std::min(block_col_tiles, col_tiles - jt);
    for (index_t cb = 0; cb < chunks_total; cb += block_depth) {
      const index_t depth = std::min(block_depth, chunks_total - cb);
      // This block's B, column tile after column tile.
      pack_b_tiles(g.transpose_b, g.b, g.ldb, g.k, j1, j0 + jt * tile_rows, block_tiles, cb, depth, depth, g.pieces,
                   b_block);
      for (index_t rt = 0; rt < row_tiles; rt += group_row_tiles) {
        const int rows_in_group = int(std::min<index_t>(group_row_tiles, row_tiles - rt));
        const index_t i = i0 + rt * tile_rows;
        pack_a_group(g, i, i1, rows_in_group, cb, depth, a_group);
        sweep_column_pairs(g, {a_group, rows_in_group, i, i1, b_block, depth * chunk_values, block_tiles,
                               j0 + jt * tile_rows, j1, depth, one_k_block ? acc : acc + rt * tile_rows * acc_stride,
                               acc_stride, cb > 0, cb + depth == chunks_total, into_c});
      }
    }
  }
}

// Rows [i0, i1) x columns [j0, j1) of C on the calling thread (i0 and j0 multiples of 16). Every element's sum runs
// over the same chunks in the same order whatever the sub-block or loop order, so any partition gives the same bits.
// Where op(B)'s columns fit the L2 budget with all of k, rows go outside k (no A packed twice, a 32-row strip of
// sums); otherwise k blocks go outside rows, so that B is packed once (with rows outside, A is packed again for every
// block of columns, which costs more on one thread and far more on two).
inline void amx_block(const amx_problem& g, index_t i0, index_t i1, index_t j0, index_t j1) {
  if (i0 >= i1 || j0 >= j1) return;
  if (g.b_packed || b_fits_whole(g.k, ceil_div(j1 - j0, tile_rows))) {
    amx_block_whole_b(g, i0, i1, j0, j1);
    return;
  }
  // By blocks, every row's sums wait in acc between k blocks: rows go in panels whose sums take at most 2 MiB, so
  // that a product of many rows (a large batch) does not grow the scratch with m. Each panel packs B again.
  const index_t block_depth = std::min(block_chunks, ceil_div(g.k, chunk_depth));
  const index_t acc_stride = std::max<index_t>(
      1, std::min(ceil_div(j1 - j0, tile_rows), b_block_bytes / (block_depth * chunk_values * 2))) * tile_rows;
  const index_t panel_rows =
      std::max<index_t>(group_row_tiles * tile_rows, (index_t(2) << 20) / (acc_stride * index_t(sizeof(float))) /
                                                         (group_row_tiles * tile_rows) * (group_row_tiles * tile_rows));
  for (index_t i = i0; i < i1; i += panel_rows) amx_block_by_blocks(g, i, std::min(i1, i + panel_rows), j0, j1);
}

// Splits C over the threads in whole 16 x 16 tiles, choosing the grid that packs least: packing (each thread packs
// the A rows and B columns of its own sub-block) costs about as much per element as 32 columns of tile products.
// (Packing B once, shared by the team, was slower than each thread packing its own: every step each core rewrote lines
// the other had read, and read half of its B from the other core's cache.)
inline void amx_threaded(const amx_problem& g, int threads) {
  const index_t row_tiles = ceil_div(g.m, tile_rows), col_tiles = ceil_div(g.n, tile_rows);
  threads = int(std::min<index_t>(threads, row_tiles * col_tiles));
  if (threads <= 1) {
    amx_block(g, 0, g.m, 0, g.n);
    return;
  }
  int best_tm = 1;
  index_t best_cost = -1;
  for (int tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    const index_t rows = ceil_div(row_tiles, tm) * tile_rows, cols = ceil_div(col_tiles, threads / tm) * tile_rows;
    const index_t cost = rows * cols + 32 * (rows + cols);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_tm = tm;
    }
  }
  // C stored as computed, with B small enough to pack whole on every thread and at least two row tiles each: rows
  // only, so that each thread's part of C is one contiguous range, as the element-wise passes after it split memory
  // (the optimizer's update of a flat gradient). Split by columns, as the cost above prefers for a weight gradient such
  // as 128 x 784 with k = 64, the product was slower, and the Adam step after it read half of each thread's gradient
  // from the other core's cache.
  if (!g.transposed_output && b_fits_whole(g.k, col_tiles) && row_tiles >= 2 * index_t(threads)) best_tm = threads;
  if (best_tm == 1 || best_tm == threads) {
    // A split along one dimension (always, on two threads): more chunks of whole tiles than threads, each thread
    // taking its own share's and then helping with the others' (parallel_dynamic_chunks).
    const bool by_rows = best_tm == threads;
    const index_t tiles = by_rows ? row_tiles : col_tiles;
    const index_t chunks = std::min<index_t>(index_t(threads) * chunks_per_thread, tiles);
    parallel_dynamic_chunks(threads, chunks, [&](index_t chunk) {
      const index_t t0 = chunk_begin(tiles, chunks, chunk) * tile_rows;
      const index_t t1 = chunk_begin(tiles, chunks, chunk + 1) * tile_rows;
      if (by_rows) amx_block(g, std::min(g.m, t0), std::min(g.m, t1), 0, g.n);
      else amx_block(g, 0, g.m, std::min(g.n, t0), std::min(g.n, t1));
    });
    return;
  }
#if defined(_OPENMP)
  // A grid splits equally, one sub-block per thread.
#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), id = omp_get_thread_num();
    const int tm = team == threads ? best_tm : 1, tn = team / tm;
    const int my_m = id / tn, my_n = id % tn;
    const index_t i0 = std::min(g.m, chunk_begin(row_tiles, tm, my_m) * tile_rows);
    const index_t i1 = std::min(g.m, chunk_begin(row_tiles, tm, my_m + 1) * tile_rows);
    const index_t j0 = std::min(g.n, chunk_begin(col_tiles, tn, my_n) * tile_rows);
    const index_t j1 = std::min(g.n, chunk_begin(col_tiles, tn, my_n + 1) * tile_rows);
    amx_block(g, i0, i1, j0, j1);
  }
#else
  amx_block(g, 0, g.m, 0, g.n);
#endif
}

// Whether the m x n matrix at c (row stride ldc) holds only zeros (of either sign).
inline bool all_zero(const float* c, index_t ldc, index_t m, index_t n) {
  const __m512 zero = _mm512_setzero_ps();
  for (index_t i = 0; i < m; ++i) {
    const float* row = c + i * ldc;
    for (index_t j = 0; j < n; j += 16)
      if (_mm512_mask_cmp_ps_mask(first_lanes(n - j), _mm512_maskz_loadu_ps(first_lanes(n - j), row + j), zero,
                                  _CMP_NEQ_UQ))
        return false;
  }
  return true;
}

// C = act(alpha * op(A) op(B) + beta * C + bias) on `threads` threads; the caller has checked
// bfloat16_path_active(precision). On AMX tiles where they are active, else on AVX512-BF16 dot products.
// With b_packed (pack_amx_b's layout of op(B), packed for the same precision), b, ldb and transpose_b are unused.
// With precision bfloat16 each operand is rounded to bfloat16 as it is packed, and one tile product replaces six;
// with bfloat16x3 each is split into two bfloat16 pieces, and three products replace six.
// Packing an operand whose k runs down its columns (A stored k x m, B stored n x k) takes 16 x 16 transposes, the
// rest only shifts and masks: a product with B stored n x k and fewer rows than columns (a Dense layer's forward,
// 64 x 784 times 784 x 128) runs as its transpose, C^T = B A^T, so that the smaller operand is the one transposed.
// The product amx_gemm computes for these arguments: the one given, or its transpose (see above).
inline amx_problem amx_problem_for(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, float alpha,
                                   const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
                                   index_t ldc, const float* bias, activation act, float slope,
                                   const bf16_bits* b_packed, product_precision precision) {
  amx_problem g{transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias, act, slope, b_packed};
  if (!b_packed && !transpose_a && transpose_b && m < n) {
    g = amx_problem{false, true, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc, bias, act, slope};
    g.transposed_output = true;
  }
  g.pieces = pieces_of(precision);
  g.on_tiles = amx_gemm_active();
  return g;
}

inline void amx_gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, float alpha, const float* a,
                     index_t lda, const float* b, index_t ldb, float beta, float* c, index_t ldc, const float* bias,
                     activation act, float slope, int threads, const bf16_bits* b_packed = nullptr,
                     product_precision precision = product_precision::single) {
  // Adding to a C that holds only zeros (a weight gradient accumulated into a freshly registered parameter's .grad;
  // after a zero_grad, dynamic mode passes beta = 0 itself) is writing it: then whole tiles go straight into C instead
  // of through a read, an add and a write of every element. The scan stops at the first nonzero. The result differs
  // from adding only in the sign of a sum that is zero (-0 stays -0, as static mode's overwrite leaves it).
  if (beta != 0.0f && all_zero(c, ldc, m, n)) beta = 0.0f;
  amx_threaded(amx_problem_for(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias, act,
                               slope, b_packed, precision),
               threads);
}

// Rows [i0, i1) x columns [j0, j1) of amx_gemm's C (i0 and j0 multiples of 16) on the calling thread, with the bits
// amx_gemm gives them. beta must be 0: amx_gemm's test for a C of zeros looks at all of C, which other threads may be
// writing.
inline void amx_gemm_part(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, float alpha,
                          const float* a, index_t lda, const float* b, index_t ldb, float* c, index_t ldc,
                          const float* bias, activation act, float slope, product_precision precision, index_t i0,
                          index_t i1, index_t j0, index_t j1) {
  const amx_problem g = amx_problem_for(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc, bias,
                                        act, slope, nullptr, precision);
  if (g.transposed_output) amx_block(g, j0, j1, i0, i1);
  else amx_block(g, i0, i1, j0, j1);
}

#undef KILN_AMX_STEP_A
#undef KILN_AMX_STEP_B
#undef KILN_AMX_STEP_AB
#undef KILN_AMX_START

}  // namespace amx_detail
#endif  // KILN_HAS_BF16_BLOCKS

}  // namespace kiln::kernels::cpu
