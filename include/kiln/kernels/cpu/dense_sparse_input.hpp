// A Dense layer's forward and weight gradient from an input most of whose elements hold one value, its background:
// MNIST's normalised images, whose blank pixels (four in five) all become (0 - 0.1307) / 0.3081, or one-hot and
// bag-of-words features (background 0). Both products of the input, y = x W^T and dW = dy^T x, then cost what its
// other elements cost:
//
//   x = c + d, with d zero at the background:  x W^T = c (1 W^T) + d W^T,  dy^T x = c (dy^T 1) + dy^T d.
//
// c (1 W^T) is c times W's row sums and c (dy^T 1) c times dy's column sums, each one pass; the products of d take
// its nonzeros alone, listed by row for the forward and by column for the weight gradient. Where c is 0 these are
// the plain sparse products.
//
// The sums are those of the dense product, in another order and with d = x - c rounded once, so the results are the
// dense product's within float rounding, not its bits (tests/test_dense_sparse_input.cpp checks them against a
// double-precision product). Which path a product takes depends on the input's values alone, never on the threads, so
// static and dynamic mode, and the fused step (fused_mlp.hpp), all take the same one and agree bit for bit. The
// kernels multiply in single precision whatever the policy's precision, as the sparse convolution gradients do.
//
// Why the layouts: the forward keeps a row's outputs (up to 128 of them) in registers and adds, for each listed
// element, that element times a row of W^T, so W is transposed once per call into scratch; the weight gradient keeps a
// column of dW^T in registers and adds each listed element times a row of dy, then transposes dW^T into dW. Both
// transposes run 16 x 16 in registers (gemm_pack.hpp's transpose_16x16, which the AMX path packs with) and cost about a
// tenth of the products they replace on MNIST's 784 x 128.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/env_switch.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"
#include "kiln/kernels/cpu/gemm_scratch.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"

