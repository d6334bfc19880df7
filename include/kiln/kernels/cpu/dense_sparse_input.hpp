// A Dense layer's forward and weight gradient from an input most of whose elements hold one value, its background:
// normalised images on a blank background, whose blank pixels all become (0 - mean) / std, or one-hot and bag-of-words
// features (background 0). Both products of the input, y = x W^T and dW = dy^T x, then cost what its other elements
// cost:
//
//   x = c + d, with d zero at the background:  x W^T = c (1 W^T) + d W^T,  dy^T x = c (dy^T 1) + dy^T d.
//
// c (1 W^T) is c times W's row sums and c (dy^T 1) c times dy's column sums, each one pass; the products of d take
// its nonzeros alone, listed once by groups of adjacent columns (sparse_input). Where c is 0 these are the plain
// sparse products.
//
// They serve inputs of that kind alone, so they are a model's explicit choice: policy::cpu_sparse_input (policy.hpp)
// takes them, policy::cpu does not, and the switch KILN_SPARSE_INPUT (core/switches.hpp) turns them off everywhere.
//
// The sums are those of the dense product, in another order and with d = x - c rounded once, so the results are the
// dense product's within float rounding, not its bits (tests/test_dense_sparse_input.cpp checks them against a
// double-precision product). Which path a product takes depends on the input's values alone, never on the threads, so
// static and dynamic mode, and the fused step (fused_mlp.hpp), all take the same one and agree bit for bit. The
// kernels multiply in single precision whatever the policy's precision, as the sparse convolution gradients do.
//
// Why the layouts: both products hold a group of 4 input columns in registers, 64 outputs wide, and run down the
// group's listed rows, so that each load of a row (of y's sums, or of dy) feeds 16 FMAs. The forward holds W^T's 4
// rows and adds into the sums of y's rows; the weight gradient holds 4 columns of dW^T and adds each listed row of dy.
// On several threads each thread lists its share of x's rows and takes a share of the outputs. Listed row by row
// instead, with a row's 128 outputs in registers, each listed element costs 8 loads for 8 FMAs, and the loads set the
// pace: slower than the groups, although the groups' FMAs are more, their background elements included. Both take x's
// columns a strip of 16 at a time, W's rows transposed into W^T's (with W's row sums) and dW^T's transposed into dW's
// one strip at a time in an L1-sized buffer, 16 x 16 in registers (gemm_pack.hpp's transpose_16x16, which the AMX path
// packs with), and a block of 64 outputs through all the strips before the next block, so that the block's sums or rows
// of dW^T stay in the L1 cache.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"
#include "kiln/kernels/cpu/gemm_scratch.hpp"
#include "kiln/kernels/cpu/parallel.hpp"

namespace kiln::kernels::cpu {

// Inputs whose listing costs at most this fraction of the dense product's multiply-adds take the sparse products
// (their groups' FMAs: sparse_input::group times the rows listed, against rows times columns); costlier ones the GEMM,
// which is then about as fast: a call costs the listing plus about the GEMM's time per unit of that fraction, so at
// 0.75 it is still ahead (docs/benchmarks.md). Mostly blank images list far less; an input 30% off its background at
// random places lists just past the limit.
inline constexpr double sparse_input_max_work = 0.75;

// The most threads that list shares of one input.
inline constexpr int max_listing_threads = 64;

namespace sparse_input_detail {
// Whether the user allows the kernels: the switch run_switch::sparse_input (core/switches.hpp, KILN_SPARSE_INPUT),
// which set_sparse_input_products sets.
inline std::atomic<bool>& sparse_allowed() { return switches_detail::state(run_switch::sparse_input); }
// Output units a pass holds per column: 4 vectors of 16, for the 4 columns of a group (sparse_input::group), 16
// registers.
inline constexpr int max_vectors = 4;
// The products take x's columns a strip of this many (4 groups) at a time: one 16 x 16 transpose tile wide, with
// W^T's rows (the forward) or dW^T's (the weight gradient) for the strip in an L1-sized buffer.
inline constexpr index_t strip = 16;

#if defined(__AVX512F__)
// dst[c * ld_dst + r] = src[r * ld_src + c] (+ dst's value where add) for r < rows, c < cols, both at most 16:
// gemm_detail::transpose_16x16 between masked loads and stores. Where sum is given, dst's new rows are added to it in
// order.
KILN_ALWAYS_INLINE void transpose_tile(const float* src, index_t ld_src, int rows, int cols, float* dst,
                                       index_t ld_dst, bool add, __m512* sum = nullptr) {
  const __mmask16 col_mask = __mmask16((1u << cols) - 1u), row_mask = __mmask16((1u << rows) - 1u);
  __m512i r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(col_mask, src + i * ld_src)) : _mm512_setzero_si512();
  gemm_detail::transpose_16x16(r);
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) {
    if (c >= cols) break;
    float* out = dst + c * ld_dst;
    const __m512 t = _mm512_castsi512_ps(r[c]);
    const __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(row_mask, out), t) : t;
    _mm512_mask_storeu_ps(out, row_mask, v);
    if (sum) *sum = _mm512_add_ps(*sum, v);
  }
}

