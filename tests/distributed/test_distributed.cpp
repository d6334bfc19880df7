// Data-parallel training over MPI, run as two ranks (tests/distributed/CMakeLists.txt): the process group's
// collectives, the sampler's shards, and 2 ranks x 32 samples against 1 process x 64 on the same samples in both
// modes.
//
// What is bit-identical and what is not: the all-reduce of two ranks computes a + b, the same bits on both ranks, and
// the average divides by two, exactly; so the two ranks' gradients, and their parameters after each step, are equal
// bit for bit (checked). Against one process on the whole batch they agree within float rounding only: the loss's
// gradient is the same (1/32 halved is 1/64, exactly), but a weight gradient sums the batch's samples inside one
// product, which adds 64 terms in another order than two products of 32 whose sums are then added.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "kiln/distributed.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/checkpoint.hpp"
#include "kiln/kiln.hpp"
#include "relative_difference.hpp"
#include "kiln/train.hpp"

using namespace kiln;
namespace dist = kiln::distributed;
using kiln::test::max_relative_difference;

namespace {

constexpr index_t features = 12, classes = 5, samples = 256, global_batch = 64, steps = 20;
using Net = Sequential<policy::cpu, Input<features>, Dense<32, ReLU>, Dense<32, ReLU>, Dense<classes>>;

// A classification data set drawn from a fixed seed: every rank holds the same one.
data::tensor_dataset<float, std::int64_t> make_data() {
  random_generator rng(2024);
  Tensor<float> x(shape{samples, features});
  Tensor<std::int64_t> y(shape{samples});
  for (index_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.normal<float>();
  for (index_t i = 0; i < samples; ++i) y.data()[i] = static_cast<std::int64_t>(rng.below(classes));
  return {std::move(x), std::move(y)};
}

// The samples `indices` of the data set as one batch.
struct batch_tensors {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};
batch_tensors gather(const data::tensor_dataset<float, std::int64_t>& data, std::span<const index_t> indices) {
  const auto rows = static_cast<index_t>(indices.size());
  batch_tensors b{Tensor<float>(shape{rows, features}), Tensor<std::int64_t>(shape{rows})};
  data::get_batch(data, indices, b.x.view(), b.y.view());
  return b;
}

// Step s's samples: on one process, positions [64 s, 64 s + 64) of its epoch's order; on a rank, positions
// [32 s, 32 s + 32) of its shard. The sampler deals the order out in turn, so the two ranks' batches together are
// the one process's.
constexpr index_t steps_per_epoch = samples / global_batch;
std::span<const index_t> step_indices(const std::vector<index_t>& order, index_t step, index_t batch) {
  return std::span<const index_t>(order).subspan(static_cast<std::size_t>((step % steps_per_epoch) * batch),
                                                 static_cast<std::size_t>(batch));
}

// Whether every rank holds exactly rank 0's values.
bool same_on_every_rank(dist::process_group& group, std::span<const float> values) {
  std::vector<float> root(values.begin(), values.end());
  group.broadcast(std::span<float>(root));
  std::int64_t differ = !std::equal(root.begin(), root.end(), values.begin());
  group.all_reduce(std::span<std::int64_t>(&differ, 1));
  return differ == 0;
}

}  // namespace

TEST_CASE("process group: rank, size, broadcast, all-reduce, barrier, agreement") {
  dist::process_group group;
  REQUIRE(group.size() == 2);
  const int rank = group.rank();
  std::vector<double> values{1.0 + rank, 10.0 * (rank + 1)};
  group.all_reduce(std::span<double>(values));
  CHECK(values == std::vector<double>{3.0, 30.0});
  std::vector<float> averaged{float(rank), 3.0f};
  group.all_reduce(std::span<float>(averaged), dist::reduce_op::average);
  CHECK(averaged == std::vector<float>{0.5f, 3.0f});
  std::vector<std::int64_t> root_values{rank == 1 ? 7 : -1, rank == 1 ? 8 : -1};
  group.broadcast(std::span<std::int64_t>(root_values), 1);
  CHECK(root_values == std::vector<std::int64_t>{7, 8});
  group.barrier();
  CHECK(group.all_gather(100 + rank) == std::vector<std::int64_t>{100, 101});
  CHECK_NOTHROW(group.check_same(42, "answer"));
  const std::string disagree = "process_group: expected every rank to have the same rank, found rank 0 has 0, rank 1 "
                               "has 1 (seen from rank " + std::to_string(rank) + " of 2)";
  CHECK_THROWS_WITH_AS(group.check_same(rank, "rank"), disagree.c_str(), kiln::error);
  CHECK(!group.failed());
  CHECK_THROWS_WITH_AS(dist::process_group({.timeout = std::chrono::milliseconds(0)}),
                       "process_group: expected a positive timeout, found 0 ms", kiln::error);
}

TEST_CASE("distributed sampler: every sample once per epoch across the ranks") {
  dist::process_group group;
  for (const index_t n : {index_t(100), index_t(101)})
    for (const bool drop_last : {false, true}) {
      CAPTURE(n);
      CAPTURE(drop_last);
      dist::distributed_sampler sampler(n, group.rank(), group.size(), {.seed = 5, .drop_last = drop_last});
      CHECK(sampler.samples_per_rank() == (drop_last ? n / 2 : (n + 1) / 2));
      for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
        const std::vector<index_t> mine = sampler.indices(epoch);
        REQUIRE(index_t(mine.size()) == sampler.samples_per_rank());
        std::vector<std::int64_t> count(static_cast<std::size_t>(n), 0);
        for (index_t i : mine) ++count[static_cast<std::size_t>(i)];
        group.all_reduce(std::span<std::int64_t>(count));
        // Padding repeats the epoch's first sample; drop_last leaves out its last one; otherwise each sample once.
        const std::vector<index_t> order = dist::distributed_sampler(n, 0, 1, {.seed = 5}).indices(epoch);
        for (index_t i = 0; i < n; ++i) {
          std::int64_t expected = 1;
          if (n % 2 && !drop_last && i == order.front()) expected = 2;
          if (n % 2 && drop_last && i == order.back()) expected = 0;
          CHECK(count[static_cast<std::size_t>(i)] == expected);
        }
      }
    }
  // One rank's order is the data loader's, and the epochs differ.
  auto data = make_data();
  data::data_loader loader(data, {.batch_size = samples, .shuffle = true, .seed = 9});
  dist::distributed_sampler whole(samples, 0, 1, {.seed = 9});
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    const auto& batch = *loader.epoch(epoch).begin();
    const std::vector<index_t> order = whole.indices(epoch);
    CHECK(std::equal(order.begin(), order.end(), batch.samples.begin(), batch.samples.end()));
  }
  CHECK(whole.indices(0) != whole.indices(1));
  // A rank's shard as a data set, batched by a data loader.
  dist::shard_dataset shard(data, dist::distributed_sampler(samples, group.rank(), 2, {.seed = 9}));
  shard.set_epoch(1);
  data::data_loader shard_loader(shard, {.batch_size = 32, .shuffle = false});
  const auto& first = *shard_loader.epoch(1).begin();
  const std::vector<index_t> expected = dist::distributed_sampler(samples, group.rank(), 2, {.seed = 9}).indices(1);
  for (index_t r = 0; r < 32; ++r) {
    CHECK(first.y.data()[r] == data.labels().data()[expected[static_cast<std::size_t>(r)]]);
    CHECK(first.x.data()[r * features] == data.features().data()[expected[static_cast<std::size_t>(r)] * features]);
  }
  CHECK_THROWS_WITH_AS(dist::distributed_sampler(10, 2, 2),
                       "distributed_sampler: expected a rank from 0 to world_size - 1 and world_size >= 1, found rank "
                       "2 of 2",
                       kiln::error);
}

