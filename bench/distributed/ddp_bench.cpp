// Data-parallel training over MPI, in static and dynamic mode, on one of three workloads (ddp_workloads.hpp): the
// wide MLP (784 -> 1024 ReLU -> 1024 ReLU -> 10, a batch of 256), the ladder's MNIST MLP (784 -> 128 ReLU -> 10, a
// batch of 64) or its ResNet (examples/resnet_net.hpp, [1, 28, 28] inputs, a batch of 64), with Adam and the batch
// split across the ranks: how much faster the ranks train than one process, and how much of the all-reduce the
// overlap with the backward hides.
//
//   mpirun -np 2 --bind-to core build/bench/distributed/ddp_bench [--workload wide_mlp|mnist_mlp|resnet]
//          [--rounds 15] [--block 4] [--threads 1] [--bucket-mb 25] [--first-bucket-mb 1]
//
// bench/distributed/scaling runs it on every workload beside torch_ddp_bench.py. Modes, each with its own copy of the
// same model, trained on the same batches (random inputs of the workload's shape, drawn once from a fixed seed):
//   single   rank 0 alone on the whole batch, the other ranks waiting: one process's step;
//   local    every rank on its share of the batch, without any communication: the ranks' compute alone;
//   after    static_data_parallel with the buckets all-reduced after the backward (bucket_options::overlap off);
//   polled   the same overlap without the progress thread: the training thread polls the buckets at each layer;
//   overlap  static_data_parallel as it runs by default, each bucket all-reduced as soon as the backward fills it,
//            moved forward by the reducer's progress thread during the backward;
//   reduce   no training: the ranks meet at a barrier, then one blocking all-reduce of a buffer of the gradients'
//            size (and its division by the ranks) is timed: the transfer and the sums without a wait for a slower rank.
//   dynamic-single, dynamic-local, dynamic-after, dynamic-overlap   the same model in dynamic mode (nn::Sequential):
//            rank 0 alone on the whole batch; its share without communication; dynamic_data_parallel reducing after
//            loss.backward(); and reducing during the backward through ddp.backward(loss).
// The modes take turns, --block steps each, for --rounds rounds, so that a shared machine's slow and fast phases fall
// on all of them alike (docs/benchmarks.md). A mode's figure is the median of its steps. Before any time is printed,
// the bench checks that `after`, `polled` and `overlap` hold the same parameters, bit for bit (the same buckets give
// the same sums whenever they start), and the same on every rank, and that dynamic-after and dynamic-overlap hold the
// same parameters and buffers.
//
// The all-reduce's cost in a step is after - local (its transfer and sums, and the wait for the slower rank, which on a
// shared machine is most of it); the overlap leaves overlap - local of it in the step, and hides the rest:
// hidden = 1 - (overlap - local) / (after - local). With one rank the all-reduces have nothing to wait for.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "../../examples/common.hpp"
#include "ddp_workloads.hpp"
#include "kiln/distributed.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

constexpr index_t batch_pool = 8;