// dst (cols x rows, leading dimension ld_dst) = src^T (+ dst where add), src rows x cols.
inline void transpose(const float* src, index_t ld_src, index_t rows, index_t cols, float* dst, index_t ld_dst,
                      bool add) {
  for (index_t i = 0; i < rows; i += 16)
    for (index_t j = 0; j < cols; j += 16)
      transpose_tile(src + i * ld_src + j, ld_src, int(std::min<index_t>(16, rows - i)),
                     int(std::min<index_t>(16, cols - j)), dst + j * ld_dst + i, ld_dst, add);
}

#endif
}  // namespace sparse_input_detail

// Allows or forbids the sparse-input products for every later call of the policies that take them
// (policy::cpu_sparse_input; allowed by default, and KILN_SPARSE_INPUT=0 in the environment starts them forbidden).
// Unlike the sparse convolution gradients they change results within float rounding.
inline void set_sparse_input_products(bool enabled) {
  sparse_input_detail::sparse_allowed().store(enabled, std::memory_order_relaxed);
}
inline bool sparse_input_products_enabled() {
  return sparse_input_detail::sparse_allowed().load(std::memory_order_relaxed);
}

// An input matrix (rows x cols) as its background value and the differences from it of its other elements, listed
// by groups of `group` adjacent columns: for each group the rows, ascending, where any of its columns is off the
// background, each with the differences of all `group` of its elements (0 where an element is the background). Both
// products then hold a group's `group` columns in registers at once: W^T's rows in the forward, dW^T's in the weight
// gradient, so that each listed row's loads serve `group` columns. Neighbouring pixels are off the background
// together, so in images the groups' multiply-adds (four per listed row) are not many more than those of the listed
// pixels alone, and the products load several times fewer vectors than pixel by pixel. The buffers grow to the largest
// input seen and are then reused: no heap traffic in a steady state.
class sparse_input {
 public:
  static constexpr int group = 4;

  float background = 0;
  // The listing covers rows [first_row, first_row + rows) of its input: all of them, or one thread's share where
  // several threads list an input together (each its own rows, against the whole input's background).
  index_t first_row = 0, rows = 0, cols = 0, groups = 0, entries = 0;

  // Group g (columns [group * g, group * g + group)) lists [start[g], start[g + 1]) of row and value: first_row +
  // row[t] is a row of x and value[i][t] the difference x - background of its column group * g + i (0 past the last
  // column). Valid until the next scan.
  const index_t* start = nullptr;
  const std::int32_t* row = nullptr;
  const float* value[group] = {};

  // Lists x (rows x cols, leading dimension ldx) against the background x[0]. Returns false, with nothing usable
  // listed, where x[0] is not finite or group * entries would pass max_work * rows * cols (it stops reading there).
  bool scan(const float* x, index_t rows, index_t cols, index_t ldx, double max_work = sparse_input_max_work);

  // Lists rows [first, first + count) of x (cols columns, leading dimension ldx) against `background`, which must be
  // finite. Returns false, with nothing usable listed, where the rows list more than `limit` entries. The parts that
  // threads list of one input hold, between them, what scan lists of the whole, and qualify together where their
  // entries add up to at most work_limit's (so that the path never depends on the threads).
  bool scan_rows(const float* x, index_t first, index_t count, index_t cols, index_t ldx, float background,
                 index_t limit);

  // The most entries that an input of rows x cols may list and take the sparse products.
  static index_t work_limit(index_t rows, index_t cols, double max_work = sparse_input_max_work) {
    return static_cast<index_t>(max_work * double(rows) * double(cols) / group);
  }

 private:
  template <class U>
  static U* grow(gemm_detail::gemm_scratch& s, index_t count) {
    return static_cast<U*>(s.reserve(static_cast<std::size_t>(count) * sizeof(U)));
  }
  gemm_detail::gemm_scratch start_, row_, value_, transposed_;
};

inline bool sparse_input::scan(const float* x, index_t rows_, index_t cols_, index_t ldx, double max_work) {
  if (rows_ <= 0 || cols_ <= 0 || !std::isfinite(x[0])) {
    rows = cols = groups = entries = first_row = 0;
    return false;
  }
  return scan_rows(x, 0, rows_, cols_, ldx, x[0], work_limit(rows_, cols_, max_work));
}

