// Scaled dot-product attention on the CPU, forward and backward, without the score matrix: FlashAttention's tiling
// (Dao et al., 2022; the backward of FlashAttention-2) on kiln's threads.
//
// Layout and assumptions:
// - q [B, L, E], k [B, S, E], v [B, S, Ev], out [B, L, Ev], all contiguous and row-major in host memory; B is every
//   leading dimension (batch and heads) flattened, and q, k, v have the same B (the op broadcasts them first).
// - The mask, when there is one, is read in place through strides: element (b, i, j) of the [B, L, S] scores is at
//   mask[mask_offset[b] + i * mask_row_stride + j * mask_col_stride] (a stride of 0 along a broadcast dimension).
// - lse [B, L] is the one thing the forward keeps for the backward: each query's log-sum-exp of its masked scores.
//   The backward computes the scores again, tile by tile, and reads the output and its gradient.
// - At most one tile of query_tile x key_tile scores (and in the backward, the same of their gradients) exists at a
//   time per thread; nothing grows with L x S. The tiles' five products (q k^T, weights v; in the backward also
//   dO v^T, and the three gradients) are the blocked GEMM's (gemm.hpp), at the precision the policy's products take.
// - A query's scores are done in the order of its keys' tiles, so its result depends on the shapes only: the threads
//   take whole (b, query tile) jobs in the forward and whole b in the backward, and their number changes no bit.
// - Dropout draws weight (b, i, j)'s number from its position (kernels/attention_math.hpp) in both passes.
// The formulas (masking, the online softmax's exponentials, the dropout draw) are in kernels/attention_math.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/kernels/attention_math.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/product_precision.hpp"