TEST_CASE("static mode: 2 ranks x 32 samples train as 1 process x 64 for 20 steps") {
  set_num_threads(1);
  dist::process_group group;
  const auto data = make_data();
  const dist::sampler_options sampling{.seed = 11};
  const dist::distributed_sampler whole(samples, 0, 1, sampling), mine(samples, group.rank(), 2, sampling);

  // The single process: the whole batch of 64, SGD with momentum.
  Net reference(global_batch, 7);
  optim::SGD reference_sgd({.lr = 0.05, .momentum = 0.9});
  for (index_t s = 0; s < steps; ++s) {
    auto b = gather(data, step_indices(whole.indices(std::uint64_t(s / steps_per_epoch)), s, global_batch));
    reference.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, reference_sgd);
  }

  // Rank 1 starts from other weights: the trainer gives it rank 0's. Small buckets, so that there are several, and
  // the same training with the buckets reduced after the backward instead of during it.
  Net net(32, 7 + std::uint64_t(group.rank())), after(32, 7 + std::uint64_t(group.rank()));
  dist::static_data_parallel ddp(net, group, {.bucket_bytes = 2048, .first_bucket_bytes = 512});
  dist::static_data_parallel ddp_after(after, group,
                                       {.bucket_bytes = 2048, .first_bucket_bytes = 512, .overlap = false});
  optim::SGD sgd({.lr = 0.05, .momentum = 0.9}), sgd_after({.lr = 0.05, .momentum = 0.9});
  for (index_t s = 0; s < steps; ++s) {
    auto b = gather(data, step_indices(mine.indices(std::uint64_t(s / steps_per_epoch)), s, 32));
    const float loss = ddp.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, sgd);
    CHECK(std::isfinite(ddp.average(loss)));
    ddp_after.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, sgd_after);
  }
  CHECK(ddp.reducer().bucket_count() > 2);
  CHECK(same_on_every_rank(group, net.parameter_values()));
  const double difference = max_relative_difference(net.parameter_values(), reference.parameter_values());
  MESSAGE("static mode: largest relative difference to one process after 20 steps ", difference);
  CHECK(difference < 1e-6);
  // The same buckets hold the same sums whenever they start.
  CHECK(std::ranges::equal(after.parameter_values(), net.parameter_values()));

  // A batch the model refuses, before any gradient is reduced, leaves the trainer usable.
  auto b = gather(data, step_indices(mine.indices(0), 0, 32));
  CHECK_THROWS_AS(ddp.train_step(b.x.view(), b.y.view().rows(0, 31), loss::cross_entropy{}, sgd), kiln::error);
  ddp.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, sgd);
  CHECK(same_on_every_rank(group, net.parameter_values()));
}

