// The GEMM micro-kernel: a Rows x (Vecs * width) tile of C kept in vector registers while the packed A and B
// panels stream past, followed by the fused epilogue (alpha, beta, bias, activation) applied as the tile is stored.
//
// Written once against a tiny SIMD layer (simd<T>) with one specialisation per instruction set: AVX-512, AVX2+FMA,
// and a portable fixed-size-array fallback that the compiler auto-vectorises.
#pragma once

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include <cmath>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::kernels::cpu::gemm_detail {

// Hides a value from the optimiser so that the multiply that produced it cannot be contracted into an FMA with the
// add that follows. GCC contracts a*b+c across statements (-ffp-contract=fast is its default in GNU mode), which
// would make "alpha*acc + bias" inside the kernel round differently from "alpha*acc, store, then + bias" outside it.
template <class R>
KILN_ALWAYS_INLINE void opaque(R& x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
#if defined(__AVX512F__)
  __asm__("" : "+v"(x));
#else
  __asm__("" : "+x"(x));
#endif
#elif defined(__GNUC__)
  __asm__("" : "+m"(x));
#else
  volatile R sink = x;
  x = sink;
#endif
}

// a*b + c with a single rounding where the hardware has FMA, else a rounded product then a rounded add; either way
// the same expression in every path of one build.
template <class T>
KILN_ALWAYS_INLINE T scalar_fmadd(T a, T b, T c) {
#if defined(__FMA__) || defined(__aarch64__)
  return std::fma(a, b, c);
#else
  T product = a * b;
  opaque(product);
  return product + c;
#endif
}

// ---- SIMD layer -----------------------------------------------------------------------------------------------------
// simd<T>::reg holds `width` values of T. load/store take unaligned pointers; *_n variants touch only the first n
// lanes (load_n: 1 <= n <= width; store_n: 1 <= n < width) and read zeros elsewhere. relu/leaky_relu are
// bit-identical to kernels::activate. load_masked(p, lanes(n)) is load_n with the mask made once, for loops;
// cheap_masked_load says it costs no more than load (AVX-512), so a kernel may use it on every step. Where
// lane_permutes is true (AVX-512) there are also load_halves (width / 2 values repeated in both halves) and permute2
// (any lanes of two registers), for the narrow-product GEMM (gemm_narrow.hpp).

template <class T>
struct simd_portable {
  static constexpr int width = 32 / int(sizeof(T));
  static constexpr bool cheap_masked_load = false;
  static constexpr bool lane_permutes = false;  // no load_halves / permute2 (the narrow-product path needs them)
  struct reg {
    T v[width];
  };
  using mask = int;
  static KILN_ALWAYS_INLINE mask lanes(int n) { return n; }
  static KILN_ALWAYS_INLINE reg zero() {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = T(0);
    return r;
  }
  static KILN_ALWAYS_INLINE reg set1(T x) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = x;
    return r;
  }
  static KILN_ALWAYS_INLINE reg load(const T* p) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = p[l];
    return r;
  }
  static KILN_ALWAYS_INLINE reg load_n(const T* p, int n) {
    reg r = zero();
    for (int l = 0; l < n; ++l) r.v[l] = p[l];
    return r;
  }
  static KILN_ALWAYS_INLINE reg load_masked(const T* p, mask n) { return load_n(p, n); }
  static KILN_ALWAYS_INLINE void store(T* p, const reg& x) {
    for (int l = 0; l < width; ++l) p[l] = x.v[l];
  }
  static KILN_ALWAYS_INLINE void store_n(T* p, const reg& x, int n) {
    for (int l = 0; l < n; ++l) p[l] = x.v[l];
  }
  static KILN_ALWAYS_INLINE reg fmadd(const reg& a, const reg& b, const reg& c) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = a.v[l] * b.v[l] + c.v[l];
    return r;
  }
  static KILN_ALWAYS_INLINE reg mul(const reg& a, const reg& b) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = a.v[l] * b.v[l];
    return r;
  }
  static KILN_ALWAYS_INLINE reg add(const reg& a, const reg& b) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = a.v[l] + b.v[l];
    return r;
  }
  static KILN_ALWAYS_INLINE reg relu(const reg& x) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = activate(activation::relu, x.v[l], T(0));
    return r;
  }
  static KILN_ALWAYS_INLINE reg leaky_relu(const reg& x, T slope) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = activate(activation::leaky_relu, x.v[l], slope);
    return r;
  }
  // The ReLU's backward: y > 0 ? dy : +0, from its output y.
  static KILN_ALWAYS_INLINE reg relu_backward(const reg& y, const reg& dy) {
    reg r;
    for (int l = 0; l < width; ++l) r.v[l] = activate_backward(activation::relu, T(0), y.v[l], dy.v[l], T(0));
    return r;
  }
  // reg is an array, not a register: hide it through memory.
  static KILN_ALWAYS_INLINE void opaque(reg& x) {
#if defined(__GNUC__)
    __asm__("" : "+m"(x));
#else
    volatile reg sink = x;
    x = sink;
#endif
  }
};