namespace kiln::kernels::cpu {

// Inputs with at most this fraction of elements off the background take the sparse products; denser ones the dense
// GEMM, which is then faster (bench/gemm_bench times both at several densities).
inline constexpr double sparse_input_max_density = 0.3;

namespace sparse_input_detail {
// Whether the user allows the kernels: set_sparse_input_products, initialised from KILN_SPARSE_INPUT.
inline std::atomic<bool>& sparse_allowed() {
  static std::atomic<bool> allowed{env_switch_on("KILN_SPARSE_INPUT")};
  return allowed;
}
// Output units a pass holds in registers: 8 vectors of 16. (Passes of 4 vectors, whose rows of dy and blocks of W^T's
// rows would stay in L1, ran slower: 1.1-1.4x the time on Zen 4, the lists walked twice and a block's partial sums
// stored and reloaded per row.)
inline constexpr int max_vectors = 8;

#if defined(__AVX512F__)
// dst[c * ld_dst + r] = src[r * ld_src + c] (+ dst's value where add) for r < rows, c < cols, both at most 16:
// gemm_detail::transpose_16x16 between masked loads and stores.
KILN_ALWAYS_INLINE void transpose_tile(const float* src, index_t ld_src, int rows, int cols, float* dst,
                                       index_t ld_dst, bool add) {
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

// Turns the sparse-input products on or off for every later call (on by default; KILN_SPARSE_INPUT=0 in the
// environment starts them off). Unlike the sparse convolution gradients they change results within float rounding.
inline void set_sparse_input_products(bool enabled) {
  sparse_input_detail::sparse_allowed().store(enabled, std::memory_order_relaxed);
}
inline bool sparse_input_products_enabled() {
  return sparse_input_detail::sparse_allowed().load(std::memory_order_relaxed);
}

// An input matrix (rows x cols) as its background value and the differences from it of its other elements, listed
// line by line: row by row (each row's columns ascending) or column by column (each column's rows ascending). The
// buffers grow to the largest input seen and are then reused: no heap traffic in a steady state.
class sparse_input {
 public:
  float background = 0;
  index_t rows = 0, cols = 0, entries = 0;
  bool by_column = false;

  // Line l (row l, or column l where by_column) lists [start[l], start[l + 1]) of index (the elements' columns, or
  // rows) and value. Valid until the next scan.
  const index_t* start = nullptr;
  const std::int32_t* index = nullptr;
  const float* value = nullptr;

  // Lists x (rows x cols, leading dimension ldx) against the background x[0]. Returns false, with nothing usable
  // listed, where x[0] is not finite or more than max_density of the elements differ from it (it stops reading
  // there, so a dense input costs a fraction of one pass). The answer depends on x alone, not on by_column.
  bool scan(const float* x, index_t rows, index_t cols, index_t ldx, bool by_column,
            double max_density = sparse_input_max_density);

 private:
  template <class U>
  static U* grow(gemm_detail::gemm_scratch& s, index_t count) {
    return static_cast<U*>(s.reserve(static_cast<std::size_t>(count) * sizeof(U)));
  }
  gemm_detail::gemm_scratch start_, index_, value_, transposed_;
};

inline bool sparse_input::scan(const float* x, index_t rows_, index_t cols_, index_t ldx, bool by_column_,
                               double max_density) {
#if defined(__AVX512F__)
  rows = rows_;
  cols = cols_;
  by_column = by_column_;
  entries = 0;
  if (rows <= 0 || cols <= 0 || !std::isfinite(x[0])) return false;
  background = x[0];
  // By column: the rows of x^T, transposed 16 x 16 in registers (a counting sort of the row lists took twice as
  // long: its scattered stores wait on each other).
  const float* m = x;
  index_t lines = rows, length = cols, ld = ldx;
  if (by_column) {
    float* const t = grow<float>(transposed_, cols * rows);
    sparse_input_detail::transpose(x, ldx, rows, cols, t, rows, false);
    m = t;
    lines = cols;
    length = rows;
    ld = rows;
  }
  const index_t limit = static_cast<index_t>(max_density * double(rows) * double(cols));
  index_t* const starts = grow<index_t>(start_, lines + 1);
  // Compressed vectors are stored whole: 16 elements of slack past the limit.
  std::int32_t* const indices = grow<std::int32_t>(index_, limit + 16);
  float* const values = grow<float>(value_, limit + 16);
  const __m512 c = _mm512_set1_ps(background);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  index_t count = 0;
  for (index_t l = 0; l < lines; ++l) {
    starts[l] = count;
    const float* line = m + l * ld;
    for (index_t j = 0; j < length; j += 16) {
      const __mmask16 valid = j + 16 <= length ? __mmask16(0xffff) : __mmask16((1u << (length - j)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(valid, line + j);
      // Unordered: a NaN differs from the background and is listed, so that it reaches the outputs it would reach.
      const __mmask16 off = _mm512_mask_cmp_ps_mask(valid, v, c, _CMP_NEQ_UQ);
      if (!off) continue;
      const index_t n = __builtin_popcount(off);
      if (count + n > limit) return false;
      // Compressed in a register and stored whole: Zen 4 runs the compressing store to memory as slow microcode.
      _mm512_storeu_ps(values + count, _mm512_maskz_compress_ps(off, _mm512_sub_ps(v, c)));
      _mm512_storeu_si512(indices + count,
                          _mm512_maskz_compress_epi32(off, _mm512_add_epi32(lane, _mm512_set1_epi32(int(j)))));
      count += n;
    }
  }
  starts[lines] = count;
  entries = count;
  start = starts;
  index = indices;
  value = values;
  return true;
#else
  (void)x, (void)rows_, (void)cols_, (void)ldx, (void)by_column_, (void)max_density;
  return false;
#endif
}

namespace sparse_input_detail {

#if defined(__AVX512F__)
// The chain both products run over one line's listed elements, Vectors vectors wide: acc = c * sums (the
// background's share), then acc += value[t] * the row index[t] of `rows` (leading dimension ld) for each listed
// element in order. The forward's rows are W^T's, the weight gradient's dy's.
template <int Vectors>
KILN_ALWAYS_INLINE void listed_chain(__m512 (&acc)[Vectors], float c, const float* KILN_RESTRICT sums,
                                     const float* KILN_RESTRICT rows, index_t ld,
                                     const std::int32_t* KILN_RESTRICT index, const float* KILN_RESTRICT values,
                                     index_t count) {
  const __m512 background = _mm512_set1_ps(c);
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) acc[v] = _mm512_mul_ps(background, _mm512_loadu_ps(sums + 16 * v));
  for (index_t t = 0; t < count; ++t) {
    const __m512 value = _mm512_set1_ps(values[t]);
    const float* row = rows + index_t(index[t]) * ld;
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) acc[v] = _mm512_fmadd_ps(value, _mm512_loadu_ps(row + 16 * v), acc[v]);
  }
}

// One row of the forward: its chain over W^T's rows (w_t, cols x width), stored through the GEMM's epilogue.
template <int Vectors>
KILN_NOINLINE void forward_row(float c, const float* sums, const float* w_t, index_t width,
                               const std::int32_t* columns, const float* values, index_t count, float* y,
                               const gemm_detail::tile_epilogue<float>& tile) {
  __m512 acc[1][Vectors];
  listed_chain<Vectors>(acc[0], c, sums, w_t, width, columns, values, count);
  gemm_detail::store_tile<float, 1, Vectors>(acc, y, 0, 16 * Vectors, tile);
}

// One column of the transposed weight gradient: its chain over dy's rows, stored to g_t.
template <int Vectors>
KILN_NOINLINE void gradient_column(float c, const float* sums, const float* dy, index_t ldy,
                                   const std::int32_t* rows, const float* values, index_t count, float* g_t) {
  __m512 acc[Vectors];
  listed_chain<Vectors>(acc, c, sums, dy, ldy, rows, values, count);
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) _mm512_storeu_ps(g_t + 16 * v, acc[v]);
}

// sums[o] = the sum of column o of m (count rows, leading dimension ld, width columns: a multiple of 16), added in
// row order: W's row sums from W^T in the forward, dy's column sums in the weight gradient.
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
    ((vectors == V + 1 ? (f.template operator()<V + 1>(), true) : false) || ...);
  }(std::make_integer_sequence<int, max_vectors>{});
}
#endif

inline gemm_detail::gemm_scratch& transposed_scratch() {
  static thread_local gemm_detail::gemm_scratch scratch;
  return scratch;
}


}  // namespace sparse_input_detail