inline bool sparse_input::scan_rows(const float* x, index_t first, index_t count_, index_t cols_, index_t ldx,
                                    float background_, index_t limit) {
#if defined(__AVX512F__)
  first_row = first;
  rows = count_;
  cols = cols_;
  groups = (cols + group - 1) / group;
  entries = 0;
  if (rows <= 0 || cols <= 0) return false;
  background = background_;
  x += first * ldx;
  // x^T, 16 columns (4 groups) at a time, transposed 16 x 16 in registers, so that a group's columns are rows read a
  // vector of 16 rows at a time (a counting sort of row-by-row lists is slower: its scattered stores wait on each
  // other). A strip of 16 columns stays in the L1 cache until its groups are listed. The columns that pad the last
  // group hold the background and list nothing.
  constexpr index_t strip = sparse_input_detail::strip, groups_per_strip = strip / group;
  const index_t padded = groups * group;
  float* const t = grow<float>(transposed_, strip * rows);
  // A group lists at most `rows` rows past the limit before its check, and compressed vectors are stored whole: 16
  // elements of slack.
  const index_t capacity = limit + rows + 16;
  index_t* const starts = grow<index_t>(start_, groups + 1);
  std::int32_t* const listed_rows = grow<std::int32_t>(row_, capacity);
  float* const values = grow<float>(value_, group * capacity);
  const __m512 c = _mm512_set1_ps(background);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  index_t count = 0;
  for (index_t g = 0; g < groups; ++g) {
    if (g % groups_per_strip == 0) {
      const index_t first_column = g * group, width = std::min(strip, cols - first_column);
      sparse_input_detail::transpose(x + first_column, ldx, rows, width, t, rows, false);
      std::fill(t + width * rows, t + std::min(strip, padded - first_column) * rows, background);
    }
    starts[g] = count;
    const float* columns = t + g % groups_per_strip * group * rows;
    for (index_t j = 0; j < rows; j += 16) {
      const __mmask16 valid = j + 16 <= rows ? __mmask16(0xffff) : __mmask16((1u << (rows - j)) - 1u);
      __m512 v[group];
      __mmask16 any = 0;
#pragma GCC unroll 4
      for (int i = 0; i < group; ++i) {
        v[i] = _mm512_maskz_loadu_ps(valid, columns + i * rows + j);
        // Unordered: a NaN differs from the background and is listed, so that it reaches the outputs it would reach.
        any = __mmask16(any | _mm512_mask_cmp_ps_mask(valid, v[i], c, _CMP_NEQ_UQ));
      }
      // Blank borders make whole vectors of the background, and the branch then skips the stores.
      if (!any) continue;
      // Compressed in a register and stored whole: Zen 4 runs the compressing store to memory as slow microcode.
#pragma GCC unroll 4
      for (int i = 0; i < group; ++i)
        _mm512_storeu_ps(values + i * capacity + count, _mm512_maskz_compress_ps(any, _mm512_sub_ps(v[i], c)));
      _mm512_storeu_si512(listed_rows + count,
                          _mm512_maskz_compress_epi32(any, _mm512_add_epi32(lane, _mm512_set1_epi32(int(j)))));
      count += __builtin_popcount(any);
    }
    if (count > limit) return false;
  }
  starts[groups] = count;
  entries = count;
  start = starts;
  row = listed_rows;
  for (int i = 0; i < group; ++i) value[i] = values + i * capacity;
  return true;
#else
  (void)x, (void)first, (void)count_, (void)cols_, (void)ldx, (void)background_, (void)limit;
  return false;
#endif
}

namespace sparse_input_detail {

constexpr int group = sparse_input::group;

#if defined(__AVX512F__)
// The differences that listed row t carries, each in all 16 lanes.
KILN_ALWAYS_INLINE void listed_differences(__m512 (&d)[group], const float* const (&values)[group], index_t t) {
#pragma GCC unroll 4
  for (int i = 0; i < group; ++i) d[i] = _mm512_set1_ps(values[i][t]);
}

// The forward over one group's listed rows: y's row r (Vectors vectors of it) += the group's differences on that row
// times the group's rows of W^T (w_t, leading dimension ld), held in registers, added column by column in order: the
// sums a row-by-row chain would make, each listed element once more for each of its group's background elements
// (adding 0).
template <int Vectors>
KILN_NOINLINE void forward_group(const float* KILN_RESTRICT w_t, index_t ld, const std::int32_t* KILN_RESTRICT rows,
                                 const float* const (&values)[group], index_t first, index_t count,
                                 float* KILN_RESTRICT y, index_t ldy) {
  __m512 w[group][Vectors];
#pragma GCC unroll 4
  for (int i = 0; i < group; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) w[i][v] = _mm512_loadu_ps(w_t + i * ld + 16 * v);
  for (index_t t = first; t < first + count; ++t) {
    float* const out = y + index_t(rows[t]) * ldy;
    __m512 d[group];
    listed_differences(d, values, t);
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) {
      __m512 sum = _mm512_loadu_ps(out + 16 * v);
#pragma GCC unroll 4
      for (int i = 0; i < group; ++i) sum = _mm512_fmadd_ps(d[i], w[i][v], sum);
      _mm512_storeu_ps(out + 16 * v, sum);
    }
  }
}