template <class T>
struct simd : simd_portable<T> {};

#if defined(__AVX512F__)
template <>
struct simd<float> {
  static constexpr int width = 16;
  static constexpr bool cheap_masked_load = true;
  using reg = __m512;
  using mask = __mmask16;
  static constexpr bool lane_permutes = true;
  using index = __m512i;
  static KILN_ALWAYS_INLINE __mmask16 first(int n) { return __mmask16((1u << n) - 1u); }
  static KILN_ALWAYS_INLINE mask lanes(int n) { return first(n); }
  static KILN_ALWAYS_INLINE reg load_masked(const float* p, mask m) { return _mm512_maskz_loadu_ps(m, p); }
  // p[0..7] in both halves (one load: vbroadcastf64x4); the _n form reads only p[0..n-1] and zeros the rest.
  static KILN_ALWAYS_INLINE reg load_halves(const float* p) {
    // (The maskz form: GCC 12 warns that the plain one's undefined pass-through register may be used uninitialised.)
    return _mm512_castpd_ps(_mm512_maskz_broadcast_f64x4(0xFF, _mm256_castps_pd(_mm256_loadu_ps(p))));
  }
  static KILN_ALWAYS_INLINE reg load_halves_n(const float* p, int n) {
    const reg x = _mm512_maskz_loadu_ps(first(n), p);
    return _mm512_maskz_shuffle_f32x4(0xFFFF, x, x, 0x44);
  }
  // Lane l of the result is lane idx[l] of the 2 * width lanes of (a, b).
  static KILN_ALWAYS_INLINE index load_index(const int* idx) { return _mm512_loadu_si512(idx); }
  static KILN_ALWAYS_INLINE reg permute2(reg a, index idx, reg b) { return _mm512_permutex2var_ps(a, idx, b); }
  static KILN_ALWAYS_INLINE reg zero() { return _mm512_setzero_ps(); }
  static KILN_ALWAYS_INLINE reg set1(float x) { return _mm512_set1_ps(x); }
  static KILN_ALWAYS_INLINE reg load(const float* p) { return _mm512_loadu_ps(p); }
  static KILN_ALWAYS_INLINE reg load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static KILN_ALWAYS_INLINE void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static KILN_ALWAYS_INLINE void store_n(float* p, reg x, int n) { _mm512_mask_storeu_ps(p, first(n), x); }
  static KILN_ALWAYS_INLINE reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static KILN_ALWAYS_INLINE reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static KILN_ALWAYS_INLINE reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  // x > 0 ? x : 0, NaN -> 0 and -0 -> +0 exactly like the scalar comparison.
  static KILN_ALWAYS_INLINE reg relu(reg x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_GT_OQ), x);
  }
  static KILN_ALWAYS_INLINE reg leaky_relu(reg x, float slope) {
    return _mm512_mask_mov_ps(mul(x, set1(slope)), _mm512_cmp_ps_mask(x, zero(), _CMP_GT_OQ), x);
  }
  // y > 0 ? dy : +0 (the ReLU's backward from its output), NaN y -> +0 like the scalar comparison.
  static KILN_ALWAYS_INLINE reg relu_backward(reg y, reg dy) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, zero(), _CMP_GT_OQ), dy);
  }
  static KILN_ALWAYS_INLINE void opaque(reg& x) { gemm_detail::opaque(x); }
};

