// Row-major GEMM with a fused epilogue: C = act(alpha * op(A) * op(B) + beta * C + bias), bias indexed by column.
//
// Structure (GotoBLAS / BLIS): C is cut into nc-wide column blocks and k into kc-deep blocks; for each pair one
// kc x nc block of op(B) is packed into per-thread scratch sized for L2, then for every mr-row strip of A a mr x kc
// micro-panel is packed into scratch sized for L1 and swept across all the nr-wide B micro-panels of the block by the
// register-blocked micro-kernel (gemm_microkernel.hpp), which applies the epilogue while storing each tile.
// Tiny products skip all of this and run a direct loop: packing would cost more than the product itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm_amx.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/gemm_narrow.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"
#include "kiln/kernels/cpu/gemm_scratch.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/product_precision.hpp"

namespace kiln::kernels::cpu {

// What a GEMM does to each output element after the product: add a per-column bias, then apply an activation.
template <class T>
struct epilogue {
  const T* bias = nullptr;  // length n, or null
  activation act = activation::identity;
  T slope = T(0.01);  // LeakyReLU's negative slope
};

namespace gemm_detail {

// ---- cache blocking -------------------------------------------------------------------------------------------------
// kc: the A micro-panel (mr x kc) is reused against every B micro-panel of the block, so it must stay in L1 (48 KiB
// on Sapphire Rapids): 8 x 512 floats = 16 KiB leaves two thirds of L1 for the B and C lines streaming through. A
// deep kc also means C is read and written back few times (once per k block).
// nc: the packed B block (kc x nc) is swept once per mr rows of A, so it must stay in L2 (2 MiB per core):
// 512 x 512 floats = 1 MiB, half of L2, the rest for the A rows being packed and for C.
// Blocks are balanced (k = 784 gives two blocks of 392, not 512 + 272) so no block is left tiny.
template <class T>
struct cache_block {
  static constexpr index_t kc = 2048 / index_t(sizeof(T));  // 512 floats, 256 doubles: 16 KiB micro-panel
  static constexpr index_t nc = 512;
};

// Products below this many multiply-adds run as a direct triple loop: no packing, no scratch, no call overhead
// beyond the loop (a Linear(8, 8) forward is 64 of them).
inline constexpr index_t direct_max_work = 8 * 8 * 64;
// Products below this many multiply-adds run on the calling thread: a parallel region costs a few microseconds.
inline constexpr index_t parallel_min_work = 64 * 64 * 64;
// A product of one row tile (m <= mr_in_place: a weight gradient with 10 outputs) can only split its columns, and then
// every thread reads all of A, usually a layer's output gradient just written by one thread. Below this many
// multiply-adds, moving A to the other core's cache costs more than the split saves, and the product after it, which
// writes that gradient again, then finds A's lines in the other core's cache.
inline constexpr index_t parallel_min_work_single_row_tile = 4 * parallel_min_work;

inline index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }
inline index_t round_up(index_t a, index_t b) { return ceil_div(a, b) * b; }

// The depth of every k block but the last (balanced, see cache_block): the blocked GEMM and pack_gemm_b cut k alike.
template <class T>
index_t k_block_depth(index_t k) {
  return ceil_div(k, ceil_div(k, cache_block<T>::kc));
}
// Where the k block starting at pc, column panel `panel` (columns panel * nr ...), of a B packed whole (n columns,
// kc deep in this block) starts: every k block holds the panels of all of n, each kc x nr.
template <class T>
index_t packed_b_panel_offset(index_t pc, index_t kc, index_t n, index_t panel) {
  constexpr index_t nr = register_block<T>::nr;
  return pc * round_up(n, nr) + panel * kc * nr;
}

// The arguments of one GEMM call, passed to the per-thread drivers.
template <class T>
struct gemm_problem {
  bool transpose_a, transpose_b;
  index_t m, n, k;
  T alpha;
  const T* a;
  index_t lda;
  const T* b;
  index_t ldb;
  T beta;
  T* c;
  index_t ldc;
  const epilogue<T>* ep;
  const T* b_packed = nullptr;  // op(B) as pack_gemm_b laid it out, or null: pack per block

