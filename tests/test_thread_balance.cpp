// The split of parallel work by the threads' speeds (thread_balance.hpp): its arithmetic, how the shares learn from
// finishing times, and that no split changes a result, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"
#include "kiln/kiln.hpp"
#include "thread_settings.hpp"

using namespace kiln;
using kernels::cpu::run_clock;
using kernels::cpu::thread_balance;
using kernels::cpu::thread_split;

namespace {

// A run of `units` units split by `split` in which thread i took seconds[i].
void record_run(thread_balance& balance, const thread_split& split, index_t units, std::vector<double> seconds) {
  run_clock clock;
  clock.team = split.team;
  for (std::size_t i = 0; i < seconds.size(); ++i) clock.seconds[i] = seconds[i];
  balance.record(split, units, clock);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale) {
  random_generator rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * rng.normal<float>();
  return v;
}

}  // namespace

TEST_CASE("an equal split covers every unit once, in order") {
  for (int team : {1, 2, 3, 7}) {
    const thread_split s = thread_split::equal(team);
    for (index_t units : {0, 1, 8, 10, 6361}) {
      CAPTURE(team);
      CAPTURE(units);
      CHECK(s.begin(units, 0) == 0);
      CHECK(s.end(units, team - 1) == units);
      for (int id = 0; id < team; ++id) {
        CHECK(s.begin(units, id) <= s.end(units, id));
        if (id + 1 < team) CHECK(s.end(units, id) == s.begin(units, id + 1));
        // No thread gets more than one unit above an equal share.
        CHECK(s.end(units, id) - s.begin(units, id) <= units / team + 1);
      }
    }
  }
}

TEST_CASE("the shares move toward equal finishing times, within their floor") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  thread_balance balance;
  // Before any run: equal.
  CHECK(balance.split(2).begin(8, 1) == 4);

  // Thread 1 takes twice as long for the same work: it is half as fast, and its share tends to a third.
  for (int run = 0; run < 200; ++run) {
    const thread_split s = balance.split(2);
    const index_t units = 6000;
    const double work0 = double(s.end(units, 0)) / double(units), work1 = 1 - work0;
    record_run(balance, s, units, {work0 * 1e-4, 2 * work1 * 1e-4});
  }
  CHECK(balance.split(2).starts[1] == doctest::Approx(2.0 / 3.0).epsilon(0.01));

  // Ten times slower: the share stops at its floor, half of an equal share.
  for (int run = 0; run < 200; ++run) {
    const thread_split s = balance.split(2);
    const index_t units = 6000;
    const double work0 = double(s.end(units, 0)) / double(units), work1 = 1 - work0;
    record_run(balance, s, units, {work0 * 1e-4, 10 * work1 * 1e-4});
  }
  CHECK(balance.split(2).starts[1] == doctest::Approx(0.75).epsilon(0.001));

  // Cores a few percent apart split equally: shares near equal are taken as equal, so that the boundary between
  // the threads' parts does not wander with timing noise.
  thread_balance close;
  for (int run = 0; run < 200; ++run) {
    const thread_split s = close.split(2);
    const double work0 = double(s.end(6000, 0)) / 6000.0, work1 = 1 - work0;
    record_run(close, s, 6000, {work0 * 1e-4, 1.1 * work1 * 1e-4});  // thread 1 10% slower: its ideal share 0.476
  }
  CHECK(close.split(2).starts[1] == 0.5f);

  // One run says little: a thread interrupted once moves the shares by a fraction of the way.
  thread_balance steady;
  record_run(steady, thread_split::equal(2), 8, {1e-5, 1e-5});
  record_run(steady, thread_split::equal(2), 8, {1e-5, 1e-4});
  CHECK(steady.split(2).starts[1] < 0.5 + thread_balance::step);
  CHECK(steady.split(2).begin(8, 1) == 4);  // an 8-tile product still splits 4 + 4
}

