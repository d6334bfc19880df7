// Static mode's SyncBatchNorm over MPI, run as two ranks (tests/distributed/CMakeLists.txt): a convolutional net with
// SyncBatchNorm2d (in the Sequential, in a Residual's body and in its Shortcut), 2 ranks x 32 under
// static_data_parallel, trains as one process's net with BatchNorm2d on the 64 (parameters and running statistics
// after 20 steps), where per-rank BatchNorm2d does not; the gradient of the sum of the ranks' losses against finite
// differences in double, with shares of different sizes, and against one process on the whole batch; evaluation
// without communication; the model alone again once the wrapper is gone.
//
// Within float rounding, not bit for bit, against one process: a channel's sum is two ranks' sums added (in double),
// and a convolution's weight gradient sums the batch in two products of 32 whose results are then added, where one
// process sums 64 terms in one product (as for any static_data_parallel model, tests/distributed/test_distributed.cpp).
// The two ranks hold the same bits: an all-reduce of two ranks computes a + b on both.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/distributed.hpp"
#include "kiln/kiln.hpp"
#include "relative_difference.hpp"

using namespace kiln;
namespace dist = kiln::distributed;
using kiln::test::max_relative_difference;

namespace {

constexpr index_t global_batch = 64, steps = 20;

// The net, its normalisation layers Norm: four of them, one in a Residual's body and one in its Shortcut.
template <class Norm>
using conv_net = Sequential<policy::cpu, Input<3, 8, 8>, Conv2D<8, 3, conv_options{.padding = 1}>, Norm, ReLU,
                            Residual<Shortcut<Conv2D<12, 1, conv_options{.stride = 2}>, Norm>,
                                     Conv2D<12, 3, conv_options{.stride = 2, .padding = 1}>, Norm, ReLU,
                                     Conv2D<12, 3, conv_options{.padding = 1}>, Norm>,
                            ReLU, GlobalAvgPool2D, Dense<5>>;

// Step s's global batch: images away from zero mean (so that the statistics matter) and labels, the same on every
// rank; rows [first, first + count) of it.
struct batch {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};
batch global_step_batch(index_t s, index_t first, index_t count) {
  random_generator rng(1000 + std::uint64_t(s));
  Tensor<float> x(shape{global_batch, 3, 8, 8});
  for (auto& v : x.span()) v = 0.5f + 2.0f * rng.normal<float>();
  Tensor<std::int64_t> y(shape{global_batch});
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(5));
  batch b{Tensor<float>(shape{count, 3, 8, 8}), Tensor<std::int64_t>(shape{count})};
  std::copy_n(x.data() + first * 3 * 64, count * 3 * 64, b.x.data());
  std::copy_n(y.data() + first, count, b.y.data());
  return b;
}

// The largest relative difference between two state dicts' values, their names required equal.
template <class A, class B>
double state_difference(const A& a, const B& b) {
  const auto dict_a = a.state_dict(), dict_b = b.state_dict();
  REQUIRE(dict_a.size() == dict_b.size());
  double worst = 0;
  for (std::size_t i = 0; i < dict_a.size(); ++i) {
    CHECK(dict_a[i].first == dict_b[i].first);
    worst = std::max(worst, max_relative_difference(dict_a[i].second.span(), dict_b[i].second.span()));
  }
  return worst;
}

template <class T>
bool same_on_every_rank(dist::process_group& group, std::span<const T> values) {
  std::vector<T> root(values.begin(), values.end());
  group.broadcast(std::span<T>(root));
  std::int64_t differ = !std::equal(root.begin(), root.end(), values.begin());
  group.all_reduce(std::span<std::int64_t>(&differ, 1));
  return differ == 0;
}

}  // namespace