  // &op(A)(i, p) and &op(B)(p, j).
  const T* a_at(index_t i, index_t p) const { return transpose_a ? a + p * lda + i : a + i * lda + p; }
  const T* b_at(index_t p, index_t j) const { return transpose_b ? b + j * ldb + p : b + p * ldb + j; }
};

inline gemm_scratch& thread_scratch() {
  static thread_local gemm_scratch scratch;
  return scratch;
}

// v = act(alpha * sum + beta * c + bias) for one element: the same operations, in the same order, as store_tile.
template <class T>
KILN_ALWAYS_INLINE T finish_element(T sum, const T* c, index_t j, T alpha, T beta, const epilogue<T>& ep) {
  T v = alpha * sum;
  opaque(v);
  if (beta != T(0)) v = scalar_fmadd(beta, *c, v);
  if (ep.bias) v += ep.bias[j];
  return activate(ep.act, v, ep.slope);
}

// ---- direct path for tiny products (and k == 0): no packing, no scratch ------------------------------------------
// Both variants keep every element's sum in a register as one FMA chain over p = 0..k-1, like the micro-kernel.

// op(B) row-major: Vecs vectors of row i of C, updated one p at a time with unit-stride rows of B.
template <class T, bool TransposeA, int Vecs>
KILN_ALWAYS_INLINE void direct_row_strip(const gemm_problem<T>& g, index_t i, index_t j0, int cols,
                                         tile_epilogue<T>& tile) {
  using S = simd<T>;
  constexpr int W = S::width;
  const int last_lanes = cols - (Vecs - 1) * W;
  typename S::reg acc[1][Vecs];
  for (int v = 0; v < Vecs; ++v) acc[0][v] = S::zero();
  const T* brow = g.b + j0;
  const index_t k = g.k, ldb = g.ldb, a_step = TransposeA ? g.lda : 1;
  const T* a = TransposeA ? g.a + i : g.a + i * g.lda;
  for (index_t p = 0; p < k; ++p, brow += ldb, a += a_step) {
    const auto av = S::set1(*a);
    for (int v = 0; v < Vecs - 1; ++v) acc[0][v] = S::fmadd(av, S::load(brow + v * W), acc[0][v]);
    const T* last = brow + (Vecs - 1) * W;
    acc[0][Vecs - 1] = S::fmadd(av, last_lanes == W ? S::load(last) : S::load_n(last, last_lanes), acc[0][Vecs - 1]);
  }
  tile.bias = g.ep->bias ? g.ep->bias + j0 : nullptr;
  store_tile<T, 1, Vecs>(acc, g.c + i * g.ldc + j0, g.ldc, cols, tile);
}

template <class T, bool TransposeA>
void gemm_direct_rows(const gemm_problem<T>& g) {
  constexpr int W = simd<T>::width;
  constexpr int strip = 4 * W;  // 4 accumulator chains: enough to hide FMA latency on short rows
  tile_epilogue<T> tile{g.alpha, g.beta, nullptr, g.ep->act, g.ep->slope, true, true};
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j0 = 0; j0 < g.n; j0 += strip) {
      const int cols = int(std::min<index_t>(strip, g.n - j0));
      switch ((cols + W - 1) / W) {
        case 1: direct_row_strip<T, TransposeA, 1>(g, i, j0, cols, tile); break;
        case 2: direct_row_strip<T, TransposeA, 2>(g, i, j0, cols, tile); break;
        case 3: direct_row_strip<T, TransposeA, 3>(g, i, j0, cols, tile); break;
        default: direct_row_strip<T, TransposeA, 4>(g, i, j0, cols, tile); break;
      }
    }
  }
}

// With op(B) transposed (B stored n x k, as a Dense layer's weight) B is first transposed into a stack buffer (at
// most direct_max_work elements) and the row path runs on it: one transpose costs less than a strided dot product
// per element.
template <class T>
void gemm_direct(const gemm_problem<T>& g) {
  if (g.transpose_b && g.k > 0) {
    alignas(64) T b_rows[direct_max_work];
    transpose_into(g.b, g.ldb, g.n, g.k, b_rows);
    gemm_problem<T> rows = g;
    rows.transpose_b = false;
    rows.b = b_rows;
    rows.ldb = g.n;
    g.transpose_a ? gemm_direct_rows<T, true>(rows) : gemm_direct_rows<T, false>(rows);
    return;
  }
  g.transpose_a ? gemm_direct_rows<T, true>(g) : gemm_direct_rows<T, false>(g);
}

// Products of one short k block with A packed (a weight gradient over a small batch, dL/dY^T X: A is the
// transposed output gradient, B the layer's input) turn the blocked loops round: A's row tiles are packed first, in
// groups that fit in L1 beside one B panel (short_k_group_bytes), and each B panel, read where it lies, is swept by
// the whole group while it sits in L1. B is then read from memory once per group and never packed, where the blocked
// loops pack all of it (on each thread that shares the rows) and stream the packed block from L2 once per tile.
// The same micro-kernel and FMA chains, so the same bits (the gain: docs/benchmarks.md).
inline constexpr index_t short_k_group_bytes = 20 * 1024;
template <class T>
bool short_k_path(const gemm_problem<T>& g, index_t rows, bool a_in_place) {
  constexpr index_t mr = register_block<T>::mr;
  const index_t tile_bytes = mr * g.k * index_t(sizeof(T));
  // Worth it where a group holds at least 4 tiles and there are more than 2 of them (with 2 or fewer, B is read in
  // place by the blocked loops already), and where B's rows lie less than a page apart and spread over L1's sets.
  // Rows a multiple of 256 bytes apart fall in a quarter of the sets or fewer and evict each other; rows a page or more
  // apart put each step of k on its own page.
  const index_t row_bytes = g.ldb * index_t(sizeof(T));
  const bool rows_fit = row_bytes % 64 == 0 && row_bytes % 256 != 0 && row_bytes < 4096 &&
                        reinterpret_cast<std::uintptr_t>(g.b) % 64 == 0;
  // gemm_short_k finishes every tile in one pass over k: one k block (which the group budget implies on every
  // target, k <= 320 floats or 160 doubles against blocks of 512 and 256, but which that pass relies on).
  return !g.transpose_b && !g.b_packed && !a_in_place && rows_fit && g.k <= k_block_depth<T>(g.k) &&
         4 * tile_bytes <= short_k_group_bytes && ceil_div(rows, mr) > 2;
}