// The weight gradient over group g's listed rows, in every part of the listing in turn: `group` columns of dW^T
// (Vectors vectors of each) in registers, each c * sums (the background's share) plus its differences times the
// listed rows of dy, stored to g_t (leading dimension ld).
template <int Vectors>
KILN_NOINLINE void gradient_group(float c, const float* KILN_RESTRICT sums, const float* KILN_RESTRICT dy,
                                  index_t ldy, std::span<const sparse_input* const> parts, index_t g,
                                  float* KILN_RESTRICT g_t, index_t ld) {
  __m512 acc[group][Vectors];
  const __m512 background = _mm512_set1_ps(c);
#pragma GCC unroll 4
  for (int v = 0; v < Vectors; ++v) {
    const __m512 share = _mm512_mul_ps(background, _mm512_loadu_ps(sums + 16 * v));
#pragma GCC unroll 4
    for (int i = 0; i < group; ++i) acc[i][v] = share;
  }
  for (const sparse_input* part : parts) {
    const float* const dy_part = dy + part->first_row * ldy;
    const std::int32_t* KILN_RESTRICT const rows = part->row;
    for (index_t t = part->start[g]; t < part->start[g + 1]; ++t) {
      const float* const d_row = dy_part + index_t(rows[t]) * ldy;
      __m512 d[group];
      listed_differences(d, part->value, t);
#pragma GCC unroll 4
      for (int v = 0; v < Vectors; ++v) {
        __m512 gradient = _mm512_loadu_ps(d_row + 16 * v);
        // Loaded once into a register: GCC otherwise folds the load into each of the group's FMAs, and the four
        // loads per vector, not the FMAs, then set the pace.
        gemm_detail::opaque(gradient);
#pragma GCC unroll 4
        for (int i = 0; i < group; ++i) acc[i][v] = _mm512_fmadd_ps(d[i], gradient, acc[i][v]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < group; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < Vectors; ++v) _mm512_storeu_ps(g_t + i * ld + 16 * v, acc[i][v]);
}

// sums[o] = the sum of column o of m (count rows, leading dimension ld, width columns: a multiple of 16), added in
// row order: dy's column sums in the weight gradient.
inline void column_sums(const float* m, index_t ld, index_t count, index_t width, float* sums) {
  for (index_t o = 0; o < width; o += 16) {
    __m512 sum = _mm512_setzero_ps();
    for (index_t i = 0; i < count; ++i) sum = _mm512_add_ps(sum, _mm512_loadu_ps(m + i * ld + o));
    _mm512_storeu_ps(sums + o, sum);
  }
}

// Calls f.template operator()<V>() for V = vectors, 1 <= vectors <= max_vectors.
template <class F>
KILN_ALWAYS_INLINE void with_vectors(int vectors, F&& f) {
  [&]<int... V>(std::integer_sequence<int, V...>) {
    static_cast<void>(((vectors == V + 1 ? (f.template operator()<V + 1>(), true) : false) || ...));
  }(std::make_integer_sequence<int, max_vectors>{});
}
#endif

// Several threads' listings: the forward asks for each one's entries this many strips ahead of the strip it adds, all
// at once. Another thread's listing comes from its core's cache, and walked on demand its lines came a few at a time,
// one round trip between the cores each.
inline constexpr index_t prefetch_strips = 2;

// Prefetches the entries of groups [g0, g1) of a listing.
inline void prefetch_entries(const sparse_input& part, index_t g0, index_t g1) {
  const index_t t0 = part.start[g0], t1 = part.start[g1];
  if (t0 >= t1) return;
  const auto lines = [](const void* begin, const void* end) {
    for (auto at = reinterpret_cast<std::uintptr_t>(begin) & ~std::uintptr_t(63);
         at < reinterpret_cast<std::uintptr_t>(end); at += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 3);
  };
  lines(part.row + t0, part.row + t1);
  for (int i = 0; i < sparse_input::group; ++i) lines(part.value[i] + t0, part.value[i] + t1);
}

inline gemm_detail::gemm_scratch& transposed_scratch() {
  static thread_local gemm_detail::gemm_scratch scratch;
  return scratch;
}
inline gemm_detail::gemm_scratch& partial_sums_scratch() {
  static thread_local gemm_detail::gemm_scratch scratch;
  return scratch;
}

}  // namespace sparse_input_detail

// One thread's outputs [o0, o1) of the forward, y = act(x W^T + bias), in three steps, so that a thread can zero
// its sums while other threads are still listing their rows: the constructor needs nothing of the listing but x's
// shape and background, add takes listings' terms, finish adds the background's share (c times W's row sums), runs
// the epilogue (the GEMM's: bias added, then the activation) and writes y. The listings may come in any order: each
// covers rows of its own, and a row's sums take its listing's groups in order, so every row of y is the same sums
// whichever parts list x and in whatever order they are added. o0 and o1 - o0 are multiples of 16.
//
// add takes x's columns a strip at a time, for one block of outputs after another (as many as a pass holds in
// registers): it transposes W's rows of the block over the strip's columns into one L1-sized buffer and runs every
// listing's groups of the strip on them (the first add also sums W's rows, in input order). A whole W^T in scratch
// (in x width) went out to L2 and back, and beside W, its gradient and Adam's moments pushed the step's working set
// past the L2 cache. The block's sums stay in the L1 cache through the listing: the strips one after the other for all
// the outputs went through 64 rows of 128 outputs' sums (36 KiB) and 8 KiB of W^T per strip, past the 48 KiB L1 cache,
// where two blocks of 64 outputs make the same sums within it. Where several threads listed shares of x's rows, every
// share is added in one call, strip by strip: each strip is transposed once for all of them, and the other threads'
// entries are asked for a few strips ahead (prefetch_strips).
//
// The sums are made in the calling thread's scratch, its rows an odd number of cache lines apart, and y is written
// once, by finish: one object per thread at a time. Made in y itself, each listed row's additions drew in the cache
// lines of other threads' outputs beside them, and rows 4 KiB apart, as a 1024-output layer's are, all fell in the same
// few sets of the L1 cache.
class sparse_input_forward_sums {
 public:
  // W (out x in, leading dimension ldw); x has `rows` rows, listed against `background`.
  sparse_input_forward_sums(const float* w, index_t ldw, index_t in, index_t rows, float background, index_t o0,
                            index_t o1);
  // Adds the terms of the rows that `parts` list: listings of x against the background given above, each of rows of
  // its own (the threads' shares, or one listing of the whole).
  void add(std::span<const sparse_input* const> parts);
  void add(const sparse_input& part) {
    const sparse_input* const one[] = {&part};
    add(one);
  }
  // y (rows x out, leading dimension ldy): its outputs [o0, o1) of every row.
  void finish(const float* bias, activation act, float slope, float* y, index_t ldy);

 private:
  // Transposes W's rows o0 + [i0, i1) over columns [first, first + strip) into columns [i0, i1) of w_t_ (strip x
  // width, zeros past the last column), adding them to the row sums where `sum`.
  void transpose_strip(index_t first, bool sum, index_t i0, index_t i1);

  // (Read only by the AVX-512 definitions: a build without AVX-512 declares them unused.)
  [[maybe_unused]] const float* w_ = nullptr;
  [[maybe_unused]] float* sums_ = nullptr;  // W's row sums: width
  [[maybe_unused]] float* w_t_ = nullptr;   // one strip of W^T: strip x width
  [[maybe_unused]] float* acc_ = nullptr;   // the sums: rows x width, leading dimension ld_acc_
  [[maybe_unused]] bool summed_ = false;    // W's row sums made
  [[maybe_unused]] float background_ = 0;
  [[maybe_unused]] index_t width_ = 0, ldw_ = 0, in_ = 0, rows_ = 0, ld_acc_ = 0, o0_ = 0;
};

inline sparse_input_forward_sums::sparse_input_forward_sums(const float* w, index_t ldw, index_t in, index_t rows,
                                                            float background, index_t o0, index_t o1)
    : w_(w), background_(background), width_(std::max<index_t>(o1 - o0, 0)), ldw_(ldw), in_(in), rows_(rows),
      o0_(o0) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  if (width_ == 0) return;
  const index_t width = width_;
  sums_ = static_cast<float*>(
      transposed_scratch().reserve(static_cast<std::size_t>((strip + 1) * width) * sizeof(float)));
  w_t_ = sums_ + width;
  ld_acc_ = (width / 16) % 2 == 0 ? width + 16 : width;  // an odd number of cache lines
  acc_ = static_cast<float*>(
      partial_sums_scratch().reserve(static_cast<std::size_t>(rows * ld_acc_) * sizeof(float)));
  for (index_t i = 0; i < rows; ++i) std::fill_n(acc_ + i * ld_acc_, width, 0.0f);
#else
  (void)w, (void)ldw, (void)in, (void)rows, (void)background, (void)o0, (void)o1;
#endif
}

inline void sparse_input_forward_sums::transpose_strip(index_t first, bool sum, index_t i0, index_t i1) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  const index_t columns = std::min(strip, in_ - first);
  for (index_t i = i0; i < i1; i += 16) {
    __m512 row_sum = sum && first > 0 ? _mm512_loadu_ps(sums_ + i) : _mm512_setzero_ps();
    transpose_tile(w_ + (o0_ + i) * ldw_ + first, ldw_, 16, int(columns), w_t_ + i, width_, false,
                   sum ? &row_sum : nullptr);
    if (sum) _mm512_storeu_ps(sums_ + i, row_sum);
  }
  for (index_t c = columns; c < strip; ++c) std::fill(w_t_ + c * width_ + i0, w_t_ + c * width_ + i1, 0.0f);
#else
  (void)first, (void)sum, (void)i0, (void)i1;
#endif
}