TEST_CASE("Model::fit across 2 ranks x 32 trains as one process's fit x 64, with the same logs on every rank") {
  set_num_threads(1);
  dist::process_group group;
  const auto data = make_data();
  const auto options = [](std::vector<std::shared_ptr<train::callback>> callbacks) {
    return fit_options<std::int64_t>{.epochs = 3, .batch_size = 32, .callbacks = std::move(callbacks), .verbose = 0,
                                     .seed = 5, .prefetch = 0};
  };

  // One process over the whole batch of 64: the same permutation, each batch the two ranks' batches together.
  Net reference(global_batch, 3);
  Model single(reference);
  single.compile(optim::SGD({.lr = 0.05, .momentum = 0.9}), loss::cross_entropy{}, {metric::accuracy, metric::f1_score()});
  auto single_options = options({});
  single_options.batch_size = global_batch;
  const auto expected = single.fit(data, single_options);

  const auto csv = std::filesystem::temp_directory_path() / "kiln_test_fit_across_ranks.csv";
  std::filesystem::remove(csv);
  group.barrier();
  Net net(32, 3 + std::uint64_t(group.rank()));
  dist::static_data_parallel ddp(net, group);
  Model model(ddp);
  model.compile(optim::SGD({.lr = 0.05, .momentum = 0.9}), loss::cross_entropy{}, {metric::accuracy, metric::f1_score()});
  const auto got = model.fit(data, options({std::make_shared<train::CSVLogger>(csv.string())}));

  CHECK(same_on_every_rank(group, net.parameter_values()));
  const double difference = max_relative_difference(net.parameter_values(), reference.parameter_values());
  MESSAGE("Model::fit across ranks: largest relative difference to one process after 3 epochs ", difference);
  CHECK(difference < 1e-6);
  for (const char* key : {"loss", "accuracy", "f1"}) {
    CAPTURE(key);
    const auto across = got.series(key), alone = expected.series(key);
    REQUIRE(across.size() == 3);
    std::vector<float> mine(across.begin(), across.end());
    CHECK(same_on_every_rank(group, mine));
    // The accuracy and F1 count the same predictions; the loss is a sum in another order.
    for (std::size_t e = 0; e < 3; ++e) CHECK(across[e] == doctest::Approx(alone[e]).epsilon(1e-6));
  }
  // The callbacks' file is written once, by rank 0.
  group.barrier();
  CHECK(std::filesystem::exists(csv));
  group.barrier();
  if (group.rank() == 0) std::filesystem::remove(csv);
}