template <class T>
void gemm_short_k(const gemm_problem<T>& g, index_t i0, index_t i1, index_t j0, index_t j1) {
  constexpr int mr = register_block<T>::mr;
  constexpr int nr = register_block<T>::nr;
  constexpr int width = register_block<T>::width;
  const index_t k = g.k;
  const index_t tiles = ceil_div(i1 - i0, index_t(mr));
  // Groups as equal as the budget allows (16 tiles in two of 8, not 10 + 6).
  const index_t groups = ceil_div(tiles, short_k_group_bytes / (mr * k * index_t(sizeof(T))));
  const index_t group = ceil_div(tiles, groups);
  // Scratch: the group's packed A tiles, then one packed B panel for a partial last panel that the micro-kernel
  // cannot read in place (no cheap masked load).
  const std::size_t a_bytes = static_cast<std::size_t>(round_up(group * mr * k * index_t(sizeof(T)), 64));
  const std::size_t b_bytes = static_cast<std::size_t>(k * nr) * sizeof(T);
  char* scratch = static_cast<char*>(thread_scratch().reserve(a_bytes + b_bytes));
  T* const a_packed = reinterpret_cast<T*>(scratch);
  T* const b_partial = reinterpret_cast<T*>(scratch + a_bytes);
  const epilogue<T>& ep = *g.ep;
  tile_epilogue<T> tile{g.alpha, g.beta, nullptr, ep.act, ep.slope, true, true};
  for (index_t t0 = 0; t0 < tiles; t0 += group) {
    const index_t t1 = std::min(tiles, t0 + group);
    for (index_t t = t0; t < t1; ++t) {
      const index_t ic = i0 + t * mr;
      pack_a<T, mr>(g.transpose_a, g.a_at(ic, 0), g.lda, int(std::min<index_t>(mr, i1 - ic)), k,
                    a_packed + (t - t0) * mr * k);
    }
    for (index_t j = j0; j < j1; j += nr) {
      const int cols = int(std::min<index_t>(nr, j1 - j));
      const bool in_place = cols == nr || simd<T>::cheap_masked_load;
      if (!in_place) pack_b<T, nr>(false, g.b_at(0, j), g.ldb, cols, k, b_partial);
      const T* const b_panel = in_place ? g.b_at(0, j) : b_partial;
      const panel_strides strides{1, mr, in_place ? g.ldb : index_t(nr)};
      tile.bias = ep.bias ? ep.bias + j : nullptr;
      for (index_t t = t0; t < t1; ++t) {
        const index_t ic = i0 + t * mr;
        const int rows = int(std::min<index_t>(mr, i1 - ic));
        select_micro_kernel<T>(rows, int(ceil_div(cols, width)), in_place)(
            k, a_packed + (t - t0) * mr * k, b_panel, strides, g.c + ic * g.ldc + j, g.ldc, cols, tile);
      }
    }
  }
}

