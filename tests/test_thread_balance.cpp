// The split of parallel work by the threads' speeds (thread_balance.hpp, which the fused MLP step's trainer keeps): its
// arithmetic and how the shares learn from finishing times. That the split changes no result: test_fused_mlp.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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