TEST_CASE("static mode: a checkpoint written by 2 ranks resumes with 2, and with 1 process on the whole batch") {
  set_num_threads(1);
  dist::process_group group;
  const auto data = make_data();
  const dist::sampler_options sampling{.seed = 17};
  const dist::distributed_sampler whole(samples, 0, 1, sampling), mine(samples, group.rank(), 2, sampling);
  auto rank_batch = [&](index_t s) {
    return gather(data, step_indices(mine.indices(std::uint64_t(s / steps_per_epoch)), s, 32));
  };
  auto train = [&](auto& ddp, optim::Adam& adam, index_t from, index_t to) {
    for (index_t s = from; s < to; ++s) {
      auto b = rank_batch(s);
      ddp.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, adam);
    }
  };
  // Rank 0 writes, every rank reads: one file on this machine, named after rank 0's process.
  std::int64_t pid = ::getpid();
  group.broadcast(std::span<std::int64_t>(&pid, 1));
  const auto path = std::filesystem::temp_directory_path() / ("kiln_ddp_" + std::to_string(pid) + ".ckpt");

  // The uninterrupted run, and the same run stopped after half of its steps with a checkpoint.
  Net uninterrupted(32, 3), first_half(32, 3);
  optim::Adam adam_uninterrupted({.lr = 1e-2}), adam_first_half({.lr = 1e-2});
  dist::static_data_parallel ddp_uninterrupted(uninterrupted, group), ddp_first_half(first_half, group);
  train(ddp_uninterrupted, adam_uninterrupted, 0, steps);
  train(ddp_first_half, adam_first_half, 0, steps / 2);
  if (group.rank() == 0) io::save_checkpoint(path, first_half, adam_first_half, {.epoch = 0, .step = steps / 2});
  group.barrier();

  // Resumed on 2 ranks from fresh models: the uninterrupted run's parameters, bit for bit (the same buckets, sums).
  Net resumed(32, 99);
  optim::Adam adam_resumed({.lr = 1e-2});
  CHECK(io::load_checkpoint(path, resumed, adam_resumed).step == steps / 2);
  dist::static_data_parallel ddp_resumed(resumed, group);
  train(ddp_resumed, adam_resumed, steps / 2, steps);
  CHECK(std::ranges::equal(resumed.parameter_values(), uninterrupted.parameter_values()));

  // Resumed by one process on the whole batches: the same within float rounding.
  Net alone(global_batch, 99);
  optim::Adam adam_alone({.lr = 1e-2});
  io::load_checkpoint(path, alone, adam_alone);
  for (index_t s = steps / 2; s < steps; ++s) {
    auto b = gather(data, step_indices(whole.indices(std::uint64_t(s / steps_per_epoch)), s, global_batch));
    alone.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, adam_alone);
  }
  const double difference = max_relative_difference(alone.parameter_values(), uninterrupted.parameter_values());
  MESSAGE("resumed by one process: largest relative difference to the 2-rank run ", difference);
  CHECK(difference < 1e-6);
  group.barrier();
  if (group.rank() == 0) std::filesystem::remove(path);
}

namespace {
// A module with a parameter that only some ranks use: where unused, it gets no gradient, which counts as zeros.
struct optional_bias : nn::Module {
  std::shared_ptr<nn::Sequential> body;
  nn::Variable extra;
  bool use_extra = true;
  optional_bias() {
    body = register_module("body", nn::Sequential(nn::Linear(features, 32), nn::ReLU(), nn::Linear(32, 32), nn::ReLU(),
                                                  nn::Linear(32, classes)));
    extra = register_parameter("extra", Tensor<float>(shape{classes}, 0.0f));
  }
  nn::Variable forward(const nn::Variable& x) override {
    return use_extra ? (*body)(x) + extra : (*body)(x);
  }
};
}  // namespace