// The blocked path for the sub-block rows [i0, i1) x columns [j0, j1) of C, on the calling thread. Every element's
// arithmetic depends only on k (through kc), never on the sub-block bounds, so any partition gives the same bits.
// first_tile_share (of 1) is where in its row tiles the thread starts, wrapping round: threads that split the columns
// each sweep all the rows of A, and starting at different rows they fetch different lines of it from memory instead
// of waiting on the same ones (a training step's new input batch, which is not in any cache yet).
template <class T>
void gemm_blocked(const gemm_problem<T>& g, index_t i0, index_t i1, index_t j0, index_t j1,
                  double first_tile_share = 0) {
  constexpr int mr = register_block<T>::mr;
  constexpr int nr = register_block<T>::nr;
  constexpr int width = register_block<T>::width;
  if (i0 >= i1 || j0 >= j1) return;

  const index_t kc_max = k_block_depth<T>(g.k);
  const index_t n_blocks = ceil_div(j1 - j0, cache_block<T>::nc);
  const index_t nc_max = round_up(ceil_div(j1 - j0, n_blocks), nr);

  // Packing copies a panel so that the micro-kernel streams it from contiguous memory; it pays off only for a panel
  // used several times. An A micro-panel is used once per B panel of the block, and a B panel once per A micro-panel:
  // skinny products (a Dense layer with 10 outputs over a batch of 1000, or its weight gradient) use one of the two
  // only once or twice, and then it is read in place. Full-width B panels only, so that no load runs past a row. A
  // transposed A whose rows are short (a Dense layer's output gradient read for its weight gradient) already lies
  // almost as a packed panel does, in a few consecutive cache lines per step of k: it is never packed.
  // An untransposed A is read in place too: the micro-kernel broadcasts one element per row and step of k, so its mr
  // rows are mr streams through the same L1 lines a packed panel would fill, and packing bought nothing measurable
  // on one thread. On two threads splitting the columns, it made each thread pack all of A. The exception is rows 4 KiB
  // apart, whose mr streams would fall in one L1 set.
  const bool a_rows_alias = !g.transpose_a && (g.lda * index_t(sizeof(T))) % 4096 == 0;
  const bool a_in_place = ceil_div(std::min(nc_max, j1 - j0), nr) == 1 || (g.transpose_a && g.lda <= 2 * mr) ||
                          (!g.transpose_a && !a_rows_alias);
  if (short_k_path(g, i1 - i0, a_in_place)) {
    gemm_short_k(g, i0, i1, j0, j1);
    return;
  }

  // Scratch: the packed B block (none when B comes prepacked), then one packed A micro-panel, each on a cache-line
  // boundary.
  const std::size_t b_bytes =
      g.b_packed ? 0 : static_cast<std::size_t>(round_up(kc_max * nc_max * index_t(sizeof(T)), 64));
  const std::size_t a_bytes = static_cast<std::size_t>(kc_max * mr) * sizeof(T);
  char* scratch = static_cast<char*>(thread_scratch().reserve(b_bytes + a_bytes));
  T* b_packed = reinterpret_cast<T*>(scratch);
  T* a_packed = reinterpret_cast<T*>(scratch + b_bytes);
  const bool b_in_place = !g.transpose_b && ceil_div(i1 - i0, index_t(mr)) <= 2;
  // A partial B panel is read in place only where the micro-kernel can mask its last vector cheaply.
  const auto b_panel_in_place = [&](int cols) { return b_in_place && (cols == nr || simd<T>::cheap_masked_load); };
  const epilogue<T>& ep = *g.ep;
  // The row tiles: mr rows each, but in place the last rows make one tile when they fit in a tall one (see
  // register_block), and otherwise the last tile takes what is left.
  const index_t rows_total = i1 - i0, tall = register_block<T>::mr_in_place;
  const index_t tiles = !a_in_place          ? ceil_div(rows_total, index_t(mr))
                        : rows_total <= tall ? 1
                                             : 1 + ceil_div(rows_total - tall, index_t(mr));
  const index_t first_tile = std::min(tiles - 1, index_t(first_tile_share * double(tiles)));
  for (index_t jc = j0; jc < j1; jc += nc_max) {
    const index_t nc = std::min(nc_max, j1 - jc);
    const index_t n_panels = ceil_div(nc, nr);
    for (index_t pc = 0; pc < g.k; pc += kc_max) {
      const index_t kc = std::min(kc_max, g.k - pc);
      // A prepacked B holds every k block's panels for all of n (see pack_gemm_b): this block's start in it.
      const T* b_block = g.b_packed ? g.b_packed + packed_b_panel_offset<T>(pc, kc, g.n, jc / nr) : b_packed;
      if (!g.b_packed)
        for (index_t q = 0; q < n_panels; ++q) {
          const int cols = int(std::min<index_t>(nr, nc - q * nr));
          if (!b_panel_in_place(cols))
            pack_b<T, nr>(g.transpose_b, g.b_at(pc, jc + q * nr), g.ldb, cols, kc, b_packed + q * kc * nr);
        }
      tile_epilogue<T> tile{g.alpha, g.beta, nullptr, ep.act, ep.slope, pc == 0, pc + kc == g.k};
      for (index_t t = 0; t < tiles; ++t) {
        // Every tile is mr rows but the last, which takes the rest (see tiles above).
        const index_t tile_index = (t + first_tile) % tiles;
        const index_t ic = i0 + tile_index * mr;
        const int rows = int(tile_index == tiles - 1 ? i1 - ic : index_t(mr));
        const T* a_panel = a_packed;
        index_t a_row = 1, a_step = mr;
        if (a_in_place) {
          a_panel = g.a_at(ic, pc);
          a_row = g.transpose_a ? 1 : g.lda;
          a_step = g.transpose_a ? g.lda : 1;
        } else {
          pack_a<T, mr>(g.transpose_a, g.a_at(ic, pc), g.lda, rows, kc, a_packed);
        }
        for (index_t q = 0; q < n_panels; ++q) {
          const index_t j = jc + q * nr;
          const int cols = int(std::min<index_t>(nr, nc - q * nr));
          const bool b_direct = b_panel_in_place(cols) && !g.b_packed;
          const T* b_panel = b_direct ? g.b_at(pc, j) : b_block + q * kc * nr;
          const panel_strides strides{a_row, a_step, b_direct ? g.ldb : index_t(nr)};
          tile.bias = ep.bias ? ep.bias + j : nullptr;
          select_micro_kernel<T>(rows, int(ceil_div(cols, width)), a_in_place || b_direct)(
              kc, a_panel, b_panel, strides, g.c + ic * g.ldc + j, g.ldc, cols, tile);
        }
      }
    }
  }
}

// Splits C into a threads_m x threads_n grid of sub-blocks, choosing the split that packs least: every thread packs
// the A rows and B columns of its own sub-block, so a row split repeats B's packing and a column split repeats A's.
struct thread_grid {
  int threads_m = 1, threads_n = 1;
};

template <class T>
thread_grid choose_thread_grid(index_t m, index_t n, int threads) {
  const index_t m_panels = ceil_div(m, register_block<T>::mr);
  const index_t n_panels = ceil_div(n, register_block<T>::nr);
  thread_grid best;
  index_t best_cost = -1;
  for (int tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    const int tn = threads / tm;
    const index_t rows = ceil_div(m_panels, tm) * register_block<T>::mr;  // the most loaded thread's share
    const index_t cols = ceil_div(n_panels, tn) * register_block<T>::nr;
    // Multiply-adds per k, plus packing at ~4x their cost. (At 8x, a 128 x 784 x 64 weight gradient on two threads
    // split its columns rather than its rows, the slower of the two.)
    const index_t cost = rows * cols + 4 * (rows + cols);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = {tm, tn};
    }
  }
  return best;
}

