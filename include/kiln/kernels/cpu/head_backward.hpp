// The backward of a Dense layer (W2: out x hidden) over a Dense layer with a fused ReLU (its output h: batch x
// hidden), in one pass over the batch: W2's gradient dL/dlogits^T h, dL/dh = dL/dlogits W2 through the ReLU's
// backward, and the lower layer's bias gradient (dL/dh's column sums) where asked for, with the bits of the two
// products, activation_backward and sum_rows. An MLP's head: the fused step (fused_mlp.hpp) runs it on each thread's
// hidden units, and static mode's Sequential, with fused epilogues, on all of them (policy::cpu's
// dense_backward_through_relu, layers/dense.hpp).
#pragma once

#include <algorithm>
#include <utility>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/config.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_microkernel.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

namespace kiln::kernels::cpu {

// Whether head_backward_part gives the bits of the two products it replaces: gemm must run both on the blocked path
// (not AMX tiles, narrow or direct) in one k block, where every element is one FMA chain over k from zero.
inline bool head_backward_fusable(index_t batch, index_t hidden, index_t out,
                                  product_precision precision = product_precision::single) {
  using gemm_detail::gemm_route;
  return gemm_detail::route_of<float>(true, false, out, hidden, batch, hidden, precision) == gemm_route::blocked &&
         gemm_detail::route_of<float>(false, false, batch, hidden, out, hidden, precision) == gemm_route::blocked &&
         gemm_detail::k_block_depth<float>(batch) == batch && gemm_detail::k_block_depth<float>(out) == out;
}

// Outputs o0 .. o0 + Count of head_backward_part over one vector of hidden units (`lanes` of them, at column j).
// Rows go four at a time: dL/dhidden's chain over the outputs is Count dependent FMAs per row, and one row at a time
// waited on the FMA's latency; four rows' chains interleave, while each weight gradient's chain still takes the rows
// in order. The last group of outputs (Last) finishes dL/dhidden: the ReLU's backward on it, and where b1_grad is
// set, b1's gradient summed over the rows in order from zero.
template <int Count, bool Last>
KILN_NOINLINE void head_backward_outputs(const float* head, const float* h, const float* w2, float* w2_grad, float* dh,
                                         float* b1_grad, index_t batch, index_t hidden, index_t out, index_t o0,
                                         index_t j, int lanes) {
  using S = gemm_detail::simd<float>;
  using Reg = typename S::reg;
  constexpr int rows_at_once = 4;
  const bool full = lanes == S::width;
  auto load = [&](const float* p) { return full ? S::load(p) : S::load_n(p, lanes); };
  auto store = [&](float* p, Reg x) { full ? S::store(p, x) : S::store_n(p, x, lanes); };
  Reg weight[Count], weight_grad[Count];
#pragma GCC unroll 16
  for (int o = 0; o < Count; ++o) {
    weight[o] = load(w2 + (o0 + o) * hidden + j);
    weight_grad[o] = S::zero();
  }
  Reg bias_grad = S::zero();
  const auto some_rows = [&]<int Rows>(index_t row) {
    Reg hidden_value[Rows], hidden_grad[Rows];
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      hidden_value[r] = load(h + (row + r) * hidden + j);
      hidden_grad[r] = o0 == 0 ? S::zero() : load(dh + (row + r) * hidden + j);
    }
#pragma GCC unroll 16
    for (int o = 0; o < Count; ++o) {
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        const Reg logit_grad = S::set1(head[(row + r) * out + o0 + o]);
        weight_grad[o] = S::fmadd(logit_grad, hidden_value[r], weight_grad[o]);
        hidden_grad[r] = S::fmadd(logit_grad, weight[o], hidden_grad[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      if constexpr (Last) {
        hidden_grad[r] = S::relu_backward(hidden_value[r], hidden_grad[r]);
        bias_grad = S::add(bias_grad, hidden_grad[r]);
      }
      store(dh + (row + r) * hidden + j, hidden_grad[r]);
    }
  };
  index_t row = 0;
  for (; row + rows_at_once <= batch; row += rows_at_once) some_rows.template operator()<rows_at_once>(row);
  for (; row < batch; ++row) some_rows.template operator()<1>(row);
#pragma GCC unroll 16
  for (int o = 0; o < Count; ++o) store(w2_grad + (o0 + o) * hidden + j, weight_grad[o]);
  if (Last && b1_grad) store(b1_grad + j, bias_grad);
}

// W2's gradient (dL/dlogits^T h), dL/dhidden (dL/dlogits W2) through the hidden layer's ReLU, and where b1_grad is
// set b1's gradient (its column sums), on hidden units [u0, u1), u0 a multiple of the vector width, in one pass over
// the batch that broadcasts each element of dL/dlogits once for both products and packs nothing. Where
// head_backward_fusable holds,
// these are the bits of the two products, activation_backward and sum_rows_part (gemm_microkernel.hpp's chains:
// each element summed over k in order from zero, the batch for W2's gradient and the outputs for dL/dhidden; a chain
// that runs on across a group of outputs is stored and reloaded, which is exact; the ReLU's backward is a select). b1's
// sums are taken in the pass where sum_rows sums each column in one chain of rows in order, and by sum_rows_part
// after it elsewhere. The one pass takes less time than the two gemm calls; on two threads, separate ReLU and sum
// passes over a thread's half of the units took longer than one thread's over all of them: they read the hidden layer's
// values again after the other thread's head had read them (docs/benchmarks.md).
KILN_LIBRARY_FUNCTION void head_backward_part(const float* head, const float* h, const float* w2, float* w2_grad,
                                              float* dh, float* b1_grad, index_t batch, index_t hidden, index_t out,
                                              index_t u0, index_t u1);
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION void head_backward_part(const float* head, const float* h, const float* w2, float* w2_grad,
                                              float* dh, float* b1_grad, index_t batch, index_t hidden, index_t out,
                                              index_t u0, index_t u1) {
  constexpr int width = gemm_detail::simd<float>::width;
  // Outputs go in groups whose weights and accumulators stay in registers beside 4 rows' values and gradients.
  constexpr int group = width >= 16 ? 10 : 4;
  // The pass adds the rows in order, which is sum_rows' arithmetic where it sums each of these columns in one chain.
  bool sums_in_pass = true;
  for (index_t j = u0; j < u1; j += width)
    sums_in_pass &= reduce_kernels::sum_rows_column_chains<float>(hidden, j) == 1;
  float* const pass_sums = sums_in_pass ? b1_grad : nullptr;
  for (index_t j = u0; j < u1; j += width) {
    const int lanes = int(std::min<index_t>(width, u1 - j));
    for (index_t o0 = 0; o0 < out; o0 += group) {
      const auto outputs = [&]<int Count>() {
        if (o0 + Count == out)
          head_backward_outputs<Count, true>(head, h, w2, w2_grad, dh, pass_sums, batch, hidden, out, o0, j, lanes);
        else
          head_backward_outputs<Count, false>(head, h, w2, w2_grad, dh, nullptr, batch, hidden, out, o0, j, lanes);
      };
      [&]<int... Counts>(std::integer_sequence<int, Counts...>) {
        const int count = int(std::min<index_t>(group, out - o0));
        (void)((count == Counts + 1 ? (outputs.template operator()<Counts + 1>(), true) : false) || ...);
      }(std::make_integer_sequence<int, group>{});
    }
  }
  if (!sums_in_pass && b1_grad) reduce_kernels::sum_rows_part(dh, b1_grad, batch, hidden, u0, u1, false);
}
#endif

}  // namespace kiln::kernels::cpu
