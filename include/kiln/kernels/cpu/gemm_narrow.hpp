// The narrow-product kernel: C = A B^T with fewer columns than one vector has lanes (n < width), A (m x k) and B
// (n x k) both laid out along k. This is a Dense layer with a handful of outputs over a batch: a 10-class head, the
// seed regression's hidden layer (1000 x 10 x 100).
//
// The blocked kernel gives every output its own lane and broadcasts one element of A per FMA, so such a product fills
// n of the 16 lanes and costs one load per FMA. Here each vector holds two outputs times width / 2 consecutive steps of
// k (their "phases"): one load broadcasts width / 2 consecutive elements of a row of A into both halves of a register,
// and ceil(n / 2) FMAs use it against vectors of B packed in the same layout. Every lane is busy and the loads are a
// fifth of the FMAs for n = 10.
//
// Each output is then the sum of width / 2 FMA chains (one per phase, each over its steps of k in order) added by a
// fixed tree of lane permutes: the order depends on k alone, never on the row, the tile or the thread, so the bits
// are deterministic. They differ from the one-chain order of the blocked kernel, which is why gemm picks this path by
// the product's shape and layout alone (narrow_product), never by thread count or size of m.
#pragma once

#include <algorithm>
#include <array>

#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"

namespace kiln::kernels::cpu::gemm_detail {

// Below this depth the sum of the phases at the end costs more than the full lanes save.
inline constexpr index_t narrow_min_k = 32;

// Whether gemm runs C = op(A) op(B) on the narrow kernel: op(A) = A stored m x k, op(B) = B^T with B stored n x k
// (a Dense layer's weight), n < width, and k deep enough. Only where the instruction set has lane permutes
// (AVX-512); elsewhere every product stays on the blocked kernel.
template <class T>
constexpr bool narrow_product(bool transpose_a, bool transpose_b, index_t n, index_t k) {
  if constexpr (simd<T>::lane_permutes)
    return !transpose_a && transpose_b && n < simd<T>::width && k >= narrow_min_k;
  else
    return false;
}

// Rows of C per tile for a product of `groups` output pairs: Rows x groups accumulators, Rows broadcast rows of A and
// one B vector must fit the 32 vector registers.
constexpr int narrow_tile_rows(int groups) { return std::min(8, 31 / (groups + 1)); }

// The packed B: for each step q of width / 2 values of k, ceil(n / 2) vectors; vector g holds output 2g's
// B(2g, q * P .. q * P + P - 1) in its first half and output 2g + 1's in its second, zero past n and past k.
template <class T>
index_t narrow_packed_size(index_t n, index_t k) {
  constexpr index_t phases = simd<T>::width / 2;
  return (k + phases - 1) / phases * ((n + 1) / 2) * simd<T>::width;
}

template <class T>
void pack_narrow_b(const T* b, index_t ldb, index_t n, index_t k, T* packed) {
  constexpr int phases = simd<T>::width / 2;
  const index_t groups = (n + 1) / 2;
  for (index_t q = 0; q * phases < k; ++q) {
    const int steps = int(std::min<index_t>(phases, k - q * phases));
    for (index_t j = 0; j < 2 * groups; ++j) {
      T* dst = packed + (q * groups + j / 2) * simd<T>::width + (j % 2) * phases;
      const int real = j < n ? steps : 0;
      const T* src = j < n ? b + j * ldb + q * phases : nullptr;
      for (int p = 0; p < real; ++p) dst[p] = src[p];
      for (int p = real; p < phases; ++p) dst[p] = T(0);
    }
  }
}

// One level of the phase sum: two registers, each `outputs` outputs x Phases phases, become one of 2 * outputs
// outputs x Phases / 2 phases, the first register's outputs first. Lane l takes phase p and p + Phases / 2 of its
// output (the low and the high index), which are then added.
template <int Width, int Phases, bool High>
constexpr std::array<int, Width> phase_sum_index() {
  std::array<int, Width> index{};
  constexpr int half = Phases / 2, outputs = Width / Phases;
  for (int lane = 0; lane < Width; ++lane) {
    const int block = lane / half;
    index[std::size_t(lane)] = (block < outputs ? 0 : Width) + (block % outputs) * Phases + lane % half +
                               (High ? half : 0);
  }
  return index;
}

// Sums the phases of `Groups` registers of output pairs into one register whose lane j is output j. A register
// without a partner at some level is paired with itself (the copies land in lanes past n).
template <class T, int Phases, int Groups>
KILN_ALWAYS_INLINE typename simd<T>::reg sum_phases(typename simd<T>::reg (&v)[Groups]) {
  using S = simd<T>;
  if constexpr (Phases == 1) {
    static_assert(Groups == 1);
    return v[0];
  } else {
    static constexpr auto low = phase_sum_index<S::width, Phases, false>();
    static constexpr auto high = phase_sum_index<S::width, Phases, true>();
    const auto low_index = S::load_index(low.data()), high_index = S::load_index(high.data());
    constexpr int next = (Groups + 1) / 2;
    typename S::reg u[next];
#pragma GCC unroll 8
    for (int i = 0; i < next; ++i) {
      const auto a = v[2 * i], b = 2 * i + 1 < Groups ? v[2 * i + 1] : v[2 * i];
      u[i] = S::add(S::permute2(a, low_index, b), S::permute2(a, high_index, b));
    }
    return sum_phases<T, Phases / 2, next>(u);
  }
}

// One step of width / 2 values of k: every broadcast row of A against every B vector of the step.
template <class T, int Rows, int Groups>
KILN_ALWAYS_INLINE void narrow_step(typename simd<T>::reg (&acc)[Rows][Groups],
                                    const typename simd<T>::reg (&av)[Rows], const T* b) {
  using S = simd<T>;
#pragma GCC unroll 8
  for (int g = 0; g < Groups; ++g) {
    const auto bv = S::load(b + g * S::width);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) acc[r][g] = S::fmadd(av[r], bv, acc[r][g]);
  }
}

