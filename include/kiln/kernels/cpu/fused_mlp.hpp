// One training step of a one-hidden-layer MLP on the CPU threads in one parallel region: x -> Dense(hidden, ReLU) ->
// Dense(out) -> softmax cross-entropy (mean) -> gradients -> Adam on every parameter. The CPU counterpart of the GPU's
// fused step (kernels/cuda/fused_mlp.cuh), and for the same reason: the layer-by-layer step opens a parallel region
// per large kernel and runs the small ones between them on one thread while the others wait.
//
// How the work is split: thread t owns a range of hidden units, whole tiles of 16 (sized by the threads' recent
// speeds, thread_balance.hpp): their rows of W1 and b1, and every product, gradient and Adam update of those. Its part
// of the forward product and of the weight gradient is gemm_part's share of the whole product, so nothing of W1 and
// its Adam state leaves the core that updates it. The head is small (out x hidden): after the one barrier that makes
// the hidden layer's output whole, every thread computes the logits, the loss, dL/dlogits and dL/dhidden of the whole
// batch itself, in scratch of its own, rather than wait for one thread to share them. A second barrier keeps the
// first thread from updating W2 and b2 (its extra share) before every thread has read them.
//
// The arithmetic is the layer-by-layer step's: each product runs the kernel and path gemm takes for the whole product
// (gemm_part where it is split), and the loss, the ReLU's backward, the bias sums and Adam are the same kernels over
// the same values. The losses and parameters are those of Sequential::train_step with Adam, bit for bit, on any
// number of threads (tests/test_fused_mlp.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_scratch.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"