template <>
struct simd<double> {
  static constexpr int width = 8;
  static constexpr bool cheap_masked_load = true;
  using reg = __m512d;
  using mask = __mmask8;
  static constexpr bool lane_permutes = true;
  using index = __m512i;
  static KILN_ALWAYS_INLINE __mmask8 first(int n) { return __mmask8((1u << n) - 1u); }
  static KILN_ALWAYS_INLINE mask lanes(int n) { return first(n); }
  static KILN_ALWAYS_INLINE reg load_masked(const double* p, mask m) { return _mm512_maskz_loadu_pd(m, p); }
  static KILN_ALWAYS_INLINE reg load_halves(const double* p) {
    return _mm512_maskz_broadcast_f64x4(0xFF, _mm256_loadu_pd(p));
  }
  static KILN_ALWAYS_INLINE reg load_halves_n(const double* p, int n) {
    const reg x = _mm512_maskz_loadu_pd(first(n), p);
    return _mm512_maskz_shuffle_f64x2(0xFF, x, x, 0x44);
  }
  static KILN_ALWAYS_INLINE index load_index(const int* idx) {
    return _mm512_maskz_cvtepi32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)));
  }
  static KILN_ALWAYS_INLINE reg permute2(reg a, index idx, reg b) { return _mm512_permutex2var_pd(a, idx, b); }
  static KILN_ALWAYS_INLINE reg zero() { return _mm512_setzero_pd(); }
  static KILN_ALWAYS_INLINE reg set1(double x) { return _mm512_set1_pd(x); }
  static KILN_ALWAYS_INLINE reg load(const double* p) { return _mm512_loadu_pd(p); }
  static KILN_ALWAYS_INLINE reg load_n(const double* p, int n) { return _mm512_maskz_loadu_pd(first(n), p); }
  static KILN_ALWAYS_INLINE void store(double* p, reg x) { _mm512_storeu_pd(p, x); }
  static KILN_ALWAYS_INLINE void store_n(double* p, reg x, int n) { _mm512_mask_storeu_pd(p, first(n), x); }
  static KILN_ALWAYS_INLINE reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_pd(a, b, c); }
  static KILN_ALWAYS_INLINE reg mul(reg a, reg b) { return _mm512_mul_pd(a, b); }
  static KILN_ALWAYS_INLINE reg add(reg a, reg b) { return _mm512_add_pd(a, b); }
  static KILN_ALWAYS_INLINE reg relu(reg x) {
    return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(x, zero(), _CMP_GT_OQ), x);
  }
  static KILN_ALWAYS_INLINE reg leaky_relu(reg x, double slope) {
    return _mm512_mask_mov_pd(mul(x, set1(slope)), _mm512_cmp_pd_mask(x, zero(), _CMP_GT_OQ), x);
  }
  static KILN_ALWAYS_INLINE reg relu_backward(reg y, reg dy) {
    return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(y, zero(), _CMP_GT_OQ), dy);
  }
  static KILN_ALWAYS_INLINE void opaque(reg& x) { gemm_detail::opaque(x); }
};