inline void sparse_input_forward_sums::add(std::span<const sparse_input* const> parts) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  if (width_ == 0 || parts.empty()) return;
  const index_t groups = parts.front()->groups;
  for (index_t o = 0; o < width_; o += 16 * max_vectors) {
    const index_t o_end = std::min(width_, o + 16 * max_vectors);
    const int vectors = int((o_end - o) / 16);
    for (index_t first = 0; first < in_; first += strip) {
      const index_t g0 = first / group, g1 = std::min(groups, g0 + strip / group);
      if (parts.size() > 1 && first + prefetch_strips * strip < in_) {
        const index_t ahead = (first + prefetch_strips * strip) / group;
        for (const sparse_input* part : parts) prefetch_entries(*part, ahead, std::min(groups, ahead + strip / group));
      }
      bool listed = false;
      for (const sparse_input* part : parts) listed = listed || part->start[g0] < part->start[g1];
      // Every strip is transposed once for W's row sums, in the first add.
      if (!summed_ || listed) transpose_strip(first, !summed_, o, o_end);
      if (!listed) continue;
      with_vectors(vectors, [&]<int V>() {
        for (const sparse_input* part : parts) {
          float* const acc = acc_ + part->first_row * ld_acc_ + o;
          for (index_t g = g0; g < g1; ++g)
            forward_group<V>(w_t_ + (g - g0) * group * width_ + o, width_, part->row, part->value, part->start[g],
                             part->start[g + 1] - part->start[g], acc, ld_acc_);
        }
      });
    }
  }
  summed_ = true;
