// Splits a parallel loop's work over the threads by their recent speed instead of equally.
//
// On a shared machine a core's speed changes under the program. On this project's two-vCPU VMs either core runs at
// about half speed for stretches of milliseconds to seconds (bench/core_speed; presumably another tenant on the host's
// sibling hyper-thread), and an equal split then waits for the slow core while the fast one idles: a step of short
// parallel loops runs at the pace of the slower core, sometimes slower on two threads than on one
// (docs/benchmarks.md). A hybrid CPU's performance and efficiency cores differ the same way, for good. A thread_balance keeps each thread's
// share of one kind of work, and after every parallel run moves the shares toward equal finishing times: a thread that
// finished late gets less next time. The shares move by a fraction per run, so that one interrupted run does not swing
// them, and never fall below half of an equal share; shares within 8% of equal split equally, so that cores running
// alike keep the same boundaries from run to run.
//
// Results do not depend on the split: every kernel that splits this way computes each element by the same code
// whichever thread runs it, so one thread, two equal halves and any balanced split give the same bits.
// set_thread_balancing(false), or KILN_BALANCE=0 in the environment, splits equally.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"
#include "kiln/core/error.hpp"

namespace kiln::kernels::cpu {

// The split of one parallel run: thread `id` of `team` takes units [begin(units, id), begin(units, id + 1)).
struct thread_split {
  static constexpr int max_threads = 64;
  int team = 1;
  std::array<float, max_threads + 1> starts{};  // starts[i]: the fraction of the work before thread i's

  index_t begin(index_t units, int id) const {
    if (id <= 0) return 0;
    if (id >= team) return units;
    return std::min(units, index_t(std::lround(double(starts[id]) * double(units))));
  }
  index_t end(index_t units, int id) const { return begin(units, id + 1); }
  // The split of one dimension shared by `parts` threads: this one where they are all of its team, equal otherwise
  // (a grid's dimension, or a team smaller than planned).
  thread_split over(int parts) const { return parts == team ? *this : equal(parts); }

  static thread_split equal(int team) {
    thread_split s;
    s.team = std::clamp(team, 1, max_threads);
    for (int i = 0; i <= s.team; ++i) s.starts[i] = float(i) / float(s.team);
    return s;
  }
};

namespace balance_detail {

// Whether the user allows balancing: the switch run_switch::thread_balance (core/switches.hpp, KILN_BALANCE), which
// set_thread_balancing sets.
inline std::atomic<bool>& balancing_allowed() { return switches_detail::state(run_switch::thread_balance); }

// Shares fixed by set_fixed_thread_shares, normalised; empty when none are.
struct fixed_shares {
  std::mutex mutex;
  std::vector<double> shares;
};
inline fixed_shares& fixed() {
  static fixed_shares f;
  return f;
}

}  // namespace balance_detail

// Turns balancing on or off for every later parallel run (on by default; KILN_BALANCE=0 starts it off). Off, every
// balanced loop splits its work equally, as it did before balancing.
inline void set_thread_balancing(bool enabled) {
  balance_detail::balancing_allowed().store(enabled, std::memory_order_relaxed);
}

inline bool thread_balancing_active() { return balance_detail::balancing_allowed().load(std::memory_order_relaxed); }

// Fixes the threads' shares instead of learning them, for a machine whose cores differ for good (a hybrid CPU's
// performance and efficiency cores) and for tests: thread i of a team of shares.size() threads takes shares[i] of
// every balanced loop's work (relative weights, each > 0). Teams of another size, and an empty vector (the default),
// go back to the learned shares. A bad weight is a kiln::error naming it.
inline void set_fixed_thread_shares(const std::vector<double>& shares) {
  if (shares.size() > std::size_t(thread_split::max_threads))
    throw error("set_fixed_thread_shares: expected at most " + std::to_string(thread_split::max_threads) +
                " threads' weights, found " + std::to_string(shares.size()));
  double total = 0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    if (!(shares[i] > 0) || !std::isfinite(shares[i]))
      throw error("set_fixed_thread_shares: expected positive finite weights, found " + std::to_string(shares[i]) +
                  " for thread " + std::to_string(i));
    total += shares[i];
  }
  auto& f = balance_detail::fixed();
  std::lock_guard lock(f.mutex);
  f.shares.clear();
  for (double w : shares) f.shares.push_back(w / total);
}

// The finishing times of one parallel run, each thread writing its own: seconds since `start`, taken by the thread
// that opened the run, so that a thread woken late counts its wait; and the size of the team that ran it.
struct run_clock {
  using clock = std::chrono::steady_clock;
  clock::time_point start = clock::now();
  std::array<double, thread_split::max_threads> seconds{};
  int team = 0;

