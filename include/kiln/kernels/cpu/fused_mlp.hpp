// One training step of a one-hidden-layer MLP on the CPU threads in one parallel region: x -> Dense(hidden, ReLU) ->
// Dense(out) -> softmax cross-entropy (mean) -> gradients -> Adam on every parameter. The CPU counterpart of the GPU's
// fused step (kernels/cuda/fused_mlp.cuh), and for the same reason: the layer-by-layer step opens a parallel region
// per large kernel and runs the small ones between them on one thread while the others wait.
//
// How the work is split: thread t owns a range of hidden units, whole tiles of 16 (sized by the threads' recent
// speeds, thread_balance.hpp): their rows of W1 and b1, their columns of W2, and every product, gradient and Adam
// update of those. Its part of each product is gemm_part's share of the whole product, so nothing of W1 and W2 and
// their Adam state leaves the core that updates them. The head's forward and the loss go by batch rows instead, an
// equal share each, as they need every hidden unit of a row. Two barriers: one after the hidden layer's forward (the
// head reads all of a row), one after the loss (the backward reads every row's dL/dlogits). The first thread also
// updates b2 and adds up the loss.
//
// The arithmetic is the layer-by-layer step's: each product runs the kernel and path gemm takes for the whole product
// (a part of it where it is split), and the loss, the ReLU's backward, the bias sums and Adam are the same kernels
// over the same values, in the same order. The losses, parameters and gradients are those of Sequential::train_step
// with Adam, bit for bit, on any number of threads (tests/test_fused_mlp.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"
#include "kiln/kernels/fused_parameter.hpp"