namespace kiln::kernels::cpu {

// Queries and keys per tile: a 32 x 64 tile of float scores is 8 KiB, which stays in L1 beside the rows it multiplies.
inline constexpr index_t attention_query_tile = 32;
inline constexpr index_t attention_key_tile = 64;
// Multiply-adds below which one more thread costs more than it saves.
inline constexpr index_t attention_min_work_per_thread = index_t{1} << 18;

template <class T>
struct attention_problem {
  const T* q = nullptr;  // [B, L, E]
  const T* k = nullptr;  // [B, S, E]
  const T* v = nullptr;  // [B, S, Ev]
  index_t batch = 0, queries = 0, keys = 0, head_dim = 0, value_dim = 0;  // B, L, S, E, Ev
  T scale = T(1);
  bool causal = false;
  attention_mask_kind mask_kind = attention_mask_kind::none;
  const T* mask = nullptr;
  const index_t* mask_offset = nullptr;  // [B]
  index_t mask_row_stride = 0, mask_col_stride = 0;
  attention_dropout dropout;
  product_precision precision = product_precision::single;  // of the tiles' products (policy::cpu's gemm_precision)
};

// Where one input's gradient goes: nowhere (null), written, or added to what is there.
template <class T>
struct attention_grad {
  T* data = nullptr;
  bool accumulate = false;
};

namespace attention_detail {

// A thread's scratch, kept between calls so that a training step allocates nothing after the first.
template <class T>
std::vector<T>& scratch(index_t size) {
  static thread_local std::vector<T> buffer;
  if (buffer.size() < static_cast<std::size_t>(size)) buffer.resize(static_cast<std::size_t>(size));
  return buffer;
}

// The keys of the tile [j0, j0 + cols) that any of the queries [i0, i0 + rows) may see: all of them, or under
// is_causal those up to the last query.
inline index_t key_end(bool causal, index_t keys, index_t i0, index_t rows) {
  return causal ? std::min(keys, i0 + rows) : keys;
}

// The masked, scaled scores of queries [i0, i0 + rows) and keys [j0, j0 + cols) of batch b into s (rows x
// key_tile): s = scale (q k^T) by the blocked GEMM, then the mask and the causal cut.
template <class T>
void scores_tile(const attention_problem<T>& p, index_t b, index_t i0, index_t rows, index_t j0, index_t cols, T* s) {
  constexpr index_t bc = attention_key_tile;
  const index_t e_dim = p.head_dim;
  gemm(false, true, rows, cols, e_dim, p.scale, p.q + (b * p.queries + i0) * e_dim, e_dim,
       p.k + (b * p.keys + j0) * e_dim, e_dim, T(0), s, bc, {}, p.precision);
  for (index_t r = 0; r < rows; ++r) {
    const index_t i = i0 + r;
    T* row = s + r * bc;
    if (p.mask_kind != attention_mask_kind::none) {
      const T* mask = p.mask + p.mask_offset[b] + i * p.mask_row_stride + j0 * p.mask_col_stride;
      const index_t step = p.mask_col_stride;
      for (index_t c = 0; c < cols; ++c) row[c] = attention_masked_score(row[c], p.mask_kind, mask[c * step]);
    }
    // attention_causal_keeps: key j takes part for j <= i, so the columns from i + 1 - j0 on are cut.
    if (p.causal)
      for (index_t c = std::max<index_t>(0, i + 1 - j0); c < cols; ++c) row[c] = T(-INFINITY);
  }
}

// The forward of queries [i0, i0 + rows) of batch b: out rows and their log-sum-exp.
template <class T>
void forward_tile(const attention_problem<T>& p, index_t b, index_t i0, index_t rows, T* out, T* lse, T* work) {
  constexpr index_t br = attention_query_tile, bc = attention_key_tile;
  const index_t ev = p.value_dim;
  T* s = work;                        // [br][bc]
  T* acc = s + br * bc;               // [br][Ev]
  T* running_max = acc + br * ev;     // [br]
  T* running_sum = running_max + br;  // [br]
  for (index_t r = 0; r < rows; ++r) {
    running_max[r] = T(-INFINITY);
    running_sum[r] = T(0);
    for (index_t d = 0; d < ev; ++d) acc[r * ev + d] = T(0);
  }
  const T keep_scale = attention_keep_scale<T>(p.dropout);
  const index_t end = key_end(p.causal, p.keys, i0, rows);
  for (index_t j0 = 0; j0 < end; j0 += bc) {
    const index_t cols = std::min(bc, end - j0);
    scores_tile(p, b, i0, rows, j0, cols, s);
    for (index_t r = 0; r < rows; ++r) {
      T* row = s + r * bc;
      T tile_max = T(-INFINITY);
      for (index_t c = 0; c < cols; ++c) tile_max = std::max(tile_max, row[c]);
      const T new_max = std::max(running_max[r], tile_max);
      // The sum and the output so far were taken against the old maximum: rescale them to the new one.
      const T rescale = attention_exp(running_max[r], new_max);
      T* a = acc + r * ev;
      for (index_t d = 0; d < ev; ++d) a[d] *= rescale;
      attention_exp_row(row, cols, new_max);
      T sum = running_sum[r] * rescale;
      for (index_t c = 0; c < cols; ++c) sum += row[c];
      running_sum[r] = sum;
      running_max[r] = new_max;
      if (p.dropout.active) {
        const std::uint64_t first = static_cast<std::uint64_t>((b * p.queries + i0 + r) * p.keys + j0);
        for (index_t c = 0; c < cols; ++c)
          row[c] *= attention_dropout_factor(p.dropout, keep_scale, first + static_cast<std::uint64_t>(c));
      }
    }
    // acc += weights v
    gemm(false, false, rows, ev, cols, T(1), s, bc, p.v + (b * p.keys + j0) * ev, ev, T(1), acc, ev, {},
         p.precision);
  }
  for (index_t r = 0; r < rows; ++r) {
    const index_t i = i0 + r;
    const T sum = running_sum[r];
    T* o = out + (b * p.queries + i) * ev;
    const T* a = acc + r * ev;
    // A query that sees no key (every score masked) gets 0, as in PyTorch.
    if (sum > T(0)) {
      const T inverse = T(1) / sum;
      for (index_t d = 0; d < ev; ++d) o[d] = a[d] * inverse;
    } else {
      for (index_t d = 0; d < ev; ++d) o[d] = T(0);
    }
    lse[b * p.queries + i] = attention_logsumexp(running_max[r], sum);
  }
}

// The backward of batch b: its slices of dq, dk, dv, which it owns.
template <class T>
void backward_batch(const attention_problem<T>& p, index_t b, const T* out, const T* lse, const T* dout,
                    const attention_grad<T>& dq, const attention_grad<T>& dk, const attention_grad<T>& dv, T* work) {
  constexpr index_t br = attention_query_tile, bc = attention_key_tile;
  const index_t l_dim = p.queries, s_dim = p.keys, e_dim = p.head_dim, ev = p.value_dim;
  T* s = work;              // [br][bc]: scores, then the weights W after dropout
  T* dw = s + br * bc;      // [br][bc]: dO v^T, then the scores' gradient dS
  T* delta = dw + br * bc;  // [L]: rowsum(dO * O)
  // Gradients written fresh start from zero: every tile adds.
  auto clear = [](const attention_grad<T>& g, index_t offset, index_t count) {
    if (g.data && !g.accumulate) std::fill_n(g.data + offset, count, T(0));
  };
  clear(dq, b * l_dim * e_dim, l_dim * e_dim);
  clear(dk, b * s_dim * e_dim, s_dim * e_dim);
  clear(dv, b * s_dim * ev, s_dim * ev);
  // rowsum(dO * O) = rowsum(W * dW) for the weights W after dropout: the term of the softmax's backward.
  for (index_t i = 0; i < l_dim; ++i) {
    const T* o = out + (b * l_dim + i) * ev;
    const T* g = dout + (b * l_dim + i) * ev;
    T sum = T(0);
    for (index_t d = 0; d < ev; ++d) sum += g[d] * o[d];
    delta[i] = sum;
  }
  const T keep_scale = attention_keep_scale<T>(p.dropout);
  for (index_t j0 = 0; j0 < s_dim; j0 += bc) {
    const index_t cols = std::min(bc, s_dim - j0);
    const T* v = p.v + (b * s_dim + j0) * ev;
    const T* k = p.k + (b * s_dim + j0) * e_dim;
    // Under is_causal the queries before j0 see none of these keys.
    const index_t first_tile = p.causal ? (j0 / br) * br : 0;
    for (index_t i0 = first_tile; i0 < l_dim; i0 += br) {
      const index_t rows = std::min(br, l_dim - i0);
      const T* q = p.q + (b * l_dim + i0) * e_dim;
      const T* g = dout + (b * l_dim + i0) * ev;
      scores_tile(p, b, i0, rows, j0, cols, s);
      gemm(false, true, rows, cols, ev, T(1), g, ev, v, ev, T(0), dw, bc, {}, p.precision);  // dW = dO v^T
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r;
        T* prow = s + r * bc;
        T* drow = dw + r * bc;
        const T row_lse = lse[b * l_dim + i];
        attention_exp_row(prow, cols, row_lse);
        // With dropout W = Z P and dP = Z dW for the mask Z; then dS = P (dP - rowsum(dO * O)). prow becomes W.
        const T di = delta[i];
        if (p.dropout.active) {
          const std::uint64_t first = static_cast<std::uint64_t>((b * l_dim + i) * s_dim + j0);
          for (index_t c = 0; c < cols; ++c) {
            const T z = attention_dropout_factor(p.dropout, keep_scale, first + static_cast<std::uint64_t>(c));
            const T weight = prow[c];
            drow[c] = weight * (z * drow[c] - di);
            prow[c] = z * weight;
          }
        } else {
          for (index_t c = 0; c < cols; ++c) drow[c] = prow[c] * (drow[c] - di);
        }
      }
      if (dv.data)  // dV += W^T dO
        gemm(true, false, cols, ev, rows, T(1), s, bc, g, ev, T(1), dv.data + (b * s_dim + j0) * ev, ev, {},
             p.precision);
      if (dk.data)  // dK += scale dS^T Q
        gemm(true, false, cols, e_dim, rows, p.scale, dw, bc, q, e_dim, T(1), dk.data + (b * s_dim + j0) * e_dim,
             e_dim, {}, p.precision);
      if (dq.data)  // dQ += scale dS K
        gemm(false, false, rows, e_dim, cols, p.scale, dw, bc, k, e_dim, T(1), dq.data + (b * l_dim + i0) * e_dim,
             e_dim, {}, p.precision);
    }
  }
}

}  // namespace attention_detail