struct bench_options {
  int rounds, block, threads;
  double bucket_mb, first_bucket_mb;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Every mode of the bench on Workload (ddp_workloads.hpp), timed in turns, checked, and printed by rank 0.
template <class Workload>
void run(const bench_options& opt, distributed::process_group& group) {
  using Net = typename Workload::static_net;
  constexpr index_t global_batch = Workload::global_batch;
  const int rank = group.rank(), world = group.size();
  if (global_batch % world)
    fail("ddp_bench: expected a number of ranks that divides ", global_batch, ", found ", world);
  const index_t share = global_batch / world;

  // The batches, the same on every rank; rank r trains on rows [r * share, (r + 1) * share) of each.
  random_generator rng(1234);
  Tensor<float> x(Net::input_shape::batch_shape(batch_pool * global_batch));
  Tensor<std::int64_t> y(shape{batch_pool * global_batch});
  for (index_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.normal<float>();
  for (index_t i = 0; i < y.numel(); ++i) y.data()[i] = static_cast<std::int64_t>(rng.below(10));
  auto rows = [&](index_t step, index_t first, index_t count) {
    const index_t base = (step % batch_pool) * global_batch + first;
    return std::pair{x.rows(base, count), y.rows(base, count)};
  };

  const distributed::bucket_options buckets{
      .bucket_bytes = static_cast<index_t>(opt.bucket_mb * (1 << 20)),
      .first_bucket_bytes = static_cast<index_t>(opt.first_bucket_mb * (1 << 20))};
  distributed::bucket_options after_buckets = buckets, polled_buckets = buckets;
  after_buckets.overlap = false;
  polled_buckets.progress_thread = false;
  Net single(global_batch, 42), local(share, 42), after(share, 42), polled(share, 42), overlap(share, 42);
  distributed::static_data_parallel ddp_after(after, group, after_buckets), ddp_polled(polled, group, polled_buckets),
      ddp_overlap(overlap, group, buckets);
  optim::Adam adam_single({.lr = 1e-3}), adam_local({.lr = 1e-3}), adam_after({.lr = 1e-3}), adam_polled({.lr = 1e-3}),
      adam_overlap({.lr = 1e-3});

  std::vector<float> reduced(static_cast<std::size_t>(Net::flat_parameter_size), 1.0f);

  // Dynamic mode's models and their optimizers, one for each dynamic mode in the modes' order: single, local, after,
  // overlap.
  nn::Sequential dyn[] = {Workload::dynamic_net(42), Workload::dynamic_net(42), Workload::dynamic_net(42),
                          Workload::dynamic_net(42)};
  optim::Adam dyn_adam[] = {optim::Adam(dyn[0].parameters(), {.lr = 1e-3}),
                            optim::Adam(dyn[1].parameters(), {.lr = 1e-3}),
                            optim::Adam(dyn[2].parameters(), {.lr = 1e-3}),
                            optim::Adam(dyn[3].parameters(), {.lr = 1e-3})};
  nn::Sequential &dyn_after = dyn[2], &dyn_overlap = dyn[3];
  distributed::dynamic_data_parallel ddp_dyn_after(dyn_after, group, buckets),
      ddp_dyn_overlap(dyn_overlap, group, buckets);

  enum {
    single_mode,
    local_mode,
    after_mode,
    polled_mode,
    overlap_mode,
    reduce_mode,
    dyn_single_mode,
    dyn_local_mode,
    dyn_after_mode,
    dyn_overlap_mode,
    mode_count
  };
  const char* names[mode_count] = {"single",        "local",          "after",          "polled",
                                   "overlap",       "reduce",         "dynamic-single", "dynamic-local",
                                   "dynamic-after", "dynamic-overlap"};
  std::vector<double> times[mode_count], waits[mode_count];
  index_t steps[mode_count] = {};
  auto step = [&](int mode) {
    const index_t s = steps[mode]++;
    const auto [xs, ys] = rows(s, rank * share, share);
    if (mode == reduce_mode) group.barrier();
    const auto start = std::chrono::steady_clock::now();
    if (mode == single_mode) {
      if (rank == 0) {
        const auto [xa, ya] = rows(s, 0, global_batch);
        single.train_step(xa, ya, loss::cross_entropy{}, adam_single);
      }
    } else if (mode == local_mode) {
      local.train_step(xs, ys, loss::cross_entropy{}, adam_local);
    } else if (mode == after_mode) {
      ddp_after.train_step(xs, ys, loss::cross_entropy{}, adam_after);
      waits[mode].push_back(ddp_after.reducer().wait_seconds());
    } else if (mode == reduce_mode) {
      group.all_reduce(std::span<float>(reduced), distributed::reduce_op::average);  // as the reducer: sum, divide
    } else if (mode >= dyn_single_mode) {
      const bool whole = mode == dyn_single_mode;  // rank 0 alone on the whole batch, as `single`
      if (!whole || rank == 0) {
        nn::Sequential& model = dyn[mode - dyn_single_mode];
        optim::Adam& adam = dyn_adam[mode - dyn_single_mode];
        const auto [xd, yd] = whole ? rows(s, 0, global_batch) : rows(s, rank * share, share);
        adam.zero_grad();
        const auto loss = nn::cross_entropy(model(nn::Variable::borrowing(xd)), yd.span());
        if (mode == dyn_overlap_mode) ddp_dyn_overlap.backward(loss);
        else loss.backward();
        if (mode == dyn_after_mode) ddp_dyn_after.reduce_gradients();
        if (mode == dyn_overlap_mode) ddp_dyn_overlap.reduce_gradients();
        adam.step();
        if (mode == dyn_after_mode || mode == dyn_overlap_mode)
          waits[mode].push_back((mode == dyn_after_mode ? ddp_dyn_after : ddp_dyn_overlap).reducer().wait_seconds());
      }
    } else if (mode == polled_mode) {
      ddp_polled.train_step(xs, ys, loss::cross_entropy{}, adam_polled);
      waits[mode].push_back(ddp_polled.reducer().wait_seconds());
    } else {
      ddp_overlap.train_step(xs, ys, loss::cross_entropy{}, adam_overlap);
      waits[mode].push_back(ddp_overlap.reducer().wait_seconds());
    }
    times[mode].push_back(examples::seconds_since(start));
  };
  // One untimed step of each mode first (first-touch of the workspaces and the optimizer's state).
  for (int mode = 0; mode < mode_count; ++mode) {
    step(mode);
    times[mode].clear();
    waits[mode].clear();
  }
  for (int round = 0; round < opt.rounds; ++round)
    for (int mode = 0; mode < mode_count; ++mode) {
      group.barrier();  // every rank starts a turn together; the single modes wait here on the ranks but rank 0
      for (int b = 0; b < opt.block; ++b) step(mode);
    }

  // The checks before any time: the same buckets give the same parameters with and without the overlap, on every
  // rank.
  const auto a = after.parameter_values(), p = polled.parameter_values(), o = overlap.parameter_values();
  if (!std::equal(a.begin(), a.end(), o.begin()) || !std::equal(p.begin(), p.end(), o.begin()))
    fail("ddp_bench: the overlapped and the after-backward all-reduces trained different parameters");
  const auto dyn_a = dyn_after.state_dict(), dyn_o = dyn_overlap.state_dict();
  for (std::size_t i = 0; i < dyn_a.size(); ++i)
    if (!std::equal(dyn_a[i].second.span().begin(), dyn_a[i].second.span().end(), dyn_o[i].second.span().begin()))
      fail("ddp_bench: dynamic mode's overlapped and after-backward all-reduces trained different parameters");
  std::vector<float> root(o.begin(), o.end());
  group.broadcast(std::span<float>(root));
  std::int64_t differ = !std::equal(root.begin(), root.end(), o.begin());
  group.all_reduce(std::span<std::int64_t>(&differ, 1));
  if (differ) fail("ddp_bench: the ranks' parameters differ after training");

  // Rank 0's figures (every rank waits for the slowest at each all-reduce, so theirs are alike).
  double ms[mode_count], wait_ms[mode_count] = {};
  for (int mode = 0; mode < mode_count; ++mode) {
    ms[mode] = median(times[mode]) * 1e3;
    wait_ms[mode] = median(waits[mode]) * 1e3;
  }
  const double reduce_ms = ms[after_mode] - ms[local_mode], exposed_ms = ms[overlap_mode] - ms[local_mode];
  const double hidden = reduce_ms > 0 ? 1 - exposed_ms / reduce_ms : 0;
  const double dyn_reduce_ms = ms[dyn_after_mode] - ms[dyn_local_mode];
  const double dyn_exposed_ms = ms[dyn_overlap_mode] - ms[dyn_local_mode];
  const double dyn_hidden = dyn_reduce_ms > 0 ? 1 - dyn_exposed_ms / dyn_reduce_ms : 0;
  const double speedup = ms[single_mode] / ms[overlap_mode], dyn_speedup = ms[dyn_single_mode] / ms[dyn_overlap_mode];
  if (rank != 0) return;
  const char* workload = Workload::name;
  std::printf("%s, batch %lld over %d rank%s (%lld each), %d thread%s per rank, Adam; buckets of %.3g MB (first "
              "%.3g MB), %zu per step; %d rounds of %d steps\n",
              Workload::description, static_cast<long long>(global_batch), world, world == 1 ? "" : "s",
              static_cast<long long>(share), opt.threads, opt.threads == 1 ? "" : "s", opt.bucket_mb,
              opt.first_bucket_mb, ddp_overlap.reducer().bucket_count(), opt.rounds, opt.block);
  std::printf("%-16s %10s %14s\n", "mode", "step ms", "end wait ms");
  for (int mode = 0; mode < mode_count; ++mode)
    std::printf("%-16s %10.3f %14.3f\n", names[mode], ms[mode], wait_ms[mode]);
  if (world > 1) {
    std::printf("speed-up over one process: %.2fx; all-reduce %.3f ms after the backward, %.3f ms left with the "
                "overlap: %.0f%% hidden\n",
                speedup, reduce_ms, exposed_ms, hidden * 100);
    std::printf("dynamic mode: speed-up over one process %.2fx; all-reduce %.3f ms after the backward, %.3f ms left "
                "with ddp.backward: %.0f%% hidden\n",
                dyn_speedup, dyn_reduce_ms, dyn_exposed_ms, dyn_hidden * 100);
  }
  for (int mode = 0; mode < mode_count; ++mode)
    std::printf("RESULT bench=ddp_bench workload=%s ranks=%d threads=%d mode=%s step_ms=%.3f end_wait_ms=%.3f\n",
                workload, world, opt.threads, names[mode], ms[mode], wait_ms[mode]);
  std::printf("RESULT bench=ddp_bench workload=%s ranks=%d threads=%d speedup=%.3f allreduce_ms=%.3f exposed_ms=%.3f "
              "hidden=%.3f\n",
              workload, world, opt.threads, speedup, reduce_ms, exposed_ms, hidden);
  std::printf("RESULT bench=ddp_bench workload=%s mode=dynamic ranks=%d threads=%d speedup=%.3f allreduce_ms=%.3f "
              "exposed_ms=%.3f hidden=%.3f\n",
              workload, world, opt.threads, dyn_speedup, dyn_reduce_ms, dyn_exposed_ms, dyn_hidden);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--block", "--bucket-mb", "--first-bucket-mb", "--rounds", "--workload"});
  const bench_options opt{.rounds = static_cast<int>(flags.get_int("--rounds", 15)),
                          .block = static_cast<int>(flags.get_int("--block", 4)),
                          .threads = static_cast<int>(flags.get_int("--threads", 1)),
                          .bucket_mb = flags.get_double("--bucket-mb", 25),
                          .first_bucket_mb = flags.get_double("--first-bucket-mb", 1)};
  const std::string workload = flags.get("--workload", "wide_mlp");
  if (opt.rounds < 1 || opt.block < 1)
    fail("--rounds and --block: expected positive numbers, found ", opt.rounds, " and ", opt.block);
  if (workload != "wide_mlp" && workload != "mnist_mlp" && workload != "resnet")
    fail("--workload: expected wide_mlp, mnist_mlp or resnet, found '", workload, "'");
  set_num_threads(opt.threads);

  distributed::process_group group;
  if (workload == "wide_mlp") run<bench::ddp::wide_mlp>(opt, group);
  else if (workload == "mnist_mlp") run<bench::ddp::mnist_mlp>(opt, group);
  else run<bench::ddp::resnet>(opt, group);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "ddp_bench: %s\n", e.what());
  return 1;
}
