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
// head reads all of a row), one after the loss (the backward reads every row's dL/dlogits); and a third before the
// forward's products where the hidden layer takes the sparse-input products, after each thread's listing of its
// share of the rows (every thread walks every listing). The first thread also updates b2 and adds up the loss.
//
// The arithmetic is the layer-by-layer step's: each product runs the kernel and path gemm takes for the whole product
// (a part of it where it is split; the head's two backward products, where gemm runs them blocked, in one pass of
// the same FMA chains that also takes the ReLU's backward and b1's sums, head_backward_part), and the loss, the
// ReLU's backward, the bias sums and Adam are the same arithmetic over the same values, in the same order. The losses,
// parameters and gradients are those of Sequential::train_step with Adam, bit for bit, on any number of threads
// (tests/test_fused_mlp.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/dense_sparse_input.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/head_backward.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"
#include "kiln/kernels/fused_parameter.hpp"

namespace kiln::kernels::cpu {

using kernels::fused_parameter;  // kernels/fused_parameter.hpp

// Where a fused step's time goes, thread by thread: the seconds each thread of the last profiled step spent in each
// part (fused_mlp_trainer::train_step with a profile, bench/thread_scaling --profile). The parts are timed by reading
// the clock between them on each thread; the step's arithmetic is the same.
struct fused_mlp_parts {
  enum part : int {
    entering,       // from the step's start to the thread's first kernel (the parallel region's start)
    forward,        // the hidden layer's forward, the thread's units
    wait_forward,   // the barrier after it
    head_and_loss,  // the head's forward and the loss, the thread's rows
    wait_loss,      // the barrier after them
    head_backward,  // W2's gradient, dL/dhidden, the ReLU's backward, b1's gradient (and Adam on b2, the loss)
    w1_gradient,    // W1's gradient, the thread's units
    w1_update,      // Adam on W1, b1 and W2, the thread's units
    count
  };
  static constexpr const char* names[count] = {
      "entering the parallel region",      "hidden layer's forward (own units)", "waiting for every hidden unit",
      "head's forward and loss (own rows)", "waiting for every row's loss",       "head's backward, Adam on b2",
      "W1's gradient (own units)",          "Adam on W1, b1 and W2 (own units)"};
  int threads = 0;  // of the last step
  std::array<std::array<double, count>, thread_split::max_threads> seconds{};
};

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
  bool sparse_input;               // whether the model's policy takes the sparse-input products (cpu_sparse_input)
  fused_mlp_parts* parts = nullptr;  // where set, each thread's parts of the step are timed into it
};

// Hidden units go to the threads in tiles of this many: gemm_part's parts start on multiples of 16, and a part of
// the hidden layer's output then fills whole 64-byte lines.
inline constexpr index_t fused_mlp_unit_tile = 16;