#else
  (void)parts;
#endif
}

inline void sparse_input_forward_sums::finish(const float* bias, activation act, float slope, float* y,
                                              index_t ldy) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  if (width_ == 0) return;
  if (!summed_) {  // no listing was added: the row sums alone
    for (index_t first = 0; first < in_; first += strip) transpose_strip(first, true, 0, width_);
    summed_ = true;
  }
  const __m512 c = _mm512_set1_ps(background_);
  for (index_t o = 0; o < width_; o += 16 * max_vectors) {
    const int vectors = int(std::min<index_t>(max_vectors, (width_ - o) / 16));
    const gemm_detail::tile_epilogue<float> tile{1.0f, 0.0f, bias ? bias + o0_ + o : nullptr, act, slope, true, true};
    with_vectors(vectors, [&]<int V>() {
      __m512 share[V];  // the background's: c times W's row sums
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) share[v] = _mm512_mul_ps(c, _mm512_loadu_ps(sums_ + o + 16 * v));
      for (index_t i = 0; i < rows_; ++i) {
        const float* const made = acc_ + i * ld_acc_ + o;
        __m512 sum[1][V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) sum[0][v] = _mm512_add_ps(share[v], _mm512_loadu_ps(made + 16 * v));
        gemm_detail::store_tile<float, 1, V>(sum, y + i * ldy + o0_ + o, 0, 16 * V, tile);
      }
    });
  }
#else
  (void)bias, (void)act, (void)slope, (void)y, (void)ldy;
#endif
}

// Outputs [o0, o1) of every row of y = act(x W^T + bias), x listed by `parts` (rows x in: the listings of
// consecutive rows of x, in order, together all of them), W (out x in, leading dimension ldw), y (rows x out, leading
// dimension ldy): sparse_input_forward_sums' three steps in a row, on the calling thread.
inline void sparse_input_forward_part(std::span<const sparse_input* const> parts, const float* w, index_t ldw,
                                      const float* bias, activation act, float slope, float* y, index_t ldy,
                                      index_t o0, index_t o1) {
  const sparse_input& last = *parts.back();
  if (o1 <= o0) return;
  sparse_input_forward_sums sums(w, ldw, last.cols, last.first_row + last.rows, last.background, o0, o1);
  sums.add(parts);
  sums.finish(bias, act, slope, y, ldy);
}