namespace kiln::kernels::cpu {

using kernels::fused_parameter;  // kernels/fused_parameter.hpp

// Everything one fused step reads and writes.
struct fused_mlp_step_arguments {
  const float* x;              // batch x in, row-major
  const std::int64_t* labels;  // batch class indices, already checked to lie in [0, out)
  index_t batch, in, hidden, out;
  fused_parameter w1, b1, w2, b2;  // (hidden x in), (hidden), (out x hidden), (out): PyTorch's Linear layouts
  float* hidden_values;            // batch x hidden, 64-byte aligned: the hidden layer's output
  float* hidden_grads;             // batch x hidden, 64-byte aligned: dL/d(hidden layer's output)
  float* head_values;              // batch x out: the logits, then dL/dlogits
  float* row_losses;               // batch: each row's loss before the mean
  adam_step_args<float> adam;      // this step's count included; amsgrad unused
  product_precision precision;     // of the products, as the model's policy sets it
};

// Hidden units go to the threads in tiles of this many: gemm_part's parts start on multiples of 16, and a part of
// the hidden layer's output then fills whole 64-byte lines.
inline constexpr index_t fused_mlp_unit_tile = 16;

// The threads a fused step of this shape shares its work over: one per tile of hidden units and per batch row at
// most, and one where a product that the step splits would not run the same way in parts: the products split by
// hidden units must run blocked or on AMX tiles (gemm_splits), and the head's forward must take the same path on
// each thread's rows as on the whole batch (then every row comes out the same).
inline int fused_mlp_threads(index_t batch, index_t in, index_t hidden, index_t out) {
  const index_t tiles = (hidden + fused_mlp_unit_tile - 1) / fused_mlp_unit_tile;
  const int most = int(std::min({index_t(num_threads()), tiles, batch}));
  if (most <= 1 || !gemm_splits<float>(false, true, batch, hidden, in) ||
      !gemm_splits<float>(true, false, hidden, in, batch) || !gemm_splits<float>(false, false, batch, hidden, out) ||
      !gemm_splits<float>(true, false, out, hidden, batch))
    return 1;
  const auto head_route = [&](index_t rows) {
    return gemm_detail::route_of<float>(false, true, rows, out, hidden, out);
  };
  for (int team = 2; team <= most; ++team) {
    const thread_split rows = thread_split::equal(team);
    for (int id = 0; id < team; ++id)
      if (head_route(rows.end(batch, id) - rows.begin(batch, id)) != head_route(batch)) return 1;
  }
  return most;
}

namespace fused_mlp_detail {

// Adam on elements [begin, end) of one tensor.
inline void adam_range(const fused_parameter& p, index_t begin, index_t end, const adam_step_args<float>& adam) {
  if (begin < end)
    optim_kernels::adam_update(p.value + begin, p.grad + begin, p.exp_avg + begin, p.exp_avg_sq + begin,
                               static_cast<float*>(nullptr), end - begin, adam);
}

// Rows [i0, i1) x columns [j0, j1) of a product with beta 0: gemm_part's share, or gemm itself for the whole (a step
// on one thread, which also takes products that gemm_part cannot split).
inline void product_part(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, const float* a,
                         index_t lda, const float* b, index_t ldb, float* c, index_t ldc, index_t i0, index_t i1,
                         index_t j0, index_t j1, const epilogue<float>& ep, product_precision precision) {
  if (i0 == 0 && i1 == m && j0 == 0 && j1 == n)
    gemm<float>(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, ep, precision);
  else
    gemm_part<float>(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, c, ldc, i0, i1, j0, j1, ep, precision);
}

// Thread `id` of `team`'s part of the step: hidden units [u0, u1). Every thread of the team calls it (the barriers),
// with every kernel inside running on the calling thread alone (num_threads() is 1 inside a parallel region).
// Returns the loss on the first thread. busy_seconds gets the time the thread spent on the work that grows with its
// units (the forward product and everything after the second barrier), which is what the split's balance learns the
// threads' speeds from: the time to the end of the step would also count the waits at the barriers.
inline float step_part(const fused_mlp_step_arguments& a, int id, int team, index_t u0, index_t u1,
                       double& busy_seconds) {
  const index_t batch = a.batch, in = a.in, hidden = a.hidden, out = a.out;
  float* const h = a.hidden_values;
  float* const dh = a.hidden_grads;
  float* const head = a.head_values;
  using clock = std::chrono::steady_clock;
  const auto forward_start = clock::now();
  // The hidden layer's forward, this thread's columns: relu(x W1^T + b1).
  product_part(false, true, batch, hidden, in, a.x, in, a.w1.value, in, h, hidden, 0, batch, u0, u1,
               {a.b1.value, activation::relu, 0.0f}, a.precision);
  const auto forward_end = clock::now();
#pragma omp barrier
  // The head's forward and the loss on this thread's rows, the logits overwritten by dL/dlogits, scaled as the
  // whole batch's mean.
  const thread_split rows = thread_split::equal(team);
  const index_t r0 = rows.begin(batch, id), r1 = rows.end(batch, id);
  gemm<float>(false, true, r1 - r0, out, hidden, 1.0f, h + r0 * hidden, hidden, a.w2.value, hidden, 0.0f,
              head + r0 * out, out, {a.b2.value}, a.precision);
  const float scale = reduction_scale<float>("cross_entropy", reduction::mean, batch);
  loss_kernels::softmax_cross_entropy_rows(head, a.labels, r0, r1, out, scale, head, a.row_losses);
#pragma omp barrier
  const auto own_start = clock::now();
  float loss = 0;
  if (id == 0) {  // b2 (every thread has read it by now) and the loss, summed as softmax_cross_entropy sums it
    reduce_kernels::sum_rows(head, a.b2.grad, batch, out, false);
    adam_range(a.b2, 0, out, a.adam);
    sum_type<float> total = 0;
    for (index_t row = 0; row < batch; ++row) total += a.row_losses[row];
    loss = static_cast<float>(total) * scale;
  }
  // This thread's columns of W2's gradient and of dL/dhidden (as Dense<out>'s backward), the ReLU's backward on them
  // in place and their bias gradient (as Dense<hidden, ReLU>'s backward), W2's update (only this thread reads these
  // columns of W2 after the barrier), then its rows of W1's gradient and the update of W1 and b1.
  product_part(true, false, out, hidden, batch, head, out, h, hidden, a.w2.grad, hidden, 0, out, u0, u1, {},
               a.precision);
  product_part(false, false, batch, hidden, out, head, out, a.w2.value, hidden, dh, hidden, 0, batch, u0, u1, {},
               a.precision);
  for (index_t row = 0; row < batch; ++row) {  // activation_backward's arithmetic, on this thread's columns
    float* const dh_row = dh + row * hidden;
    const float* const h_row = h + row * hidden;
    for (index_t j = u0; j < u1; ++j) dh_row[j] = activate_backward(activation::relu, 0.0f, h_row[j], dh_row[j], 0.0f);
  }
  reduce_kernels::sum_rows_part(dh, a.b1.grad, batch, hidden, u0, u1, false);
  for (index_t o = 0; o < out; ++o) adam_range(a.w2, o * hidden + u0, o * hidden + u1, a.adam);
  product_part(true, false, hidden, in, batch, dh, hidden, a.x, in, a.w1.grad, in, u0, u1, 0, in, {}, a.precision);
  adam_range(a.w1, u0 * in, u1 * in, a.adam);
  adam_range(a.b1, u0, u1, a.adam);
  busy_seconds = std::chrono::duration<double>(forward_end - forward_start + (clock::now() - own_start)).count();
  return loss;
}

}  // namespace fused_mlp_detail

// One fused step (see the top of this file) on fused_mlp_threads(...) threads, their shares of the hidden units
// following `balance`. Returns the batch's loss.
inline float fused_mlp_step(const fused_mlp_step_arguments& a, thread_balance& balance) {
  const int threads = fused_mlp_threads(a.batch, a.in, a.hidden, a.out);
  double busy = 0;
#if defined(_OPENMP)
  if (threads > 1) {
    const index_t tiles = (a.hidden + fused_mlp_unit_tile - 1) / fused_mlp_unit_tile;
    const thread_split split = balance.split(threads, tiles, 1);  // at least one tile a thread
    float loss = 0;
    run_clock clock;
#pragma omp parallel num_threads(threads)
    {
      // A smaller team than asked for (nested parallelism, dynamic adjustment) splits equally.
      const int team = omp_get_num_threads(), id = omp_get_thread_num();
      const thread_split mine = split.over(team);
      const index_t u0 = std::min(a.hidden, mine.begin(tiles, id) * fused_mlp_unit_tile);
      const index_t u1 = std::min(a.hidden, mine.end(tiles, id) * fused_mlp_unit_tile);
      double busy_seconds = 0;
      const float part_loss = fused_mlp_detail::step_part(a, id, team, u0, u1, busy_seconds);
      if (id == 0) {
        loss = part_loss;
        clock.team = team;
      }
      if (id < thread_split::max_threads) clock.seconds[std::size_t(id)] = busy_seconds;
    }
    balance.record(split, tiles, clock);
    return loss;
  }
#endif
  (void)balance;  // one thread: nothing to balance
  return fused_mlp_detail::step_part(a, 0, 1, 0, a.hidden, busy);
}

}  // namespace kiln::kernels::cpu