TEST_CASE("static SyncBatchNorm2d: 2 ranks x 32 train as one process's BatchNorm2d on 64; per-rank BatchNorm not") {
  set_num_threads(1);
  dist::process_group group;
  REQUIRE(group.size() == 2);
  const index_t share = global_batch / 2, first = share * group.rank();

  conv_net<BatchNorm2d<>> reference(global_batch, 5);
  optim::SGD reference_sgd({.lr = 0.1, .momentum = 0.9});
  for (index_t s = 0; s < steps; ++s) {
    const batch b = global_step_batch(s, 0, global_batch);
    reference.train_step(b.x, b.y, loss::cross_entropy{}, reference_sgd);
  }

  conv_net<SyncBatchNorm2d<>> synced(share, 5);
  conv_net<BatchNorm2d<>> per_rank(share, 5);
  {
    // Small buckets: the Dense layer's gradients start while the Residual's three layers sum over the ranks in
    // their backward, and the Residual's while the first SyncBatchNorm2d does.
    dist::static_data_parallel ddp(synced, group, {.bucket_bytes = 2048, .first_bucket_bytes = 256});
    dist::static_data_parallel per_rank_ddp(per_rank, group, {.bucket_bytes = 2048, .first_bucket_bytes = 256});
    CHECK(synced.replicas() != nullptr);
    optim::SGD sgd({.lr = 0.1, .momentum = 0.9}), per_rank_sgd({.lr = 0.1, .momentum = 0.9});
    for (index_t s = 0; s < steps; ++s) {
      const batch b = global_step_batch(s, first, share);
      ddp.train_step(b.x, b.y, loss::cross_entropy{}, sgd);
      per_rank_ddp.train_step(b.x, b.y, loss::cross_entropy{}, per_rank_sgd);
    }
    CHECK(ddp.reducer().bucket_count() > 2);
  }
  CHECK(synced.replicas() == nullptr);  // a model alone again

  // Every parameter and running statistic, within float rounding over 20 steps: a sum in another order moves a
  // gradient by an ulp or so of its terms (6e-8 relative), and each step carries the differences on; 1.2e-7 here, as
  // for a static_data_parallel model without BatchNorm (test_distributed.cpp's 1e-6).
  const double synced_difference = state_difference(synced, reference);
  const double per_rank_difference = state_difference(per_rank, reference);
  MESSAGE("after 20 steps, largest relative difference to one process: SyncBatchNorm2d ", synced_difference,
          ", per-rank BatchNorm2d ", per_rank_difference);
  CHECK(synced_difference < 1e-6);
  CHECK(per_rank_difference > 1e-3);
  // The ranks hold the same model, running statistics included (each rank's own with per-rank BatchNorm).
  CHECK(same_on_every_rank<float>(group, synced.parameter_values()));
  CHECK(same_on_every_rank<float>(group, synced.buffer_values()));

  // Evaluation is BatchNorm's, without communication: the ranks evaluate different numbers of batches, and a
  // BatchNorm2d net that loads the state dict predicts the same bits.
  conv_net<BatchNorm2d<>> loaded(share, 0);
  loaded.load_state_dict(synced.state_dict());
  synced.eval();
  for (int r = 0; r <= group.rank(); ++r) {
    const batch b = global_step_batch(steps + r, first, share);
    CHECK(std::ranges::equal(synced.predict(b.x).span(), loaded.predict(b.x).span()));
  }
}

TEST_CASE("static SyncBatchNorm: the gradient of the ranks' summed loss, against finite differences and one process") {
  // Double precision; rank r holds 3 + r samples (the count per channel is summed over the ranks too). Every rank's
  // loss is the sum of squared errors over its samples, so the sum over the ranks is one process's loss on the 7.
  set_num_threads(1);
  dist::process_group group;
  using Synced = Sequential<policy::cpu, InputOf<double, 2, 4, 4>, Conv2D<3, 3>, SyncBatchNorm2d<>, Tanh, Flatten,
                            Dense<5>, SyncBatchNorm1d<0.2>, Tanh, Dense<2>>;
  using Whole = Sequential<policy::cpu, InputOf<double, 2, 4, 4>, Conv2D<3, 3>, BatchNorm2d<>, Tanh, Flatten,
                           Dense<5>, BatchNorm1d<0.2>, Tanh, Dense<2>>;
  const index_t total = 7, share = 3 + group.rank(), first = group.rank() == 0 ? 0 : 3;
  random_generator rng(11);
  Tensor<double> x_all(shape{total, 2, 4, 4}), target_all(shape{total, 2});
  for (auto& v : x_all.span()) v = 0.3 + rng.normal<double>();
  for (auto& v : target_all.span()) v = rng.normal<double>();
  Tensor<double> x(shape{share, 2, 4, 4}), target(shape{share, 2});
  std::copy_n(x_all.data() + first * 32, share * 32, x.data());
  std::copy_n(target_all.data() + first * 2, share * 2, target.data());
  const loss::mse loss{.reduce = reduction::sum};

  Synced net(share, 4);
  // Away from BatchNorm's tidy initial weight 1 and bias 0, the same on both ranks.
  random_generator perturb(104);
  for (auto& p : net.parameter_values()) p += 0.1 * perturb.normal<double>();
  dist::group_replicas<double> replicas(group);
  net.set_replicas(&replicas);

  net.forward_backward(x, target, loss);
  std::vector<double> analytic(net.gradient_values().begin(), net.gradient_values().end());
  group.all_reduce(std::span<double>(analytic));
  // The sum over the ranks of each rank's training-mode loss (every rank runs it: the forward is a collective).
  const auto summed_loss = [&] {
    const auto y = net.forward(x);
    double value = loss.forward_backward<policy::cpu>(y.data(), target.data(), static_cast<double*>(nullptr), share,
                                                      2);
    group.all_reduce(std::span<double>(&value, 1));
    return value;
  };
  auto params = net.parameter_values();
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double saved = params[i], h = 1e-6;
    params[i] = saved + h;
    const double up = summed_loss();
    params[i] = saved - h;
    const double down = summed_loss();
    params[i] = saved;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
  }
  MESSAGE("largest difference to central differences: ", worst);
  CHECK(worst < 1e-6);

  // One process with BatchNorm on all 7 samples, the same weights: the same gradient, within double rounding.
  Whole whole(total, 0);
  std::copy_n(net.parameter_values().begin(), params.size(), whole.parameter_values().begin());
  whole.forward_backward(x_all, target_all, loss);
  double to_whole = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i)
    to_whole = std::max(to_whole, std::abs(analytic[i] - whole.gradient_values()[i]) /
                                      (1.0 + std::abs(whole.gradient_values()[i])));
  MESSAGE("largest relative difference to one process's gradient: ", to_whole);
  CHECK(to_whole < 1e-12);
}
