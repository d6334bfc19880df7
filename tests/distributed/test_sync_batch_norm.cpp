// SyncBatchNorm over MPI, run as two ranks (tests/distributed/CMakeLists.txt): 2 ranks x 32 samples with
// SyncBatchNorm train as one process with BatchNorm on the 64 (parameters and running statistics after 20 steps),
// where per-rank BatchNorm does not; under ddp.backward, whose buckets start during its backward, the same bits as
// after loss.backward(); its forward and input gradient on images against BatchNorm2d on the whole batch;
// all_reduce_sum's gradient, on the group and through replicas; evaluation without communication.
//
// Within float rounding, not bit for bit, against one process: the one-process kernel sums a channel's values in its
// own order (in double), SyncBatchNorm sums each rank's share with the tensor ops and then adds the ranks' sums. Bit
// for bit between the ways of reducing: an all-reduce of two ranks computes a + b, whenever it starts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/distributed.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "relative_difference.hpp"

using namespace kiln;
namespace dist = kiln::distributed;
using kiln::test::max_relative_difference;

namespace {

constexpr index_t features = 12, hidden = 16, classes = 5, global_batch = 64, steps = 20;

Tensor<float> normal_tensor(const shape& s, std::uint64_t seed, float offset = 0) {
  random_generator rng(seed);
  Tensor<float> t(s);
  for (auto& v : t.span()) v = offset + rng.normal<float>();
  return t;
}

// Rows [first, first + count) of x (any rank, rows along dimension 0).
Tensor<float> rows_of(const Tensor<float>& x, index_t first, index_t count) {
  shape s = x.shape();
  const index_t row = x.numel() / s[0];
  s[0] = count;
  Tensor<float> out(s);
  std::copy_n(x.data() + first * row, count * row, out.data());
  return out;
}

std::span<const float> values(const nn::Variable& v) { return {v.data(), static_cast<std::size_t>(v.numel())}; }

// Linear -> (Sync)BatchNorm -> ReLU -> Linear, the normalisation given.
template <class Norm>
nn::Sequential mlp(Norm&& norm) {
  return nn::Sequential(nn::Linear(features, hidden), std::forward<Norm>(norm), nn::ReLU(), nn::Linear(hidden, classes));
}

// Linear -> Norm -> ReLU -> Linear -> Norm -> ReLU -> Linear: parameters below, between and above two normalisations,
// each made by make_norm().
template <class MakeNorm>
nn::Sequential deep_mlp(MakeNorm make_norm) {
  return nn::Sequential(nn::Linear(features, hidden), make_norm(), nn::ReLU(), nn::Linear(hidden, hidden), make_norm(),
                        nn::ReLU(), nn::Linear(hidden, classes));
}

// The SyncBatchNorm layers of model whose sums go through replicas.
std::size_t lent(nn::Sequential& model, const replica_reducer* replicas) {
  std::size_t n = 0;
  model.apply([&](nn::Module& m) {
    if (auto* norm = dynamic_cast<dist::SyncBatchNorm*>(&m); norm && norm->replicas() == replicas) ++n;
  });
  return n;
}

// Trains model for `steps` SGD steps on batches drawn from `seed`, each rank taking its `share` of the rows of every
// global batch starting at row `first`; backward(loss) runs between the forward and the step (the backward and the
// reduction of the gradients, if any).
template <class Backward>
void train_steps(nn::Sequential& model, index_t first, index_t share, Backward backward) {
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  random_generator labels(99);
  for (index_t s = 0; s < steps; ++s) {
    const Tensor<float> x = normal_tensor(shape{global_batch, features}, 1000 + std::uint64_t(s), 0.5f);
    Tensor<std::int64_t> y(shape{global_batch});
    for (auto& v : y.span()) v = static_cast<std::int64_t>(labels.below(classes));
    Tensor<std::int64_t> mine(shape{share});
    std::copy_n(y.data() + first, share, mine.data());
    sgd.zero_grad();
    backward(nn::cross_entropy(model(nn::Variable(rows_of(x, first, share))), mine));
    sgd.step();
  }
}

}  // namespace