// The same, x listed whole by s.
inline void sparse_input_forward_part(const sparse_input& s, const float* w, index_t ldw, const float* bias,
                                      activation act, float slope, float* y, index_t ldy, index_t o0, index_t o1) {
  const sparse_input* const whole[] = {&s};
  sparse_input_forward_part(whole, w, ldw, bias, act, slope, y, ldy, o0, o1);
}

// Rows [o0, o1) of dW = dy^T x (added to dW's values where accumulate), x listed by `parts` (rows x in, as the
// forward's), dy (rows x out, leading dimension ldy), dW (out x in, leading dimension ldw); o0 and o1 - o0 multiples
// of 16. Runs on the calling thread. The same sums whichever parts list x.
inline void sparse_input_weight_gradient_part(std::span<const sparse_input* const> parts, const float* dy,
                                              index_t ldy, float* dw, index_t ldw, bool accumulate, index_t o0,
                                              index_t o1) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  const sparse_input& last = *parts.back();
  const index_t width = o1 - o0, in = last.cols, rows = last.first_row + last.rows;
  if (width <= 0) return;
  // dW^T a strip of `strip` columns of x at a time, transposed into dW while it is in the L1 cache: a whole dW^T in
  // scratch (in x width) went out to L2 and back, and beside W, its gradient and Adam's moments pushed the step's
  // working set past the L2 cache (Sapphire Rapids' 2 MiB).
  float* const g_t = static_cast<float*>(
      transposed_scratch().reserve(static_cast<std::size_t>((strip + 1) * width) * sizeof(float)));
  float* const sums = g_t + strip * width;
  column_sums(dy + o0, ldy, rows, width, sums);
  // A pass over the strips per block of rows of dW that a pass holds in registers, as the forward's sums: each strip
  // of 128 rows read 64 rows of dy's 128 columns and wrote 8 KiB of dW^T and of dW, past the L1 cache, where two blocks
  // of 64 rows make the same sums within it.
  for (index_t o = 0; o < width; o += 16 * max_vectors) {
    const index_t o_end = std::min(width, o + 16 * max_vectors);
    const int vectors = int((o_end - o) / 16);
    for (index_t first = 0; first < in; first += strip) {
      const index_t g0 = first / group, g1 = std::min(last.groups, g0 + strip / group);
      with_vectors(vectors, [&]<int V>() {
        for (index_t g = g0; g < g1; ++g)
          gradient_group<V>(last.background, sums + o, dy + o0 + o, ldy, parts, g,
                            g_t + (g - g0) * group * width + o, width);
      });
      transpose(g_t + o, width, std::min(strip, in - first), o_end - o, dw + (o0 + o) * ldw + first, ldw,
                accumulate);
    }
  }
#else
  (void)parts, (void)dy, (void)ldy, (void)dw, (void)ldw, (void)accumulate, (void)o0, (void)o1;
#endif
}

// The same, x listed whole by s.
inline void sparse_input_weight_gradient_part(const sparse_input& s, const float* dy, index_t ldy, float* dw,
                                              index_t ldw, bool accumulate, index_t o0, index_t o1) {
  const sparse_input* const whole[] = {&s};
  sparse_input_weight_gradient_part(whole, dy, ldy, dw, ldw, accumulate, o0, o1);
}

// Whether a Dense layer of this shape may take the sparse-input products, where its policy takes them: allowed
// (set_sparse_input_products), floats on AVX-512, a multiple of 16 outputs, and enough work that a scan of the input
// repays itself.
template <class T>
bool dense_sparse_input_applies(index_t batch, index_t in, index_t out) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>)
    return sparse_input_products_enabled() && out % 16 == 0 && in < (index_t(1) << 31) - 16 &&
           batch < (index_t(1) << 31) && batch * in * out >= gemm_detail::parallel_min_work;
#endif
  (void)batch, (void)in, (void)out;
  return false;
}

// The sparse-input products behind policy::cpu_sparse_input: each returns false, computing nothing, where the layer's
// input does not qualify (dense_sparse_input_applies, sparse_input::scan), and the caller then runs the GEMM. Each call
// lists its input itself: nothing of one call serves another.
struct sparse_input_kernels {
  // Thread `id` of `team`'s listing of its share of x's rows (batch x in), null where the share lists more than the
  // whole input may (or x's first element is not finite). Once every thread of the team has listed its share into
  // parts[0, team), shares_qualify says whether x qualifies, and parts[0, team) are then its listings in row order. The
  // shares are equal, as those that a data loader on as many threads copies (data_loader), so each thread lists rows
  // in its own core's cache, and each then walks every thread's listing. (Each thread listing the whole of x would
  // read the other threads' shares from their cores' caches; one listing shared out would leave each thread waiting on
  // all of the other's lists.) The listing is the calling thread's scratch, valid until its next list_share.
  static const sparse_input* list_share(const float* x, index_t batch, index_t in, int id, int team) {
    if (batch < team || in <= 0 || !std::isfinite(x[0])) return nullptr;
    const index_t r0 = batch * id / team, r1 = batch * (id + 1) / team;
    sparse_input& s = thread_input();
    return s.scan_rows(x, r0, r1 - r0, in, in, x[0], sparse_input::work_limit(batch, in)) ? &s : nullptr;
  }