template <class T>
void gemm_threaded(const gemm_problem<T>& g) {
  int threads = 1;
#if defined(_OPENMP)
  const index_t work = g.m * g.n * g.k;
  if (work >= parallel_min_work &&
      (g.m > register_block<T>::mr_in_place || work >= parallel_min_work_single_row_tile)) {
    const index_t tiles = ceil_div(g.m, register_block<T>::mr) * ceil_div(g.n, register_block<T>::nr);
    threads = int(std::min<index_t>(num_threads(), tiles));
  }
#endif
  if (threads <= 1) {
    gemm_blocked(g, 0, g.m, 0, g.n);
    return;
  }
#if defined(_OPENMP)
  const index_t m_panels = ceil_div(g.m, register_block<T>::mr);
  const index_t n_panels = ceil_div(g.n, register_block<T>::nr);
  const thread_grid planned = choose_thread_grid<T>(g.m, g.n, threads);
  if (planned.threads_m == 1 || planned.threads_n == 1) {
    // A split along one dimension (always, on two threads): more chunks of whole panels than threads, each thread
    // taking its own share's and then helping with the others' (parallel_dynamic_chunks). Each chunk starts its sweep over the row tiles its own share of
    // the way down, so that threads splitting the columns do not read the same rows of A at once.
    const bool by_columns = planned.threads_m == 1;
    const index_t panels = by_columns ? n_panels : m_panels;
    const index_t chunks = std::min<index_t>(index_t(threads) * chunks_per_thread, panels);
    parallel_dynamic_chunks(threads, chunks, [&](index_t chunk) {
      const index_t p0 = chunk_begin(panels, chunks, chunk), p1 = chunk_begin(panels, chunks, chunk + 1);
      if (by_columns)
        gemm_blocked(g, 0, g.m, std::min(g.n, p0 * register_block<T>::nr), std::min(g.n, p1 * register_block<T>::nr),
                     double(chunk) / double(chunks));
      else
        gemm_blocked(g, std::min(g.m, p0 * register_block<T>::mr), std::min(g.m, p1 * register_block<T>::mr), 0, g.n);
    });
    return;
  }
  // A grid splits equally, one sub-block per thread.
#pragma omp parallel num_threads(threads)
  {
    // The team may be smaller than asked for (nested parallelism, dynamic adjustment): split by the actual size.
    const int team = omp_get_num_threads();
    const int id = omp_get_thread_num();
    const thread_grid grid = team == threads ? planned : choose_thread_grid<T>(g.m, g.n, team);
    const int tm = id / grid.threads_n, tn = id % grid.threads_n;
    const index_t i0 = std::min(g.m, chunk_begin(m_panels, grid.threads_m, tm) * register_block<T>::mr);
    const index_t i1 = std::min(g.m, chunk_begin(m_panels, grid.threads_m, tm + 1) * register_block<T>::mr);
    const index_t j0 = std::min(g.n, chunk_begin(n_panels, grid.threads_n, tn) * register_block<T>::nr);
    const index_t j1 = std::min(g.n, chunk_begin(n_panels, grid.threads_n, tn + 1) * register_block<T>::nr);
    gemm_blocked(g, i0, i1, j0, j1, grid.threads_m == 1 ? double(tn) / double(grid.threads_n) : 0.0);
  }
#endif
}

// A product with one output column (a regression head: Dense<1>) stored contiguously, C = op(A) op(B) with n = 1,
// run as its transpose C^T = op(B)^T op(A)^T, a single row of m: the row-major kernels put 16 outputs in one vector
// there instead of one output per vector. Every element is the same FMA chain over k (op(A)(i, p) op(B)(p, 0) and
// op(B)^T(0, p) op(A)^T(p, i) are the same product), so the bits do not change. The bias, a single value, is added by a
// pass after the product, which rounds as the fused epilogue does.
template <class T>
void gemm_single_column(const gemm_problem<T>& g) {
  const epilogue<T> none{};
  // op(B)^T, 1 x k: row-major with any stride when B is stored 1 x k; B stored k x 1 read as a transposed k x 1.
  // op(A)^T, k x m: A stored m x k is its transpose; A stored k x m is it, row-major.
  const gemm_problem<T> t{!g.transpose_b, !g.transpose_a, 1,      g.m,    g.k,  g.alpha, g.b,
                          g.ldb,          g.a,           g.lda,  g.beta, g.c,  g.m,     &none};
  gemm_threaded(t);
  if (g.ep->bias || g.ep->act != activation::identity)
    for (index_t i = 0; i < g.m; ++i) {
      T v = g.c[i];
      if (g.ep->bias) v += g.ep->bias[0];
      g.c[i] = activate(g.ep->act, v, g.ep->slope);
    }
}

// A product with k = 1, an outer product: the input gradient of a Dense<1> head (1000 x 10 x 1). The blocked path
// spends a whole tile's setup on one step of k; here each row of C is op(A)(i, 0) times the row op(B), stored through
// the same epilogue eight rows at a time. The product is an FMA onto +0, as the micro-kernel's first step is, so the
// bits (signed zeros included) are the blocked path's.
template <class T, int Rows, int Vecs>
KILN_ALWAYS_INLINE void outer_rows(const T* a, index_t a_stride, const typename simd<T>::reg (&b)[Vecs], T* c,
                                   index_t ldc, int cols, const tile_epilogue<T>& tile) {
  using S = simd<T>;
  typename S::reg acc[Rows][Vecs];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    const auto av = S::set1(a[r * a_stride]);
#pragma GCC unroll 2
    for (int v = 0; v < Vecs; ++v) acc[r][v] = S::fmadd(av, b[v], S::zero());
  }
  store_tile<T, Rows, Vecs>(acc, c, ldc, cols, tile);
}