#elif defined(__AVX2__) && defined(__FMA__)
template <>
struct simd<float> {
  static constexpr int width = 8;
  static constexpr bool cheap_masked_load = false;
  static constexpr bool lane_permutes = false;
  using reg = __m256;
  using mask = __m256i;
  static KILN_ALWAYS_INLINE __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static KILN_ALWAYS_INLINE reg zero() { return _mm256_setzero_ps(); }
  static KILN_ALWAYS_INLINE reg set1(float x) { return _mm256_set1_ps(x); }
  static KILN_ALWAYS_INLINE reg load(const float* p) { return _mm256_loadu_ps(p); }
  static KILN_ALWAYS_INLINE reg load_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static KILN_ALWAYS_INLINE mask lanes(int n) { return first(n); }
  static KILN_ALWAYS_INLINE reg load_masked(const float* p, mask m) { return _mm256_maskload_ps(p, m); }
  static KILN_ALWAYS_INLINE void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  // The first n (< 8) lanes by plain 4-, 2- and 1-lane stores: vmaskmovps stores are microcoded on AMD's Zen (tens of
  // cycles each), and a 10-wide Dense output ends every row of every tile with one.
  static KILN_ALWAYS_INLINE void store_n(float* p, reg x, int n) {
    __m128 part = _mm256_castps256_ps128(x);
    if (n & 4) {
      _mm_storeu_ps(p, part);
      part = _mm256_extractf128_ps(x, 1);
      p += 4;
    }
    if (n & 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
      part = _mm_movehl_ps(part, part);
      p += 2;
    }
    if (n & 1) _mm_store_ss(p, part);
  }
  static KILN_ALWAYS_INLINE reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static KILN_ALWAYS_INLINE reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static KILN_ALWAYS_INLINE reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static KILN_ALWAYS_INLINE reg relu(reg x) { return _mm256_and_ps(_mm256_cmp_ps(x, zero(), _CMP_GT_OQ), x); }
  static KILN_ALWAYS_INLINE reg leaky_relu(reg x, float slope) {
    return _mm256_blendv_ps(mul(x, set1(slope)), x, _mm256_cmp_ps(x, zero(), _CMP_GT_OQ));
  }
  static KILN_ALWAYS_INLINE reg relu_backward(reg y, reg dy) {
    return _mm256_and_ps(_mm256_cmp_ps(y, zero(), _CMP_GT_OQ), dy);
  }
  static KILN_ALWAYS_INLINE void opaque(reg& x) { gemm_detail::opaque(x); }
};

template <>
struct simd<double> {
  static constexpr int width = 4;
  static constexpr bool cheap_masked_load = false;
  static constexpr bool lane_permutes = false;
  using reg = __m256d;
  using mask = __m256i;
  static KILN_ALWAYS_INLINE __m256i first(int n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
  }
  static KILN_ALWAYS_INLINE reg zero() { return _mm256_setzero_pd(); }
  static KILN_ALWAYS_INLINE reg set1(double x) { return _mm256_set1_pd(x); }
  static KILN_ALWAYS_INLINE reg load(const double* p) { return _mm256_loadu_pd(p); }
  static KILN_ALWAYS_INLINE reg load_n(const double* p, int n) { return _mm256_maskload_pd(p, first(n)); }
  static KILN_ALWAYS_INLINE mask lanes(int n) { return first(n); }
  static KILN_ALWAYS_INLINE reg load_masked(const double* p, mask m) { return _mm256_maskload_pd(p, m); }
  static KILN_ALWAYS_INLINE void store(double* p, reg x) { _mm256_storeu_pd(p, x); }
  static KILN_ALWAYS_INLINE void store_n(double* p, reg x, int n) { _mm256_maskstore_pd(p, first(n), x); }
  static KILN_ALWAYS_INLINE reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_pd(a, b, c); }
  static KILN_ALWAYS_INLINE reg mul(reg a, reg b) { return _mm256_mul_pd(a, b); }
  static KILN_ALWAYS_INLINE reg add(reg a, reg b) { return _mm256_add_pd(a, b); }
  static KILN_ALWAYS_INLINE reg relu(reg x) { return _mm256_and_pd(_mm256_cmp_pd(x, zero(), _CMP_GT_OQ), x); }
  static KILN_ALWAYS_INLINE reg leaky_relu(reg x, double slope) {
    return _mm256_blendv_pd(mul(x, set1(slope)), x, _mm256_cmp_pd(x, zero(), _CMP_GT_OQ));
  }
  static KILN_ALWAYS_INLINE reg relu_backward(reg y, reg dy) {
    return _mm256_and_pd(_mm256_cmp_pd(y, zero(), _CMP_GT_OQ), dy);
  }
  static KILN_ALWAYS_INLINE void opaque(reg& x) { gemm_detail::opaque(x); }
};
#endif