  // Whether x (batch x in) qualifies, once every thread of the team has listed its share into parts[0, team): the
  // shares' entries add up to the whole's, so the answer is the same on every thread and for every team.
  static bool shares_qualify(index_t batch, index_t in, int team, const sparse_input* const* parts) {
    index_t entries = 0;
    for (int k = 0; k < team; ++k) {
      if (!parts[k]) return false;
      entries += parts[k]->entries;
    }
    return entries <= sparse_input::work_limit(batch, in);
  }

  // y = act(x W^T + bias) for x (batch x in), W (out x in), y (batch x out), all contiguous.
  template <class T>
  KILN_KERNEL static bool dense_forward_sparse_input(const T* x, const T* weight, const T* bias, T* y, index_t batch,
                                                     index_t in, index_t out, activation act, T slope) {
    if constexpr (std::is_same_v<T, float>) {
      if (!dense_sparse_input_applies<T>(batch, in, out)) return false;
      return listed_then_over_outputs(x, batch, in, out, [&](std::span<const sparse_input* const> parts, index_t o0,
                                                             index_t o1) {
        sparse_input_forward_sums sums(weight, in, in, batch, x[0], o0, o1);
        sums.add(parts);
        sums.finish(bias, act, slope, y, out);
      });
    }
    (void)x, (void)weight, (void)bias, (void)y, (void)batch, (void)in, (void)out, (void)act, (void)slope;
    return false;
  }

  // dW = dy^T x (+ dW where accumulate) for x (batch x in), dy (batch x out), dW (out x in), all contiguous.
  template <class T>
  KILN_KERNEL static bool dense_weight_gradient_sparse_input(const T* x, const T* dy, T* dweight, index_t batch,
                                                             index_t in, index_t out, bool accumulate) {
    if constexpr (std::is_same_v<T, float>) {
      if (!dense_sparse_input_applies<T>(batch, in, out)) return false;
      return listed_then_over_outputs(x, batch, in, out, [&](std::span<const sparse_input* const> parts, index_t o0,
                                                             index_t o1) {
        sparse_input_weight_gradient_part(parts, dy, out, dweight, in, accumulate, o0, o1);
      });
    }
    (void)x, (void)dy, (void)dweight, (void)batch, (void)in, (void)out, (void)accumulate;
    return false;
  }

 private:
  // The calling thread's listing of an input: scratch, reused for its buffers alone.
  static sparse_input& thread_input() {
    static thread_local sparse_input input;
    return input;
  }

  // Lists x, then, where it qualifies, calls part(parts, o0, o1) over the outputs in chunks of the blocks a pass holds
  // in registers (16 * max_vectors outputs; the last may be fewer), on one parallel region's threads where there are
  // several, shared out by chunk_ranges. parts: the team's listings of x in row order. Returns whether x qualified.
  template <class Part>
  static bool listed_then_over_outputs(const float* x, index_t batch, index_t in, index_t out, Part&& part) {
    const int threads = int(std::min<index_t>({num_threads(), out / 16, batch, max_listing_threads}));
    const sparse_input* parts[max_listing_threads] = {};
    if (threads <= 1) {
      parts[0] = list_share(x, batch, in, 0, 1);
      if (!shares_qualify(batch, in, 1, parts)) return false;
      part(std::span<const sparse_input* const>(parts, 1), index_t{0}, out);
      return true;
    }
#if defined(_OPENMP)
    constexpr index_t block = 16 * sparse_input_detail::max_vectors;
    bool qualified = false;
    chunk_ranges ranges(threads, (out + block - 1) / block);
#pragma omp parallel num_threads(threads)
    {
      const int team = omp_get_num_threads(), id = omp_get_thread_num();
      parts[id] = list_share(x, batch, in, id, team);
#pragma omp barrier
      const bool listed = shares_qualify(batch, in, team, parts);
      if (id == 0) qualified = listed;
      if (listed) {
        const std::span<const sparse_input* const> all(parts, std::size_t(team));
        ranges.run(id, [&](index_t chunk) { part(all, chunk * block, std::min(out, (chunk + 1) * block)); });
      }
    }
    return qualified;
#else
    return false;
#endif
  }
};

}  // namespace kiln::kernels::cpu