template <class T, int Vecs>
void outer_strip(const gemm_problem<T>& g, const T* b_row, index_t j0, int cols, const tile_epilogue<T>& tile) {
  using S = simd<T>;
  constexpr int W = S::width, rows = 8;
  typename S::reg b[Vecs];
  for (int v = 0; v < Vecs; ++v) {
    const int lanes = std::min(W, cols - v * W);
    b[v] = lanes == W ? S::load(b_row + j0 + v * W) : S::load_n(b_row + j0 + v * W, lanes);
  }
  const index_t a_stride = g.transpose_a ? 1 : g.lda;
  index_t i = 0;
  for (; i + rows <= g.m; i += rows)
    outer_rows<T, rows, Vecs>(g.a + i * a_stride, a_stride, b, g.c + i * g.ldc + j0, g.ldc, cols, tile);
  for (; i < g.m; ++i) outer_rows<T, 1, Vecs>(g.a + i * a_stride, a_stride, b, g.c + i * g.ldc + j0, g.ldc, cols, tile);
}

template <class T>
void gemm_outer(const gemm_problem<T>& g) {
  constexpr int W = simd<T>::width, strip = register_block<T>::nr;
  // op(B) is 1 x n: B's row, or B's column when it is stored n x 1. A strided column is gathered once.
  const T* b_row = g.b;
  if (g.transpose_b && g.n > 1) {
    T* gathered = static_cast<T*>(thread_scratch().reserve(static_cast<std::size_t>(g.n) * sizeof(T)));
    for (index_t j = 0; j < g.n; ++j) gathered[j] = g.b[j * g.ldb];
    b_row = gathered;
  }
  tile_epilogue<T> tile{g.alpha, g.beta, nullptr, g.ep->act, g.ep->slope, true, true};
  for (index_t j0 = 0; j0 < g.n; j0 += strip) {
    const int cols = int(std::min<index_t>(strip, g.n - j0));
    tile.bias = g.ep->bias ? g.ep->bias + j0 : nullptr;
    if (cols > W)
      outer_strip<T, 2>(g, b_row, j0, cols, tile);
    else
      outer_strip<T, 1>(g, b_row, j0, cols, tile);
  }
}

// A narrow product (see gemm_narrow.hpp): B packed once by the calling thread, then the rows of C split over the
// threads in whole tiles, at least two per thread.
template <class T>
void gemm_narrow(const gemm_problem<T>& g) {
  if constexpr (!simd<T>::lane_permutes) {
    gemm_threaded(g);  // never chosen (narrow_product is false): kept compilable without the lane permutes
  } else {
    const int groups = int((g.n + 1) / 2);
    const std::size_t bytes = static_cast<std::size_t>(narrow_packed_size<T>(g.n, g.k)) * sizeof(T);
    T* packed = static_cast<T*>(thread_scratch().reserve(bytes));
    pack_narrow_b(g.b, g.ldb, g.n, g.k, packed);
    const tile_epilogue<T> tile{g.alpha, g.beta, g.ep->bias, g.ep->act, g.ep->slope, true, true};
    const index_t tile_rows = narrow_tile_rows(groups), tiles = ceil_div(g.m, tile_rows);
    const index_t min_tiles = g.m * g.n * g.k >= parallel_min_work ? 2 : tiles + 1;  // too small: one thread
    parallel_row_slices(tiles, min_tiles, [&](index_t t0, index_t t1) {
      narrow_rows_for<T>(groups, g.k, g.a, g.lda, packed, g.c, g.ldc, int(g.n), t0 * tile_rows,
                         std::min(g.m, t1 * tile_rows), tile);
    });
  }
}

// Whether a single-precision product runs on AMX tiles (gemm_amx.hpp): where the tiles are mostly full and the
// product repays packing both operands into three pieces (a small one, such as 37 x 45 x 71, is faster on AVX-512).
// Above 16 rows the choice does not depend on m, so that splitting a batch into slices of at least 16 rows
// (policy::cpu's for_batch_slices while AMX is active) never changes a row's path, and its bits.
inline bool amx_n_k_worthwhile(index_t n, index_t k) { return n >= 16 && k >= 64 && n * k >= 128 * 128; }
inline bool amx_worthwhile(index_t m, index_t n, index_t k) { return m >= 16 && amx_n_k_worthwhile(n, k); }

}  // namespace gemm_detail

namespace gemm_detail {
// The kernel gemm runs a product on, chosen by its shape and layout alone (and whether the bfloat16 path is on for
// its precision: AMX tiles, or AVX512-BF16 dot products for bfloat16 operands).
enum class gemm_route { direct, single_column, outer, narrow, amx, blocked };

template <class T>
gemm_route route_of(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, index_t ldc,
                    [[maybe_unused]] product_precision precision = product_precision::single) {
  if (k <= 0 || m * n * k <= direct_max_work) return gemm_route::direct;
  if (n == 1 && ldc == 1 && m > 1) return gemm_route::single_column;
  if (k == 1) return gemm_route::outer;
  if (narrow_product<T>(transpose_a, transpose_b, n, k)) return gemm_route::narrow;
#if KILN_HAS_BF16_BLOCKS
  if constexpr (std::is_same_v<T, float>) {
    if (amx_worthwhile(m, n, k) && bfloat16_path_active(precision)) return gemm_route::amx;
  }
#endif
  return gemm_route::blocked;
}
}  // namespace gemm_detail