  void finish(int id, int team_size) {
    if (id == 0) team = team_size;
    if (id >= 0 && id < thread_split::max_threads)
      seconds[id] = std::chrono::duration<double>(clock::now() - start).count();
  }
};

// One kind of parallel work's shares (one per call site: the AMX products, the blocked products, an element-wise
// loop). Safe to use from several threads at once.
class thread_balance {
 public:
  // How much of the distance to the run's ideal shares each run moves them.
  static constexpr double step = 0.125;
  // Shares within this fraction of an equal share all round split equally.
  static constexpr double equal_band = 0.08;

  // The split for a team of `team` threads: the kept shares, or equal ones where balancing is off or the team size
  // differs from the last recorded run's.
  thread_split split(int team) const;
  // The same for `units` units of which every thread must get at least min_units (a kernel that takes another path
  // below them, or a part that must not be empty): an equal split where the kept shares would leave any thread fewer.
  thread_split split(int team, index_t units, index_t min_units) const {
    const thread_split balanced = split(team);
    for (int id = 0; id < team; ++id)
      if (balanced.end(units, id) - balanced.begin(units, id) < min_units) return thread_split::equal(team);
    return balanced;
  }

  // Records a run of `units` units split by `used` whose threads finished at `clock.seconds`: each thread's speed is
  // the work it did over its time, and the shares move toward those speeds' proportions. A run where some thread had
  // nothing to do says nothing about that thread's speed, and is not recorded; nor is one whose team was smaller
  // than planned, which split equally (thread_split::over).
  void record(const thread_split& used, index_t units, const run_clock& clock);

 private:
  static thread_split from_shares(const double* shares, int team) {
    thread_split s;
    s.team = team;
    double sum = 0;
    for (int i = 0; i < team; ++i) {
      s.starts[i] = float(sum);
      sum += shares[i];
    }
    s.starts[team] = 1.0f;
    return s;
  }

  mutable std::mutex mutex_;
  int team_ = 0;
  std::array<double, thread_split::max_threads> shares_{};
};
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION void thread_balance::record(const thread_split& used, index_t units, const run_clock& clock) {
  const int team = used.team;
  if (!thread_balancing_active() || team <= 1 || team > thread_split::max_threads || units <= 0 ||
      clock.team != team)
    return;
  std::array<double, thread_split::max_threads> speed{};
  double speed_sum = 0;
  for (int i = 0; i < team; ++i) {
    const index_t work = used.end(units, i) - used.begin(units, i);
    if (work <= 0) return;
    speed[i] = double(work) / double(units) / std::max(clock.seconds[i], 1e-9);
    speed_sum += speed[i];
  }
  std::lock_guard lock(mutex_);
  if (team != team_) {
    team_ = team;
    std::fill(shares_.begin(), shares_.begin() + team, 1.0 / team);
  }
  // Both the shares and their targets sum to 1, and so does every step between them.
  for (int i = 0; i < team; ++i) shares_[i] += step * (speed[i] / speed_sum - shares_[i]);
  // Shares below the floor are raised to it, and the others give up what that takes, in proportion; which may
  // bring another to the floor, hence the rounds (at most one per thread).
  const double floor = 0.5 / team;
  for (int round = 0; round < team; ++round) {
    double floored = 0, free = 0;
    bool below = false;
    for (int i = 0; i < team; ++i) {
      below |= shares_[i] < floor;
      if (shares_[i] <= floor) floored += floor;
      else free += shares_[i];
    }
    if (!below) break;
    for (int i = 0; i < team; ++i) shares_[i] = shares_[i] <= floor ? floor : shares_[i] * (1 - floored) / free;
  }
}
#endif
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION thread_split thread_balance::split(int team) const {
  if (!thread_balancing_active() || team <= 1 || team > thread_split::max_threads)
    return thread_split::equal(team);
  {
    auto& f = balance_detail::fixed();
    std::lock_guard lock(f.mutex);
    if (f.shares.size() == std::size_t(team)) return from_shares(f.shares.data(), team);
  }
  std::lock_guard lock(mutex_);
  if (team != team_) return thread_split::equal(team);
  // Shares near equal are taken as equal: timing noise keeps them a few percent off even when the cores run alike,
  // and a split that wanders by a few percent moves the boundary between the threads' parts from run to run, so
  // that a product's output rows and the update after it no longer meet on the same core.
  bool near_equal = true;
  for (int i = 0; i < team; ++i) near_equal &= std::abs(shares_[i] * team - 1.0) < equal_band;
  if (near_equal) return thread_split::equal(team);
  return from_shares(shares_.data(), team);
}
#endif

}  // namespace kiln::kernels::cpu