TEST_CASE("SyncBatchNorm: 2 ranks x 32 train as one process's BatchNorm on 64; per-rank BatchNorm does not") {
  set_num_threads(1);
  dist::process_group group;
  REQUIRE(group.size() == 2);
  const index_t share = global_batch / 2, first = share * group.rank();

  manual_seed(5);
  auto reference = mlp(nn::BatchNorm1d(hidden));
  train_steps(reference, 0, global_batch, [](const nn::Variable& loss) { loss.backward(); });

  manual_seed(5);
  auto synced = mlp(dist::SyncBatchNorm(group, hidden));
  dist::dynamic_data_parallel ddp(synced, group);
  train_steps(synced, first, share, [&](const nn::Variable& loss) {
    loss.backward();
    ddp.reduce_gradients();
  });

  manual_seed(5);
  auto per_rank = mlp(nn::BatchNorm1d(hidden));
  dist::dynamic_data_parallel per_rank_ddp(per_rank, group);
  train_steps(per_rank, first, share, [&](const nn::Variable& loss) {
    loss.backward();
    per_rank_ddp.reduce_gradients();
  });

  const auto expected = reference.state_dict(), got = synced.state_dict(), unsynced = per_rank.state_dict();
  REQUIRE(expected.size() == got.size());
  double synced_difference = 0, unsynced_difference = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(got[i].first == expected[i].first);  // BatchNorm's names
    synced_difference = std::max(synced_difference, max_relative_difference(got[i].second.span(), expected[i].second.span()));
    unsynced_difference =
        std::max(unsynced_difference, max_relative_difference(unsynced[i].second.span(), expected[i].second.span()));
  }
  MESSAGE("after 20 steps, largest relative difference to one process: SyncBatchNorm ", synced_difference,
          ", per-rank BatchNorm ", unsynced_difference);
  CHECK(synced_difference < 1e-6);
  CHECK(unsynced_difference > 1e-3);
}

TEST_CASE("SyncBatchNorm under ddp.backward: its all-reduces keep their place among the buckets on every rank") {
  // ddp.backward(loss) starts each bucket as soon as its gradients are final, from the reducer's progress thread at a
  // moment of its own on each rank, while the backward goes on to SyncBatchNorm's all-reduces on the same group. With
  // buckets of 64 and then 128 bytes, one closes right above each SyncBatchNorm (the Linear above it, then its own
  // weight and bias), so each all-reduce of its backward comes just after a bucket on both ranks, and the collectives
  // must still come in the same order on both, from one thread at a time; average() after the backward too.
  set_num_threads(1);
  dist::process_group group;
  REQUIRE(group.size() == 2);
  const index_t share = global_batch / 2, first = share * group.rank();
  const dist::bucket_options small_buckets{.bucket_bytes = 128, .first_bucket_bytes = 64};

  manual_seed(5);
  auto reference = deep_mlp([] { return nn::BatchNorm1d(hidden); });
  std::vector<float> reference_losses;
  train_steps(reference, 0, global_batch, [&](const nn::Variable& loss) {
    reference_losses.push_back(loss.data()[0]);
    loss.backward();
  });

  manual_seed(5);
  auto plain = deep_mlp([&] { return dist::SyncBatchNorm(group, hidden); });
  {
    dist::dynamic_data_parallel ddp(plain, group, small_buckets);
    train_steps(plain, first, share, [&](const nn::Variable& loss) {
      loss.backward();
      ddp.reduce_gradients();
    });
  }

  manual_seed(5);
  auto overlapped = deep_mlp([&] { return dist::SyncBatchNorm(group, hidden); });
  std::size_t closed_during_backward = 0;
  std::vector<float> losses;
  {
    dist::dynamic_data_parallel ddp(overlapped, group, small_buckets);
    CHECK(lent(overlapped, &ddp.replicas()) == 2);
    train_steps(overlapped, first, share, [&](const nn::Variable& loss) {
      ddp.backward(loss);
      closed_during_backward = ddp.reducer().bucket_count();
      losses.push_back(static_cast<float>(ddp.average(loss.data()[0])));
      ddp.reduce_gradients();
    });
  }
  CHECK(lent(overlapped, nullptr) == 2);  // summing on the group itself again
  MESSAGE("buckets closed during the backward: ", closed_during_backward,
          group.serialized_threads() ? " (started by the progress thread)" : " (started by the caller's thread)");
  CHECK(closed_during_backward >= 4);

  // The same bits as the reduction after the backward: every sum is a + b of the same values, whenever it starts.
  const auto a = plain.state_dict(), b = overlapped.state_dict(), expected = reference.state_dict();
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == expected.size());
  double difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(std::ranges::equal(a[i].second.span(), b[i].second.span()));
    difference = std::max(difference, max_relative_difference(b[i].second.span(), expected[i].second.span()));
  }
  // And one process's BatchNorm on the whole batch, within float rounding (see the top of this file).
  MESSAGE("after 20 steps, largest relative difference to one process: ", difference);
  CHECK(difference < 1e-6);
  // The mean of the ranks' losses, each over 32 samples, is one process's over the 64.
  CHECK(max_relative_difference(losses, reference_losses) < 1e-5);
}