namespace kiln::kernels::cpu {

// One parameter tensor of the fused step with its gradient and Adam's two moments, all of the tensor's length.
struct fused_parameter {
  float* value;
  float* grad;
  float* exp_avg;
  float* exp_avg_sq;
};

// Everything one fused step reads and writes.
struct fused_mlp_step_arguments {
  const float* x;              // batch x in, row-major
  const std::int64_t* labels;  // batch class indices, already checked to lie in [0, out)
  index_t batch, in, hidden, out;
  fused_parameter w1, b1, w2, b2;  // (hidden x in), (hidden), (out x hidden), (out): PyTorch's Linear layouts
  float* hidden_values;            // batch x hidden, 64-byte aligned: the hidden layer's output
  adam_step_args<float> adam;      // this step's count included; amsgrad unused
  product_precision precision;     // of the products, as the model's policy sets it
};

// Hidden units go to the threads in tiles of this many: gemm_part's parts start on multiples of 16, and a part of
// the hidden layer's output then fills whole 64-byte lines.
inline constexpr index_t fused_mlp_unit_tile = 16;

// The threads a fused step of this shape shares its work over: one per tile of hidden units at most, and one
// where gemm would not run the two large products blocked or on AMX tiles (then they cannot be split).
inline int fused_mlp_threads(index_t batch, index_t in, index_t hidden) {
  if (!gemm_splits<float>(false, true, batch, hidden, in) || !gemm_splits<float>(true, false, hidden, in, batch))
    return 1;
  return int(std::min<index_t>(num_threads(), (hidden + fused_mlp_unit_tile - 1) / fused_mlp_unit_tile));
}

namespace fused_mlp_detail {

inline gemm_detail::gemm_scratch& thread_scratch() {
  static thread_local gemm_detail::gemm_scratch scratch;
  return scratch;
}

// Adam on elements [begin, end) of one tensor.
inline void adam_range(const fused_parameter& p, index_t begin, index_t end, const adam_step_args<float>& adam) {
  if (begin < end)
    optim_kernels::adam_update(p.value + begin, p.grad + begin, p.exp_avg + begin, p.exp_avg_sq + begin,
                               static_cast<float*>(nullptr), end - begin, adam);
}

// Thread `id`'s part of the step: hidden units [u0, u1). Every thread of the team calls it (the barriers), with
// every kernel inside running on the calling thread alone (num_threads() is 1 inside a parallel region). Returns
// the loss; busy_seconds gets the time the thread spent on the work that grows with its units, the forward product
// and everything after the second barrier, which is what the split's balance learns the threads' speeds from (the
// time to the end of the step would also count the waits at the barriers, which a slow thread makes the others
// share).
inline float step_part(const fused_mlp_step_arguments& a, int id, index_t u0, index_t u1, double& busy_seconds) {
  const index_t batch = a.batch, in = a.in, hidden = a.hidden, out = a.out;
  float* const h = a.hidden_values;
  using clock = std::chrono::steady_clock;
  const auto forward_start = clock::now();
  // The hidden layer's forward, this thread's columns: relu(x W1^T + b1).
  gemm_part<float>(false, true, batch, hidden, in, 1.0f, a.x, in, a.w1.value, in, h, hidden, 0, batch, u0, u1,
                   {a.b1.value, activation::relu, 0.0f}, a.precision);
  const auto forward_end = clock::now();
#pragma omp barrier
  // Scratch: logits and then dL/dlogits (batch x out), dL/dhidden (batch x hidden), the bias gradient (hidden).
  const index_t logits_size = gemm_detail::round_up(batch * out, 16), dh_size = gemm_detail::round_up(batch * hidden, 16);
  float* const logits = static_cast<float*>(
      thread_scratch().reserve(std::size_t(2 * logits_size + dh_size + gemm_detail::round_up(hidden, 16)) * sizeof(float)));
  float* const dlogits = logits + logits_size;
  float* const dh = dlogits + logits_size;
  float* const db1 = dh + dh_size;
  // The head, whole, as Dense<out>'s forward and the loss.
  gemm<float>(false, true, batch, out, hidden, 1.0f, h, hidden, a.w2.value, hidden, 0.0f, logits, out,
              {a.b2.value}, a.precision);
  const float loss = loss_kernels::softmax_cross_entropy(logits, a.labels, batch, out, reduction::mean, dlogits);
  // dL/dhidden, whole, as Dense<out>'s backward computes its input gradient; then the ReLU's backward in place and
  // the bias gradient, as Dense<hidden, ReLU>'s backward runs them.
  gemm<float>(false, false, batch, hidden, out, 1.0f, dlogits, out, a.w2.value, hidden, 0.0f, dh, hidden, {},
              a.precision);
  elementwise_kernels::activation_backward(activation::relu, static_cast<const float*>(nullptr), h, dh, dh,
                                           batch * hidden, 0.0f);
  reduce_kernels::sum_rows(dh, db1, batch, hidden, false);
#pragma omp barrier
  const auto own_start = clock::now();
  if (id == 0) {  // the head's gradients and update: every thread has read W2 and b2 by now
    gemm<float>(true, false, out, hidden, batch, 1.0f, dlogits, out, h, hidden, 0.0f, a.w2.grad, hidden, {},
                a.precision);
    reduce_kernels::sum_rows(dlogits, a.b2.grad, batch, out, false);
    adam_range(a.w2, 0, out * hidden, a.adam);
    adam_range(a.b2, 0, out, a.adam);
  }
  std::copy(db1 + u0, db1 + u1, a.b1.grad + u0);
  // This thread's rows of the hidden layer's weight gradient, dL/dhidden^T x, and their update.
  gemm_part<float>(true, false, hidden, in, batch, 1.0f, dh, hidden, a.x, in, a.w1.grad, in, u0, u1, 0, in, {},
                   a.precision);
  adam_range(a.w1, u0 * in, u1 * in, a.adam);
  adam_range(a.b1, u0, u1, a.adam);
  busy_seconds = std::chrono::duration<double>(forward_end - forward_start + (clock::now() - own_start)).count();
  return loss;
}

}  // namespace fused_mlp_detail

// One fused step (see the top of this file) on fused_mlp_threads(...) threads, their shares of the hidden units
// following `balance`. Returns the batch's loss.
inline float fused_mlp_step(const fused_mlp_step_arguments& a, thread_balance& balance) {
  const int threads = fused_mlp_threads(a.batch, a.in, a.hidden);
  double busy = 0;
  if (threads <= 1) return fused_mlp_detail::step_part(a, 0, 0, a.hidden, busy);
  float loss = 0;
#if defined(_OPENMP)
  const index_t tiles = (a.hidden + fused_mlp_unit_tile - 1) / fused_mlp_unit_tile;
  // At least one tile a thread: a balanced split that leaves a thread none splits equally.
  thread_split split = balance.split(threads);
  for (int id = 0; id < threads; ++id)
    if (split.end(tiles, id) <= split.begin(tiles, id)) split = thread_split::equal(threads);
  run_clock clock;
#pragma omp parallel num_threads(threads)
  {
    // A smaller team than asked for (nested parallelism, dynamic adjustment) splits equally.
    const int team = omp_get_num_threads(), id = omp_get_thread_num();
    const thread_split mine = split.over(team);
    const index_t u0 = std::min(a.hidden, mine.begin(tiles, id) * fused_mlp_unit_tile);
    const index_t u1 = std::min(a.hidden, mine.end(tiles, id) * fused_mlp_unit_tile);
    double busy_seconds = 0;
    const float part_loss = fused_mlp_detail::step_part(a, id, u0, u1, busy_seconds);
    if (id == 0) {
      loss = part_loss;
      clock.team = team;
    }
    if (id < thread_split::max_threads) clock.seconds[std::size_t(id)] = busy_seconds;
  }
  balance.record(split, tiles, clock);
#else
  (void)balance;
  loss = fused_mlp_detail::step_part(a, 0, 0, a.hidden, busy);
#endif
  return loss;
}

}  // namespace kiln::kernels::cpu