TEST_CASE("balancing off, a new team size, or a run where a thread had nothing to do: equal shares") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  thread_balance balance;
  for (int run = 0; run < 50; ++run) record_run(balance, balance.split(2), 100, {1e-5, 3e-5});
  CHECK(balance.split(2).starts[1] > 0.6f);
  // Another team size starts from equal shares.
  CHECK(balance.split(3).starts[1] == doctest::Approx(1.0 / 3.0));
  kernels::cpu::set_thread_balancing(false);
  CHECK(balance.split(2).starts[1] == 0.5f);
  kernels::cpu::set_thread_balancing(true);

  thread_balance idle;
  // Two units over three threads: one thread gets none, and the run is not recorded.
  const thread_split three = thread_split::equal(3);
  REQUIRE(three.end(2, 1) - three.begin(2, 1) == 0);
  record_run(idle, three, 2, {1e-6, 1e-5, 1e-3});
  CHECK(idle.split(3).starts[1] == doctest::Approx(1.0 / 3.0));
}

TEST_CASE("fixed shares replace the learned ones for their team size, and bad weights are errors") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  thread_balance balance;
  kernels::cpu::set_fixed_thread_shares({3, 1});
  CHECK(balance.split(2).begin(8, 1) == 6);
  CHECK(balance.split(3).starts[1] == doctest::Approx(1.0 / 3.0));  // another team size: not fixed
  kernels::cpu::set_fixed_thread_shares({});
  CHECK(balance.split(2).begin(8, 1) == 4);

  CHECK_THROWS_WITH_AS(kernels::cpu::set_fixed_thread_shares({1, 0}),
                       "set_fixed_thread_shares: expected positive finite weights, found 0.000000 for thread 1",
                       kiln::error);
  CHECK_THROWS_AS(kernels::cpu::set_fixed_thread_shares({std::numeric_limits<double>::quiet_NaN()}), kiln::error);
  CHECK_THROWS_AS(kernels::cpu::set_fixed_thread_shares(std::vector<double>(65, 1.0)), kiln::error);
  CHECK(balance.split(2).begin(8, 1) == 4);  // a refused call changes nothing
}

#if defined(_OPENMP)
// The products of the MNIST MLP's step (its forward through the AMX or AVX-512 path, and its weight gradient) and
// Adam's update of a flat buffer give the same bits on one thread and on two split 4:1, 1:4 or equally.
TEST_CASE("no split of the work changes a product or an update") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  const index_t batch = 64, in = 784, hidden = 128;
  const auto x = random_values(std::size_t(batch * in), 1, 1.0f);
  const auto w = random_values(std::size_t(hidden * in), 2, 0.05f);
  const auto bias = random_values(std::size_t(hidden), 3, 0.1f);
  const auto dh = random_values(std::size_t(batch * hidden), 4, 0.01f);

  auto forward = [&] {
    std::vector<float> h(std::size_t(batch * hidden));
    kernels::cpu::epilogue<float> ep{};
    ep.bias = bias.data();
    ep.act = activation::relu;
    kernels::cpu::gemm(false, true, batch, hidden, in, 1.0f, x.data(), in, w.data(), in, 0.0f, h.data(), hidden, ep);
    return h;
  };
  auto weight_gradient = [&] {
    std::vector<float> dw(std::size_t(hidden * in));
    kernels::cpu::gemm(true, false, hidden, in, batch, 1.0f, dh.data(), hidden, x.data(), in, 0.0f, dw.data(), in);
    return dw;
  };
  auto adam = [&] {
    std::vector<float> p = w, m(w.size(), 0.0f), v(w.size(), 0.0f);
    const auto g = random_values(w.size(), 5, 0.01f);
    const kernels::cpu::adam_step_args<float> args{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, false, 1};
    for (int step = 0; step < 3; ++step)
      kernels::cpu::optim_kernels::adam_update(p.data(), g.data(), m.data(), v.data(), static_cast<float*>(nullptr),
                                               index_t(p.size()), args);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
  };

  for (bool amx : {true, false}) {
    CAPTURE(amx);
    kernels::cpu::set_amx_gemm(amx);
    set_num_threads(1);
    const auto h1 = forward(), dw1 = weight_gradient(), p1 = adam();
    set_num_threads(2);
    for (const std::vector<double>& shares : {std::vector<double>{4, 1}, {1, 4}, {1, 1}}) {
      CAPTURE(shares[0]);
      kernels::cpu::set_fixed_thread_shares(shares);
      CHECK(bitwise_equal(forward(), h1));
      CHECK(bitwise_equal(weight_gradient(), dw1));
      CHECK(bitwise_equal(adam(), p1));
    }
    kernels::cpu::set_fixed_thread_shares({});
  }
}