// The threads a fused step of this shape shares its work over: one per tile of hidden units and per batch row at
// most, and one where a product that the step splits would not run the same way in parts: the products split by
// hidden units must run blocked or on AMX tiles (gemm_splits), and the head's forward must take the same path on
// each thread's rows as on the whole batch (then every row comes out the same).
inline int fused_mlp_threads(index_t batch, index_t in, index_t hidden, index_t out,
                             product_precision precision = product_precision::single) {
  const index_t tiles = (hidden + fused_mlp_unit_tile - 1) / fused_mlp_unit_tile;
  const int most = int(std::min({index_t(num_threads()), tiles, batch}));
  if (most <= 1 || !gemm_splits<float>(false, true, batch, hidden, in, precision) ||
      !gemm_splits<float>(true, false, hidden, in, batch, precision) ||
      !gemm_splits<float>(false, false, batch, hidden, out, precision) ||
      !gemm_splits<float>(true, false, out, hidden, batch, precision))
    return 1;
  const auto head_route = [&](index_t rows) {
    return gemm_detail::route_of<float>(false, true, rows, out, hidden, out, precision);
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
                         index_t j0, index_t j1, const epilogue<float>& ep, product_precision precision,
                         double first_tile_share = 0) {
  if (i0 == 0 && i1 == m && j0 == 0 && j1 == n)
    gemm<float>(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, ep, precision);
  else
    gemm_part<float>(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, c, ldc, i0, i1, j0, j1, ep, precision,
                     first_tile_share);
}

// Asks for columns [u0, u1) of every row of h (batch x hidden) to be brought into this core's cache for writing:
// PREFETCHW where the build targets a CPU that has it (-march=native on one), a read prefetch elsewhere. A hint only,
// which changes where the lines are, never what they hold.
inline void prefetch_for_writing(const float* h, index_t batch, index_t hidden, index_t u0, index_t u1) {
  for (index_t row = 0; row < batch; ++row)
    for (index_t j = u0; j < u1; j += 16) __builtin_prefetch(h + row * hidden + j, 1, 3);
}

// Thread `id` of `team`'s part of the step: hidden units [u0, u1). Every thread of the team calls it (the barriers),
// with every kernel inside running on the calling thread alone (num_threads() is 1 inside a parallel region).
// Returns the loss on the first thread. busy_seconds gets the time the thread spent on the work that grows with its
// units (the forward product and everything after the second barrier), which is what the split's balance learns the
// threads' speeds from: the time to the end of the step would also count the waits at the barriers. `listings`: room
// for the team's listings of the batch where the hidden layer takes the sparse-input products, null where it does not.
KILN_LIBRARY_FUNCTION float step_part(const fused_mlp_step_arguments& a, int id, int team, index_t u0, index_t u1,
                                      std::chrono::steady_clock::time_point step_start, const sparse_input** listings,
                                      double& busy_seconds);
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION float step_part(const fused_mlp_step_arguments& a, int id, int team, index_t u0, index_t u1,
                                      std::chrono::steady_clock::time_point step_start, const sparse_input** listings,
                                      double& busy_seconds) {
  const index_t batch = a.batch, in = a.in, hidden = a.hidden, out = a.out;
  float* const h = a.hidden_values;
  float* const dh = a.hidden_grads;
  float* const head = a.head_values;
  using clock = std::chrono::steady_clock;
  const auto forward_start = clock::now();
  double* const timed = a.parts && id < thread_split::max_threads ? a.parts->seconds[std::size_t(id)].data() : nullptr;
  auto part_start = step_start;
  const auto part_done = [&](fused_mlp_parts::part part) {
    if (!timed) return;
    const auto now = clock::now();
    timed[part] = std::chrono::duration<double>(now - part_start).count();
    part_start = now;
  };
  if (timed) {
    timed[fused_mlp_parts::entering] = std::chrono::duration<double>(forward_start - step_start).count();
    part_start = forward_start;
  }
  // The hidden layer's forward, this thread's columns: relu(x W1^T + b1). Each thread reads every row of the batch,
  // starting id / team of the way down: where a data loader shared out the batch's rows (data_loader), thread id's
  // own rows are in its core's cache, and the two threads do not wait on the same lines from the other core at once
  // (docs/benchmarks.md).
  // An input mostly of one value (as images with a blank background are) takes the sparse-input products, as Dense's
  // forward and backward take them on policy::cpu_sparse_input (dense_sparse_input.hpp), where `listings` is given
  // (fused_mlp_step_arguments::sparse_input): each thread lists its share of the batch's rows into listings[id], once
  // for the forward and W1's gradient both, and walks every thread's listing (the same answer on every thread): all of
  // them in one pass over the strips of its rows of W1, after the barrier that waits for them
  // (sparse_input_forward_sums::add). Its own share added first, before the barrier, would keep
  // every strip of W1^T for the other shares: the thread's whole part of W1^T, not one strip in the L1 cache.
  if (listings) listings[id] = sparse_input_kernels::list_share(a.x, batch, in, id, team);
  const sparse_input* const own = listings ? listings[id] : nullptr;
  // The listing is an equal share of the rows on every thread, whatever the split of the units: not the balance's to
  // learn from, nor the wait for the other threads' shares.
  const auto units_start = clock::now();
  std::optional<sparse_input_forward_sums> sums;
  if (own && u0 < u1) sums.emplace(a.w1.value, in, in, batch, a.x[0], u0, u1);
  const auto units_wait = clock::now();
  if (listings && team > 1) {
#pragma omp barrier
  }
  const auto units_resume = clock::now();
  const bool sparse = listings && sparse_input_kernels::shares_qualify(batch, in, team, listings);
  const std::span<const sparse_input* const> parts(listings, sparse ? std::size_t(team) : 0);
  if (sparse) {
    if (sums) {
      sums->add(parts);
      sums->finish(a.b1.value, activation::relu, 0.0f, h, hidden);
    }
  } else {
    product_part(false, true, batch, hidden, in, a.x, in, a.w1.value, in, h, hidden, 0, batch, u0, u1,
                 {a.b1.value, activation::relu, 0.0f}, a.precision, double(id) / double(team));
  }
  const auto forward_end = clock::now();
  part_done(fused_mlp_parts::forward);
#pragma omp barrier
  part_done(fused_mlp_parts::wait_forward);
  // The head's forward and the loss on this thread's rows, the logits overwritten by dL/dlogits, scaled as the
  // whole batch's mean.
  const thread_split rows = thread_split::equal(team);
  const index_t r0 = rows.begin(batch, id), r1 = rows.end(batch, id);
  gemm<float>(false, true, r1 - r0, out, hidden, 1.0f, h + r0 * hidden, hidden, a.w2.value, hidden, 0.0f,
              head + r0 * out, out, {a.b2.value}, a.precision);
  const float scale = reduction_scale<float>("cross_entropy", reduction::mean, batch);
  loss_kernels::softmax_cross_entropy_rows(head, a.labels, r0, r1, out, scale, head, a.row_losses);
  part_done(fused_mlp_parts::head_and_loss);
#pragma omp barrier
  const auto own_start = clock::now();
  part_done(fused_mlp_parts::wait_loss);
  // This thread's columns of h, taken back for writing while its head's backward reads them: the other threads' head
  // forward read them for their rows and left copies in their cores' caches, and the next step's forward, writing
  // them, then waited for each line to be taken back from the other core, a few at a time. Asked for here, the lines
  // come back during the backward; asked for at the start of the step instead, they would wait on the same fill buffers
  // as the listing's loads, and gain nothing (docs/benchmarks.md).
  if (team > 1) prefetch_for_writing(h, batch, hidden, u0, u1);
  float loss = 0;
  if (id == 0) {  // b2 (every thread has read it by now) and the loss, summed as softmax_cross_entropy sums it
    reduce_kernels::sum_rows(head, a.b2.grad, batch, out, false);
    adam_range(a.b2, 0, out, a.adam);
    sum_type<float> total = 0;
    for (index_t row = 0; row < batch; ++row) total += a.row_losses[row];
    loss = static_cast<float>(total) * scale;
  }
  // This thread's columns of W2's gradient and of dL/dhidden (as Dense<out>'s backward), the ReLU's backward on them
  // in place and their bias gradient (as Dense<hidden, ReLU>'s backward), then its rows of W1's gradient and the
  // update of W1, b1 and its columns of W2 (no thread reads W2 after the barrier). W2 is updated there rather than
  // right after its gradient: the head's backward gains more than the updates lose (bench/thread_scaling --profile;
  // bits unchanged).
  if (head_backward_fusable(batch, hidden, out, a.precision)) {
    head_backward_part(head, h, a.w2.value, a.w2.grad, dh, a.b1.grad, batch, hidden, out, u0, u1);
  } else {
    product_part(true, false, out, hidden, batch, head, out, h, hidden, a.w2.grad, hidden, 0, out, u0, u1, {},
                 a.precision);
    product_part(false, false, batch, hidden, out, head, out, a.w2.value, hidden, dh, hidden, 0, batch, u0, u1, {},
                 a.precision);
    for (index_t row = 0; row < batch; ++row) {  // activation_backward's arithmetic, on this thread's columns
      float* const dh_row = dh + row * hidden;
      const float* const h_row = h + row * hidden;
      for (index_t j = u0; j < u1; ++j)
        dh_row[j] = activate_backward(activation::relu, 0.0f, h_row[j], dh_row[j], 0.0f);
    }
    reduce_kernels::sum_rows_part(dh, a.b1.grad, batch, hidden, u0, u1, false);
  }
  part_done(fused_mlp_parts::head_backward);
  if (sparse)
    sparse_input_weight_gradient_part(parts, dh, hidden, a.w1.grad, in, false, u0, u1);
  else
    product_part(true, false, hidden, in, batch, dh, hidden, a.x, in, a.w1.grad, in, u0, u1, 0, in, {}, a.precision);
  part_done(fused_mlp_parts::w1_gradient);
  adam_range(a.w1, u0 * in, u1 * in, a.adam);
  adam_range(a.b1, u0, u1, a.adam);
  for (index_t o = 0; o < out; ++o) adam_range(a.w2, o * hidden + u0, o * hidden + u1, a.adam);
  part_done(fused_mlp_parts::w1_update);
  busy_seconds = std::chrono::duration<double>((units_wait - units_start) + (forward_end - units_resume) +
                                               (clock::now() - own_start))
                     .count();
  return loss;
}
#endif

}  // namespace fused_mlp_detail