namespace gemm_detail {
// Where the AMX path can take a product with this B (see amx_worthwhile), pack_gemm_b also packs op(B) in the AMX
// path's layout, after the AVX-512 one: the number of elements of T that layout takes there (0 where it cannot).
template <class T>
index_t packed_amx_b_elements(index_t k, index_t n) {
#if KILN_HAS_BF16_BLOCKS
  if constexpr (std::is_same_v<T, float>) {
    if (amx_n_k_worthwhile(n, k)) return round_up(amx_detail::packed_amx_b_size(k, n), 32) / 2;
  }
#endif
  (void)k;
  (void)n;
  return 0;
}
}  // namespace gemm_detail

// The number of elements op(B) (k x n) takes once packed by pack_gemm_b.
template <class T>
index_t packed_gemm_b_size(index_t k, index_t n) {
  return k * gemm_detail::round_up(n, gemm_detail::register_block<T>::nr) + gemm_detail::packed_amx_b_elements<T>(k, n);
}

// Packs op(B) (k x n) into `packed` (packed_gemm_b_size elements), laid out as the blocked GEMM reads it: for each
// k block, the nr-wide column panels of all of n. A matrix multiplied by many left-hand sides in turn (a recurrent
// layer's W_hh, once per time step) is then packed once instead of once per product. Where the bfloat16 path is
// active for this precision (gemm_amx.hpp: AMX tiles, or AVX512-BF16 dot products for bfloat16 operands), op(B) is
// packed a second time after that, in that path's layout, so that gemm_prepacked_b can take whichever path gemm would
// take for the same product. (Pack after set_amx_gemm and set_bf16_dot_gemm, not before.) With precision bfloat16,
// that layout holds B rounded, for gemm_prepacked_b with the same precision.
template <class T>
void pack_gemm_b(bool transpose_b, index_t k, index_t n, const T* b, index_t ldb, T* packed,
                 [[maybe_unused]] product_precision precision = product_precision::single) {
  using namespace gemm_detail;
  constexpr int nr = register_block<T>::nr;
  const index_t kc_max = k_block_depth<T>(k);
  const gemm_problem<T> g{false, transpose_b, 0, n, k, T(1), nullptr, 0, b, ldb, T(0), nullptr, 0, nullptr};
  for (index_t pc = 0; pc < k; pc += kc_max) {
    const index_t kc = std::min(kc_max, k - pc);
    for (index_t q = 0; q * nr < n; ++q)
      pack_b<T, nr>(transpose_b, g.b_at(pc, q * nr), ldb, int(std::min<index_t>(nr, n - q * nr)), kc,
                    packed + packed_b_panel_offset<T>(pc, kc, n, q));
  }
#if KILN_HAS_BF16_BLOCKS
  if constexpr (std::is_same_v<T, float>) {
    if (packed_amx_b_elements<T>(k, n) > 0 && bfloat16_path_active(precision))
      amx_detail::pack_amx_b(transpose_b, k, n, b, ldb,
                             reinterpret_cast<amx_detail::bf16_bits*>(packed + k * round_up(n, index_t(nr))),
                             precision);
  }
#endif
}

// A per-thread buffer for pack_gemm_b that grows to the largest matrix seen and is then reused (no heap traffic in a
// steady state). Other threads may read it while its owner waits (a parallel region the owner opened).
template <class T>
T* packed_gemm_b_scratch(index_t k, index_t n) {
  static thread_local gemm_detail::gemm_scratch scratch;
  return static_cast<T*>(scratch.reserve(static_cast<std::size_t>(packed_gemm_b_size<T>(k, n)) * sizeof(T)));
}

// op(A) is m x k, op(B) is k x n, C is m x n; all row-major with leading dimensions lda, ldb, ldc.
// beta == 0 overwrites C without reading it (C may hold NaN). Deterministic: every element's sum over k runs in
// the same order whatever the thread count; that order depends on the shape and layout alone (one FMA chain per
// element, or, for narrow products, one per phase: see gemm_narrow.hpp). With precision bfloat16 (float only), a
// product that runs on the bfloat16 path (AMX tiles, or AVX512-BF16 dot products on CPUs without tiles) rounds both
// operands to bfloat16 first (product_precision.hpp).
template <class T>
void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
          const T* b, index_t ldb, T beta, T* c, index_t ldc, const epilogue<T>& ep = {},
          [[maybe_unused]] product_precision precision = product_precision::single) {
  using gemm_detail::gemm_route;
  if (m <= 0 || n <= 0) return;
  const gemm_route route = gemm_detail::route_of<T>(transpose_a, transpose_b, m, n, k, ldc, precision);
  const gemm_detail::gemm_problem<T> g{transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &ep};
  switch (route) {
    case gemm_route::direct: gemm_detail::gemm_direct(g); return;
    case gemm_route::single_column: gemm_detail::gemm_single_column(g); return;
    case gemm_route::outer: gemm_detail::gemm_outer(g); return;
    case gemm_route::narrow: gemm_detail::gemm_narrow(g); return;
    case gemm_route::amx:
#if KILN_HAS_BF16_BLOCKS
      if constexpr (std::is_same_v<T, float>) {
        const int threads = m * n * k >= gemm_detail::parallel_min_work ? num_threads() : 1;
        amx_detail::amx_gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep.bias, ep.act,
                             ep.slope, threads, nullptr, precision);
        return;
      }
#endif
      [[fallthrough]];
    case gemm_route::blocked: gemm_detail::gemm_threaded(g); return;
  }
}