// The losses of `steps` training steps of Net (batch 64, random inputs, labels 0-9) on `threads` threads with the
// work split by `shares` (empty: learned), followed by the trained parameters.
template <class Net>
std::vector<float> train_losses(int threads, const std::vector<double>& shares, int steps) {
  const index_t batch = 64;
  const auto x = random_values(std::size_t(batch * Net::input_shape::size), 11, 1.0f);
  std::vector<std::int64_t> y(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int64_t((i * 7) % 10);
  const tensor_view<const float> xv(x.data(), Net::input_shape::batch_shape(batch));
  const tensor_view<const std::int64_t> yv(y.data(), shape{batch});
  set_num_threads(threads);
  kernels::cpu::set_fixed_thread_shares(shares);
  Net net(batch, 3);
  optim::Adam opt(optim::adam_options{.lr = 1e-3});
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(net.train_step(xv, yv, loss::cross_entropy{}, opt));
  losses.insert(losses.end(), net.parameter_values().begin(), net.parameter_values().end());
  return losses;
}

// A static model trained on two threads, its work split unevenly, takes the one-thread run's steps exactly.
TEST_CASE("a static model's losses are the same bits on one thread and on two split unevenly") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  using Net = Sequential<policy::cpu, Input<784>, Dense<128, ReLU>, Dense<10>>;
  const auto one = train_losses<Net>(1, {}, 5);
  CHECK(bitwise_equal(train_losses<Net>(2, {5, 1}, 5), one));
  CHECK(bitwise_equal(train_losses<Net>(2, {1, 5}, 5), one));
  CHECK(bitwise_equal(train_losses<Net>(2, {}, 5), one));
}

// The slices one call of parallel_row_slices handed out, in order of their first row.
std::vector<std::pair<index_t, index_t>> row_slices(index_t rows, index_t min_rows) {
  std::mutex mutex;
  std::vector<std::pair<index_t, index_t>> slices;
  kernels::cpu::parallel_row_slices(rows, min_rows, [&](index_t begin, index_t end) {
    std::lock_guard lock(mutex);
    slices.emplace_back(begin, end);
  });
  std::sort(slices.begin(), slices.end());
  return slices;
}

TEST_CASE("row slices follow the shares while every slice keeps its minimum rows") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  set_num_threads(2);
  kernels::cpu::set_fixed_thread_shares({3, 1});
  using slices = std::vector<std::pair<index_t, index_t>>;
  CHECK(row_slices(64, 8) == slices{{0, 48}, {48, 64}});
  CHECK(row_slices(64, 16) == slices{{0, 48}, {48, 64}});
  // 16 rows for the slow thread is under 17: both take half, as with balancing off.
  CHECK(row_slices(64, 17) == slices{{0, 32}, {32, 64}});
  CHECK(row_slices(64, 33) == slices{{0, 64}});  // too few rows for two slices: one thread
  kernels::cpu::set_thread_balancing(false);
  CHECK(row_slices(64, 8) == slices{{0, 32}, {32, 64}});
}

// A static LSTM's batch rows run in slices (policy::cpu::for_batch_slices): split 2:1 or 1:2 they take the one-thread
// run's steps exactly.
TEST_CASE("a static LSTM's losses are the same bits on one thread and on two split unevenly") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  using Net = Sequential<policy::cpu, Input<28, 28>, FinalState<LSTM<128>>, Dense<10>>;
  const auto one = train_losses<Net>(1, {}, 3);
  CHECK(bitwise_equal(train_losses<Net>(2, {2, 1}, 3), one));
  CHECK(bitwise_equal(train_losses<Net>(2, {1, 2}, 3), one));
}
#endif