// One fused step (see the top of this file) on fused_mlp_threads(...) threads, their shares of the hidden units
// following `balance`. Returns the batch's loss.
inline float fused_mlp_step(const fused_mlp_step_arguments& a, thread_balance& balance) {
  using steady = std::chrono::steady_clock;
  const steady::time_point step_start = a.parts ? steady::now() : steady::time_point{};  // read only when profiling
  [[maybe_unused]] const int threads = fused_mlp_threads(a.batch, a.in, a.hidden, a.out, a.precision);
  double busy = 0;
  // Whether the hidden layer may take the sparse-input products, decided once for the whole team (the listing is
  // followed by a barrier that every thread or none must reach), and the team's listings of the batch.
  const bool sparse = a.sparse_input && dense_sparse_input_applies<float>(a.batch, a.in, a.hidden);
  const sparse_input* listings[max_listing_threads] = {};
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
      const float part_loss =
          fused_mlp_detail::step_part(a, id, team, u0, u1, step_start, sparse ? listings : nullptr, busy_seconds);
      if (id == 0) {
        loss = part_loss;
        clock.team = team;
        if (a.parts) a.parts->threads = std::min(team, thread_split::max_threads);
      }
      if (id < thread_split::max_threads) clock.seconds[std::size_t(id)] = busy_seconds;
    }
    balance.record(split, tiles, clock);
    return loss;
  }
#endif
  (void)balance;  // one thread: nothing to balance
  if (a.parts) a.parts->threads = 1;
  return fused_mlp_detail::step_part(a, 0, 1, 0, a.hidden, step_start, sparse ? listings : nullptr, busy);
}

}  // namespace kiln::kernels::cpu
