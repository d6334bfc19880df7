// How fast two cores reach each other's caches: a thread pinned to core 0 and one pinned to core 1 pass one cache
// line back and forth (each waits for the other's write, then writes), and then two OpenMP threads meet at barriers,
// once a round. A step split over two threads moves data and meets at barriers between the cores many times, where
// independent work on each core does neither; on this project's shared VMs the round trip went from about 55 ns to
// 340-510 ns for stretches, and the MNIST MLP's two-thread step from 93-112 to 189-193 us with it
// (bench/RESULTS.md), while one thread's step and two independent copies kept their speed.
//
//   core_link [--rounds 10] [--trips 20000] [--pause-ms 700]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../examples/common.hpp"

using namespace kiln;

namespace {

using clock_type = std::chrono::steady_clock;

// Pins the calling thread to `core`; false where the system does not let it.
bool pin_to(int core) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
#else
  (void)core;
  return false;
#endif
}

// Lets the calling thread run on every core again.
void unpin(int cores) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < cores; ++c) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
#else
  (void)cores;
#endif
}

// The mean round trip of `trips` passes of one cache line between cores 0 and 1, in ns.
double round_trip_ns(long long trips, bool& pinned) {
  alignas(64) std::atomic<long long> turn{0};
  std::atomic<bool> partner_pinned{true};
  std::thread partner([&] {
    partner_pinned = pin_to(1);
    for (long long i = 0; i < trips; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  pinned = pin_to(0) && pinned;
  const auto start = clock_type::now();
  for (long long i = 0; i < trips; ++i) {
    turn.store(2 * i + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / double(trips);
  partner.join();
  pinned = pinned && partner_pinned;
  return ns;
}

// The mean time of `count` barriers of a two-thread OpenMP team, in ns (0 without OpenMP).
double barrier_ns(long long count) {
#if defined(_OPENMP)
  const auto start = clock_type::now();
#pragma omp parallel num_threads(2)
  for (long long i = 0; i < count; ++i) {
#pragma omp barrier
  }
  return std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / double(count);
#else
  (void)count;
  return 0;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--rounds", "--trips", "--pause-ms"});
  const long long rounds = flags.get_int("--rounds", 10), trips = flags.get_int("--trips", 20000);
  const long long pause_ms = flags.get_int("--pause-ms", 700);
  if (rounds < 1 || trips < 1 || pause_ms < 0)
    throw kiln::error("core_link: --rounds and --trips: expected 1 or more, --pause-ms 0 or more");
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores < 2) throw kiln::error("core_link: expected 2 or more cores, found " + std::to_string(cores));
  std::printf("kiln core_link: cores 0 and 1, %lld rounds %lld ms apart, each %lld round trips of a cache line and "
              "%lld two-thread OpenMP barriers\n\n| round | round trip, ns | barrier, ns |\n|---:|---:|---:|\n",
              rounds, pause_ms, trips, trips);
  std::vector<double> trip_ns, barrier_times;
  bool pinned = true;
  for (long long r = 0; r < rounds; ++r) {
    trip_ns.push_back(round_trip_ns(trips, pinned));
    unpin(int(cores));
    barrier_times.push_back(barrier_ns(trips));
    std::printf("| %lld | %.0f | %.0f |\n", r, trip_ns.back(), barrier_times.back());
    std::fflush(stdout);
    if (r + 1 < rounds) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  if (!pinned) std::printf("(the threads could not be pinned: the round trips are between whichever cores ran them)\n");
  std::printf("RESULT bench=core_link round_trip_median_ns=%.1f round_trip_min_ns=%.1f round_trip_max_ns=%.1f "
              "barrier_median_ns=%.1f pinned=%d\n",
              median(trip_ns), *std::min_element(trip_ns.begin(), trip_ns.end()),
              *std::max_element(trip_ns.begin(), trip_ns.end()), median(barrier_times), int(pinned));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