// Outputs [o0, o1) of every row of y = act(x W^T + bias), x listed by s (rows x in), W (out x in, leading dimension
// ldw), y (rows x out, leading dimension ldy); o0 and o1 - o0 multiples of 16. The epilogue is the GEMM's (bias
// added, then the activation). Runs on the calling thread.
inline void sparse_input_forward_part(const sparse_input& s, const float* w, index_t ldw, const float* bias,
                                      activation act, float slope, float* y, index_t ldy, index_t o0, index_t o1) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  const index_t width = o1 - o0, in = s.cols;
  if (width <= 0) return;
  // W's rows [o0, o1) transposed (in x width), then their sums over the inputs, in input order.
  float* const w_t = static_cast<float*>(
      transposed_scratch().reserve(static_cast<std::size_t>((in + 1) * width) * sizeof(float)));
  float* const sums = w_t + in * width;
  transpose(w + o0 * ldw, ldw, width, in, w_t, width, false);
  column_sums(w_t, width, in, width, sums);
  const index_t* starts = s.start;
  for (index_t o = 0; o < width; o += 16 * max_vectors) {
    const int vectors = int(std::min<index_t>(max_vectors, (width - o) / 16));
    const gemm_detail::tile_epilogue<float> tile{1.0f, 0.0f, bias ? bias + o0 + o : nullptr, act, slope, true, true};
    with_vectors(vectors, [&]<int V>() {
      for (index_t i = 0; i < s.rows; ++i)
        forward_row<V>(s.background, sums + o, w_t + o, width, s.index + starts[i], s.value + starts[i],
                       starts[i + 1] - starts[i], y + i * ldy + o0 + o, tile);
    });
  }
#else
  (void)s, (void)w, (void)ldw, (void)bias, (void)act, (void)slope, (void)y, (void)ldy, (void)o0, (void)o1;
#endif
}

// Rows [o0, o1) of dW = dy^T x (added to dW's values where accumulate), x listed by s by column (rows x in), dy
// (rows x out, leading dimension ldy), dW (out x in, leading dimension ldw); o0 and o1 - o0 multiples of 16. Runs on
// the calling thread.
inline void sparse_input_weight_gradient_part(const sparse_input& s, const float* dy, index_t ldy, float* dw,
                                              index_t ldw, bool accumulate, index_t o0, index_t o1) {
#if defined(__AVX512F__)
  using namespace sparse_input_detail;
  const index_t width = o1 - o0, in = s.cols;
  if (width <= 0) return;
  float* const g_t = static_cast<float*>(
      transposed_scratch().reserve(static_cast<std::size_t>((in + 1) * width) * sizeof(float)));
  float* const sums = g_t + in * width;
  column_sums(dy + o0, ldy, s.rows, width, sums);
  const index_t* starts = s.start;
  for (index_t o = 0; o < width; o += 16 * max_vectors) {
    const int vectors = int(std::min<index_t>(max_vectors, (width - o) / 16));
    with_vectors(vectors, [&]<int V>() {
      for (index_t j = 0; j < in; ++j)
        gradient_column<V>(s.background, sums + o, dy + o0 + o, ldy, s.index + starts[j],
                           s.value + starts[j], starts[j + 1] - starts[j], g_t + j * width + o);
    });
  }
  transpose(g_t, width, in, width, dw + o0 * ldw, ldw, accumulate);
#else
  (void)s, (void)dy, (void)ldy, (void)dw, (void)ldw, (void)accumulate, (void)o0, (void)o1;
#endif
}