// ---- register blocking ----------------------------------------------------------------------------------------------
// mr rows of A are broadcast against nr columns of B (nr = vecs * width). The accumulator tile mr x vecs must fit in
// the register file with room left for the B vectors: AVX-512 has 32 registers, so 8 x 2 zmm = 16 accumulators (64
// independent FMA chains of 4-cycle latency on 2 FMA ports: more than enough) and 2 B loads + 8 embedded broadcasts per
// 16 FMAs keep the two load ports below the FMA rate. AVX2 has 16 ymm registers: 6 x 2 = 12 accumulators.
// mr = 8 also lets the packing of row-major A use 8 x 8 in-register transposes.
// An A read in place has no packed layout to keep to, so its tiles may be taller: up to mr_in_place rows (12 x 2 zmm =
// 24 accumulators on AVX-512). A Dense layer's weight gradient with 10 outputs then runs as one 10-row tile instead of
// 8 + 2, whose 2-row tile streamed all of B again for a fifth of the work.
template <class T>
struct register_block {
#if defined(__AVX512F__)
  static constexpr int mr = 8;
  static constexpr int mr_in_place = 12;
#elif defined(__AVX2__) && defined(__FMA__)
  static constexpr int mr = 6;
  static constexpr int mr_in_place = 6;
#else
  static constexpr int mr = 4;
  static constexpr int mr_in_place = 4;
#endif
  static constexpr int vecs = 2;
  static constexpr int width = simd<T>::width;
  static constexpr int nr = vecs * width;
};

// What the store of a tile does, beyond writing alpha * (the tile's partial product).
template <class T>
struct tile_epilogue {
  T alpha;
  T beta;
  const T* bias;  // already offset to the tile's first column, or null
  activation act;
  T slope;
  bool first_k_block;  // C holds the caller's values: scale them by beta (or ignore them when beta == 0)
  bool last_k_block;   // the sum over k is complete: add the bias and apply the activation
};

// Stores the accumulators acc (rows x vecs registers) to the tile of C at c, of which only the first `cols` columns
// are real. Per element, in this order: v = alpha*acc + (first block ? beta*C : C); then, after the last block only,
// v += bias[j]; v = act(v). The same operations run whether or not an epilogue is present, so "gemm with bias + act"
// equals "gemm, then + bias, then act" bit for bit.
template <class T, int Rows, int Vecs, class Reg>
KILN_ALWAYS_INLINE void store_tile(Reg (&acc)[Rows][Vecs], T* c, index_t ldc, int cols, const tile_epilogue<T>& ep) {
  using S = simd<T>;
  constexpr int W = S::width;
  const auto alpha = S::set1(ep.alpha);
  const auto beta = S::set1(ep.beta);
  const bool read_c_scaled = ep.first_k_block && ep.beta != T(0);
  const bool apply_tail = ep.last_k_block;
  const bool vector_act = ep.act == activation::identity || ep.act == activation::relu ||
                          ep.act == activation::leaky_relu;
  // Unrolled, so that the accumulators stay in registers: a loop indexing acc at run time makes GCC keep the tile in
  // memory, and it has then been seen to store the whole tile on every step of the micro-kernel's loop.
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
    T* crow = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      const int lanes = cols - v * W < W ? cols - v * W : W;
      const bool full = lanes == W;
      T* cp = crow + v * W;
      Reg x;
      if (ep.first_k_block) {
        x = S::mul(alpha, acc[r][v]);
        S::opaque(x);
        if (read_c_scaled) x = S::fmadd(beta, full ? S::load(cp) : S::load_n(cp, lanes), x);
      } else {
        x = S::fmadd(alpha, acc[r][v], full ? S::load(cp) : S::load_n(cp, lanes));
      }
      if (apply_tail) {
        if (ep.bias) x = S::add(x, full ? S::load(ep.bias + v * W) : S::load_n(ep.bias + v * W, lanes));
        if (ep.act == activation::relu)
          x = S::relu(x);
        else if (ep.act == activation::leaky_relu)
          x = S::leaky_relu(x, ep.slope);
      }
      if (full)
        S::store(cp, x);
      else
        S::store_n(cp, x, lanes);
    }
  }
  // GELU, sigmoid and tanh go through the scalar function itself while the tile is still in L1; GELU's loop knows
  // its activation, so that it vectorises.
  if (apply_tail && !vector_act) {
    for (int r = 0; r < Rows; ++r) {
      T* crow = c + r * ldc;
      if (ep.act == activation::gelu)
        for (int j = 0; j < cols; ++j) crow[j] = activate(activation::gelu, crow[j], T(0));
      else
        for (int j = 0; j < cols; ++j) crow[j] = activate(ep.act, crow[j], ep.slope);
    }
  }
}