TEST_CASE("dynamic mode: 2 ranks x 32 samples train as 1 process x 64 for 20 steps") {
  set_num_threads(1);
  dist::process_group group;
  const auto data = make_data();
  const dist::sampler_options sampling{.seed = 13};
  const dist::distributed_sampler whole(samples, 0, 1, sampling), mine(samples, group.rank(), 2, sampling);
  auto step = [](nn::Module& model, optim::SGD& sgd, const batch_tensors& b, auto&& reduce) {
    sgd.zero_grad();
    auto loss = nn::cross_entropy(model(nn::Variable::borrowing(b.x)), b.y.span());
    loss.backward();
    reduce();
    sgd.step();
    return loss.item();
  };

  manual_seed(7);
  optional_bias reference;
  optim::SGD reference_sgd(reference.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (index_t s = 0; s < steps; ++s)
    step(reference, reference_sgd,
         gather(data, step_indices(whole.indices(std::uint64_t(s / steps_per_epoch)), s, global_batch)), [] {});

  manual_seed(7 + std::uint64_t(group.rank()));
  optional_bias model;
  dist::dynamic_data_parallel ddp(model, group, {.bucket_bytes = 2048, .first_bucket_bytes = 512});
  optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (index_t s = 0; s < steps; ++s)
    step(model, sgd, gather(data, step_indices(mine.indices(std::uint64_t(s / steps_per_epoch)), s, 32)),
         [&] { ddp.reduce_gradients(); });
  CHECK(ddp.reducer().bucket_count() > 2);
  double difference = 0;
  const auto got = model.parameters(), expected = reference.parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::span<const float> g(got[i].data(), std::size_t(got[i].numel()));
    CHECK(same_on_every_rank(group, g));
    const std::span<const float> e(expected[i].data(), std::size_t(expected[i].numel()));
    difference = std::max(difference, max_relative_difference(g, e));
  }
  MESSAGE("dynamic mode: largest relative difference to one process after 20 steps ", difference);
  CHECK(difference < 1e-6);

  // Rank 1 leaves `extra` out of its forward: its gradient there is the zeros it never got, so the average is half
  // of rank 0's gradient, on both ranks.
  model.use_extra = group.rank() == 0;
  auto b = gather(data, step_indices(mine.indices(0), 0, 32));
  sgd.zero_grad();
  nn::cross_entropy(model(nn::Variable::borrowing(b.x)), b.y.span()).backward();
  std::vector<float> rank0_gradient(classes, 0.0f);
  if (group.rank() == 0) std::ranges::copy(model.extra.grad().span(), rank0_gradient.begin());
  group.broadcast(std::span<float>(rank0_gradient));
  ddp.reduce_gradients();
  for (index_t c = 0; c < classes; ++c) CHECK(model.extra.grad().data()[c] == rank0_gradient[std::size_t(c)] / 2);
  CHECK(rank0_gradient != std::vector<float>(classes, 0.0f));
}

TEST_CASE("dynamic mode: ddp.backward overlaps the reduction with the backward and gives the same bits") {
  set_num_threads(1);
  dist::process_group group;
  const auto data = make_data();
  const dist::distributed_sampler mine(samples, group.rank(), 2, {.seed = 13});
  auto train = [&](optional_bias& model, bool overlapped, std::size_t& buckets_before_reduce) {
    dist::dynamic_data_parallel ddp(model, group, {.bucket_bytes = 1024, .first_bucket_bytes = 256,
                                                   .progress_thread = false});
    optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    for (index_t s = 0; s < steps; ++s) {
      const auto b = gather(data, step_indices(mine.indices(std::uint64_t(s / steps_per_epoch)), s, 32));
      sgd.zero_grad();
      const auto loss = nn::cross_entropy(model(nn::Variable::borrowing(b.x)), b.y.span());
      if (overlapped) {
        ddp.backward(loss);
        buckets_before_reduce = ddp.reducer().bucket_count();  // closed, and so started, during the backward
      } else {
        loss.backward();
      }
      ddp.reduce_gradients();
      sgd.step();
    }
  };
  manual_seed(7);
  optional_bias plain, overlapped;
  overlapped.load_state_dict(plain.state_dict());
  std::size_t unused = 0, closed_during_backward = 0;
  train(plain, false, unused);
  train(overlapped, true, closed_during_backward);
  const auto a = plain.state_dict(), b = overlapped.state_dict();
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::equal(a[i].second.span().begin(), a[i].second.span().end(), b[i].second.span().begin()));
  // The model's 1,642 values in buckets of 256 bytes and then 1 KiB: several close before the backward ends.
  MESSAGE("buckets closed during the backward: ", closed_during_backward);
  CHECK(closed_during_backward >= 3);

  // A parameter the forward leaves out is final from the end of the walk, as zeros; a second backward without a
  // reduction between is refused.
  overlapped.use_extra = group.rank() == 0;
  dist::dynamic_data_parallel ddp(overlapped, group);
  const auto batch = gather(data, step_indices(mine.indices(0), 0, 32));
  const auto loss = nn::cross_entropy(overlapped(nn::Variable::borrowing(batch.x)), batch.y.span());
  ddp.backward(loss);
  CHECK_THROWS_WITH_AS(ddp.backward(loss), doctest::Contains("never reduced"), kiln::error);
  ddp.reduce_gradients();
}