TEST_CASE("SyncBatchNorm: images normalised by the whole batch's statistics; gradients as BatchNorm2d's") {
  set_num_threads(1);
  dist::process_group group;
  const index_t channels = 3, share = 4, first = share * group.rank();
  const Tensor<float> images = normal_tensor(shape{2 * share, channels, 5, 5}, 7, 1.5f);
  const Tensor<float> upstream = normal_tensor(shape{2 * share, channels, 5, 5}, 8);

  manual_seed(1);
  nn::BatchNorm2d whole(channels);
  nn::Variable x_all(images, true);
  const nn::Variable y_all = whole(x_all);
  nn::sum(nn::mul(y_all, nn::Variable(upstream))).backward();

  manual_seed(1);
  dist::SyncBatchNorm synced(group, channels);
  nn::Variable x_mine(rows_of(images, first, share), true);
  const nn::Variable y_mine = synced(x_mine);
  // The sum of both ranks' losses: on each rank, its rows' share of the whole batch's gradient.
  nn::sum(nn::mul(y_mine, nn::Variable(rows_of(upstream, first, share)))).backward();

  const Tensor<float> expected_y = rows_of(y_all.tensor(), first, share);
  CHECK(max_relative_difference(values(y_mine), expected_y.span()) < 1e-5);
  const Tensor<float> expected_dx = rows_of(Tensor<float>(x_all.grad()), first, share);
  const Tensor<float> dx(x_mine.grad());
  CHECK(max_relative_difference(dx.span(), expected_dx.span()) < 1e-5);
  // weight and bias: each rank's part; the two parts add up to the whole batch's gradient.
  for (auto [mine, all] : {std::pair{synced.weight, whole.weight}, std::pair{synced.bias, whole.bias}}) {
    std::vector<float> summed(mine.grad().span().begin(), mine.grad().span().end());
    group.all_reduce(std::span<float>(summed));
    CHECK(max_relative_difference(summed, all.grad().span()) < 1e-5);
  }
  CHECK(max_relative_difference(values(synced.running_mean), values(whole.running_mean)) < 1e-6);
  CHECK(max_relative_difference(values(synced.running_var), values(whole.running_var)) < 1e-6);

  // Evaluation: the running statistics, no collective (ranks may evaluate different numbers of batches).
  synced.eval();
  whole.eval();
  const nn::Variable a = synced(nn::Variable(rows_of(images, 0, 1 + group.rank()))),
                     b = whole(nn::Variable(rows_of(images, 0, 1 + group.rank())));
  CHECK(max_relative_difference(values(a), values(b)) == 0);
  CHECK_THROWS_WITH_AS(synced(nn::Variable(Tensor<float>(shape{2, 4, 5}))), doctest::Contains("SyncBatchNorm"),
                       kiln::error);
}

TEST_CASE("all_reduce_sum: the sum over the ranks, whose gradient is the sum of the ranks' gradients") {
  dist::process_group group;
  const float r = static_cast<float>(group.rank());
  nn::Variable x(Tensor<float>(shape{3}, {1 + r, 2 + r, 3 + r}), true);
  const nn::Variable y = dist::all_reduce_sum(x, group);
  CHECK(y.data()[0] == 3.0f);  // (1 + 0) + (1 + 1)
  CHECK(y.data()[2] == 7.0f);
  // Rank r's loss weighs y by (r + 1): the gradient of the sum of both losses is 1 + 2 on every element.
  nn::sum(nn::mul(y, r + 1)).backward();
  for (float g : x.grad().span()) CHECK(g == 3.0f);

  // The same through a data-parallel model's replicas over the group, forward and backward.
  dist::group_replicas<float> replicas(group);
  nn::Variable z(Tensor<float>(shape{3}, {1 + r, 2 + r, 3 + r}), true);
  const nn::Variable w = dist::all_reduce_sum(z, replicas);
  CHECK(w.data()[0] == 3.0f);
  CHECK(w.data()[2] == 7.0f);
  nn::sum(nn::mul(w, r + 1)).backward();
  for (float g : z.grad().span()) CHECK(g == 3.0f);
}