// out [B, L, Ev] = softmax(scale q k^T + mask) v, with dropout on the weights; lse [B, L] for the backward.
template <class T>
void attention_forward(const attention_problem<T>& p, T* out, T* lse) {
  constexpr index_t br = attention_query_tile, bc = attention_key_tile;
  const index_t tiles = (p.queries + br - 1) / br;
  const index_t jobs = p.batch * tiles;
  const index_t work_per_job = std::max<index_t>(1, br * p.keys * (p.head_dim + p.value_dim));
  const index_t work_size = br * bc + br * p.value_dim + 2 * br;
  parallel_row_slices(jobs, attention_min_work_per_thread / work_per_job, [&](index_t begin, index_t end) {
    T* work = attention_detail::scratch<T>(work_size).data();
    for (index_t job = begin; job < end; ++job) {
      const index_t b = job / tiles, i0 = (job % tiles) * br;
      attention_detail::forward_tile(p, b, i0, std::min(br, p.queries - i0), out, lse, work);
    }
  });
}

// The gradients of q, k and v from the output's gradient dout, the output and lse of the forward (each target may be
// null, written or added to).
template <class T>
void attention_backward(const attention_problem<T>& p, const T* out, const T* lse, const T* dout,
                        const attention_grad<T>& dq, const attention_grad<T>& dk, const attention_grad<T>& dv) {
  constexpr index_t br = attention_query_tile, bc = attention_key_tile;
  const index_t work_per_batch = std::max<index_t>(1, 2 * p.queries * p.keys * (p.head_dim + p.value_dim));
  const index_t work_size = 2 * br * bc + p.queries;
  parallel_row_slices(p.batch, attention_min_work_per_thread / work_per_batch, [&](index_t begin, index_t end) {
    T* work = attention_detail::scratch<T>(work_size).data();
    for (index_t b = begin; b < end; ++b) attention_detail::backward_batch(p, b, out, lse, dout, dq, dk, dv, work);
  });
}

}  // namespace kiln::kernels::cpu