// Where a micro-kernel reads its operands: element (r, p) of the A panel at a[r * a_row + p * a_step], row p of the
// B panel at b + p * b_step. Packed panels have a_row = 1, a_step = mr, b_step = nr; a panel read in place (when
// packing would cost more than it saves, see gemm_blocked) has the strides of the matrix it lies in.
struct panel_strides {
  index_t a_row, a_step, b_step;
};

// C tile (Rows x cols, cols <= Vecs * width) = epilogue(A panel * B panel) over kc steps of k.
// Packed (InPlace false): a is a packed A micro-panel, element (r, p) at a[p * mr + r]; b a packed B micro-panel,
// element (p, j) at b[p * nr + j], zero beyond the real columns. In place: the strides say where they are (B then
// holds Vecs full vectors per row). Each accumulator is one FMA chain running p = 0, 1, ..., kc-1 in order, so every
// element's sum has the same rounding whichever tile, thread, edge case or operand layout computed it.
// Where masked loads are cheap, an in-place B panel may be partial: its last vector is read under a mask of the
// columns that exist, so a narrow edge panel (the 4 columns left of 100) is not packed just to pad it with zeros.
template <class T, int Rows, int Vecs, bool InPlace>
KILN_NOINLINE void micro_kernel(index_t kc, const T* KILN_RESTRICT a, const T* KILN_RESTRICT b, panel_strides st,
                                T* c, index_t ldc, int cols, const tile_epilogue<T>& ep) {
  using S = simd<T>;
  using Reg = typename S::reg;
  constexpr int W = S::width;
  const index_t a_row = InPlace ? st.a_row : 1;
  const index_t a_step = InPlace ? st.a_step : register_block<T>::mr;
  const index_t b_step = InPlace ? st.b_step : register_block<T>::nr;
  constexpr bool mask_last = InPlace && S::cheap_masked_load;
  [[maybe_unused]] const auto last_mask = S::lanes(mask_last ? cols - (Vecs - 1) * W : W);
  Reg acc[Rows][Vecs];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = S::zero();
#pragma GCC unroll 2
  for (index_t p = 0; p < kc; ++p) {
    Reg bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v)
      bv[v] = mask_last && v == Vecs - 1 ? S::load_masked(b + v * W, last_mask) : S::load(b + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const Reg av = S::set1(a[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
    }
    a += a_step;
    b += b_step;
  }
  store_tile<T, Rows, Vecs>(acc, c, ldc, cols, ep);
}

// The micro-kernel for a tile of `rows` (1..mr, or 1..mr_in_place in place) by `vecs` (1..register_block::vecs)
// vectors, chosen at run time.
template <class T>
using micro_kernel_fn = void (*)(index_t, const T*, const T*, panel_strides, T*, index_t, int, const tile_epilogue<T>&);

template <class T>
struct micro_kernel_table {
  micro_kernel_fn<T> fn[register_block<T>::mr_in_place][2];
};
template <class T, bool InPlace, int... R>
constexpr micro_kernel_table<T> make_micro_kernel_table(std::integer_sequence<int, R...>) {
  return {{{&micro_kernel<T, R + 1, 1, InPlace>, &micro_kernel<T, R + 1, 2, InPlace>}...}};
}

template <class T>
KILN_ALWAYS_INLINE micro_kernel_fn<T> select_micro_kernel(int rows, int vecs, bool in_place) {
  static_assert(register_block<T>::vecs == 2);
  static constexpr auto packed =
      make_micro_kernel_table<T, false>(std::make_integer_sequence<int, register_block<T>::mr>{});
  static constexpr auto strided =
      make_micro_kernel_table<T, true>(std::make_integer_sequence<int, register_block<T>::mr_in_place>{});
  return (in_place ? strided : packed).fn[rows - 1][vecs - 1];
}

}  // namespace kiln::kernels::cpu::gemm_detail