// Whether a Dense layer of this shape may take the sparse-input products: turned on, floats on AVX-512, a multiple of
// 16 outputs, and enough work that a scan of the input repays itself.
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

// The sparse-input products behind policy::cpu: each returns false, computing nothing, where the layer's input does
// not qualify (dense_sparse_input_applies, sparse_input::scan), and the caller then runs the GEMM.
struct sparse_input_kernels {
  // The calling thread's listings of an input: by row (the forward's) and by column (the weight gradient's).
  static sparse_input& thread_input(bool by_column) {
    static thread_local sparse_input inputs[2];
    return inputs[by_column ? 1 : 0];
  }

  // y = act(x W^T + bias) for x (batch x in), W (out x in), y (batch x out), all contiguous.
  template <class T>
  static bool dense_forward_sparse_input(const T* x, const T* weight, const T* bias, T* y, index_t batch, index_t in,
                                         index_t out, activation act, T slope) {
    if constexpr (std::is_same_v<T, float>) {
      if (!dense_sparse_input_applies<T>(batch, in, out)) return false;
      return listed_then_over_outputs(x, batch, in, out, false, [&](const sparse_input& s, index_t o0, index_t o1) {
        sparse_input_forward_part(s, weight, in, bias, act, slope, y, out, o0, o1);
      });
    }
    (void)x, (void)weight, (void)bias, (void)y, (void)batch, (void)in, (void)out, (void)act, (void)slope;
    return false;
  }

  // dW = dy^T x (+ dW where accumulate) for x (batch x in), dy (batch x out), dW (out x in), all contiguous.
  template <class T>
  static bool dense_weight_gradient_sparse_input(const T* x, const T* dy, T* dweight, index_t batch, index_t in,
                                                 index_t out, bool accumulate) {
    if constexpr (std::is_same_v<T, float>) {
      if (!dense_sparse_input_applies<T>(batch, in, out)) return false;
      return listed_then_over_outputs(x, batch, in, out, true, [&](const sparse_input& s, index_t o0, index_t o1) {
        sparse_input_weight_gradient_part(s, dy, out, dweight, in, accumulate, o0, o1);
      });
    }
    (void)x, (void)dy, (void)dweight, (void)batch, (void)in, (void)out, (void)accumulate;
    return false;
  }

 private:
  // Lists x, then, where it qualifies, runs body(listing, o0, o1) over the outputs in tiles of 16: on one parallel
  // region's threads where there are several, each listing x for itself. (Listing it once, shared out over the
  // threads, left the two-thread step 1.4x as fast as one thread's: each thread then read lists that the other had
  // just written, a cache line from the other core per 16 elements.) Returns whether x qualified, the same answer on
  // every thread.
  template <class Body>
  static bool listed_then_over_outputs(const float* x, index_t batch, index_t in, index_t out, bool by_column,
                                       Body&& body) {
    const index_t tiles = out / 16;
    const int threads = int(std::min<index_t>(num_threads(), tiles));
    if (threads <= 1) {
      sparse_input& s = thread_input(by_column);
      if (!s.scan(x, batch, in, in, by_column)) return false;
      body(s, index_t{0}, out);
      return true;
    }
#if defined(_OPENMP)
    static thread_balance balance;  // one per call site: Body is each caller's own lambda
    const thread_split split = balance.split(threads, tiles, 1);
    bool qualified = false;
    run_clock clock;
#pragma omp parallel num_threads(threads)
    {
      const int team = omp_get_num_threads(), id = omp_get_thread_num();
      sparse_input& s = thread_input(by_column);
      const bool listed = s.scan(x, batch, in, in, by_column);
      const thread_split mine = split.over(team);
      if (listed && mine.begin(tiles, id) < mine.end(tiles, id))
        body(s, mine.begin(tiles, id) * 16, mine.end(tiles, id) * 16);
      if (id == 0) qualified = listed;
      clock.finish(id, team);
    }
    if (qualified) balance.record(split, tiles, clock);
    return qualified;
#else
    return false;
#endif
  }
};

}  // namespace kiln::kernels::cpu