// Rows x n tile of C = epilogue(A rows * packed B) over all of k (no k blocks: the epilogue runs once, as the first
// and last block of store_tile).
template <class T, int Rows, int Groups>
KILN_NOINLINE void narrow_kernel(index_t k, const T* KILN_RESTRICT a, index_t lda, const T* KILN_RESTRICT b, T* c,
                                 index_t ldc, int n, const tile_epilogue<T>& ep) {
  using S = simd<T>;
  using Reg = typename S::reg;
  constexpr int W = S::width, phases = W / 2;
  Reg acc[Rows][Groups];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int g = 0; g < Groups; ++g) acc[r][g] = S::zero();
  const index_t steps = k / phases;
  for (index_t q = 0; q < steps; ++q) {
    Reg av[Rows];
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) av[r] = S::load_halves(a + r * lda + q * phases);
    narrow_step<T, Rows, Groups>(acc, av, b + q * Groups * W);
  }
  if (const int rest = int(k - steps * phases); rest > 0) {
    Reg av[Rows];
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) av[r] = S::load_halves_n(a + r * lda + steps * phases, rest);
    narrow_step<T, Rows, Groups>(acc, av, b + steps * Groups * W);
  }
  Reg sums[Rows][1];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) sums[r][0] = sum_phases<T, phases, Groups>(acc[r]);
  store_tile<T, Rows, 1>(sums, c, ldc, n, ep);
}

// Rows [i0, i1) of C on the calling thread: full tiles, then the rest one row at a time (same bits per row).
template <class T, int Groups>
void narrow_rows(index_t k, const T* a, index_t lda, const T* b_packed, T* c, index_t ldc, int n, index_t i0,
                 index_t i1, const tile_epilogue<T>& ep) {
  constexpr int rows = narrow_tile_rows(Groups);
  index_t i = i0;
  for (; i + rows <= i1; i += rows) narrow_kernel<T, rows, Groups>(k, a + i * lda, lda, b_packed, c + i * ldc, ldc, n, ep);
  for (; i < i1; ++i) narrow_kernel<T, 1, Groups>(k, a + i * lda, lda, b_packed, c + i * ldc, ldc, n, ep);
}

// narrow_rows for a run-time number of output pairs, 1 .. width / 2.
template <class T, int Groups = 1>
void narrow_rows_for(int groups, index_t k, const T* a, index_t lda, const T* b_packed, T* c, index_t ldc, int n,
                     index_t i0, index_t i1, const tile_epilogue<T>& ep) {
  if constexpr (Groups < simd<T>::width / 2)
    if (groups != Groups)
      return narrow_rows_for<T, Groups + 1>(groups, k, a, lda, b_packed, c, ldc, n, i0, i1, ep);
  narrow_rows<T, Groups>(k, a, lda, b_packed, c, ldc, n, i0, i1, ep);
}

}  // namespace kiln::kernels::cpu::gemm_detail