// gemm with op(B) prepacked by pack_gemm_b (b_packed; b and ldb are then unused). The same bits as gemm on the
// unpacked B for every product that gemm runs blocked or on AMX: all but the tiny ones below direct_max_work
// multiply-adds and the narrow ones (gemm_narrow.hpp), which this runs blocked too. B must have been packed with the
// same precision (which, as in gemm, rounds the operands of the products that run on AMX tiles).
template <class T>
void gemm_prepacked_b(bool transpose_a, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                      const T* b_packed, T beta, T* c, index_t ldc, const epilogue<T>& ep = {},
                      [[maybe_unused]] product_precision precision = product_precision::single) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = act(beta C + bias): B is not read, so any valid pointer stands in for it
    gemm(transpose_a, false, m, n, k, alpha, a, lda, c, ldc, beta, c, ldc, ep);
    return;
  }
#if KILN_HAS_BF16_BLOCKS
  if constexpr (std::is_same_v<T, float>) {
    if (gemm_detail::amx_worthwhile(m, n, k) && bfloat16_path_active(precision)) {
      const int threads = m * n * k >= gemm_detail::parallel_min_work ? num_threads() : 1;
      const auto* amx_packed = reinterpret_cast<const amx_detail::bf16_bits*>(
          b_packed + k * gemm_detail::round_up(n, index_t(gemm_detail::register_block<T>::nr)));
      amx_detail::amx_gemm(transpose_a, false, m, n, k, alpha, a, lda, nullptr, 0, beta, c, ldc, ep.bias, ep.act,
                           ep.slope, threads, amx_packed, precision);
      return;
    }
  }
#endif
  gemm_detail::gemm_problem<T> g{transpose_a, false, m, n, k, alpha, a, lda, nullptr, 0, beta, c, ldc, &ep};
  g.b_packed = b_packed;
  gemm_detail::gemm_threaded(g);
}

// Whether gemm_part can compute parts of this product: gemm runs it blocked or on AMX tiles, whose elements come out
// the same whatever part of C a call computes. The other paths take small or narrow products, which are computed
// whole.
template <class T>
bool gemm_splits(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k,
                 product_precision precision = product_precision::single) {
  using gemm_detail::gemm_route;
  const gemm_route route = gemm_detail::route_of<T>(transpose_a, transpose_b, m, n, k, n, precision);
  return m > 0 && n > 0 && (route == gemm_route::amx || route == gemm_route::blocked);
}

// Rows [i0, i1) x columns [j0, j1) of the C that gemm computes with these arguments and beta 0, on the calling
// thread, with the bits gemm gives those elements: for a caller that shares one product out over threads of its own
// (a fused training step's parallel region, fused_mlp.hpp). The product must be one that gemm_splits accepts, and i0
// and j0 multiples of 16 (the AMX tiles); C must have ldc >= n, as gemm_splits assumed. On the blocked path the
// sweep over the row tiles starts first_tile_share (of 1) of the way down, wrapping round (gemm_blocked): the order
// of the tiles, never their bits.
template <class T>
void gemm_part(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
               const T* b, index_t ldb, T* c, index_t ldc, index_t i0, index_t i1, index_t j0, index_t j1,
               const epilogue<T>& ep = {},
               [[maybe_unused]] product_precision precision = product_precision::single,
               double first_tile_share = 0) {
  using gemm_detail::gemm_route;
  if (!gemm_splits<T>(transpose_a, transpose_b, m, n, k, precision) || ldc < n)
    fail("gemm_part: expected a product that gemm runs blocked or on AMX tiles, with ldc >= n, found ", m, " x ", n,
         " x ", k, " with ldc ", ldc);
  if (i0 % 16 != 0 || j0 % 16 != 0 || i0 < 0 || j0 < 0 || i1 > m || j1 > n)
    fail("gemm_part: expected a part of the ", m, " x ", n, " product starting on multiples of 16, found rows [", i0,
         ", ", i1, ") and columns [", j0, ", ", j1, ")");
  if (i0 >= i1 || j0 >= j1) return;
#if KILN_HAS_BF16_BLOCKS
  if constexpr (std::is_same_v<T, float>) {
    if (gemm_detail::route_of<T>(transpose_a, transpose_b, m, n, k, ldc, precision) == gemm_route::amx) {
      amx_detail::amx_gemm_part(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, ep.bias, ep.act,
                                ep.slope, precision, i0, i1, j0, j1);
      return;
    }
  }
#endif
  const gemm_detail::gemm_problem<T> g{transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, T(0), c, ldc, &ep};
  gemm_detail::gemm_blocked(g, i0, i1, j0, j1, first_tile_share);
}

}  // namespace kiln::kernels::cpu
