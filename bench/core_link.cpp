// How fast two cores reach each other's caches: a thread pinned to the first CPU the process may run on and one pinned
// to the second pass one cache line back and forth (each waits for the other's write, then writes), and then two OpenMP
// threads meet at barriers, once a round. A step split over two threads moves data and meets at barriers between the
// cores many times, where independent work on each core does neither; on this project's shared VMs the round trip went
// from about 55 ns to 340-510 ns for stretches, and the MNIST MLP's two-thread step from 93-112 to 189-193 us with it
// (docs/benchmarks.md), while one thread's step and two independent copies kept their speed.
//
//   core_link [--rounds 10] [--trips 20000] [--pause-ms 700]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../examples/common.hpp"
#include "cpu_pinning.hpp"

using namespace kiln;

namespace {

using clock_type = std::chrono::steady_clock;

// The mean round trip of `trips` passes of one cache line between CPUs `first` and `second`, in ns; the calling
// thread is left pinned to `first`.
double round_trip_ns(long long trips, int first, int second, const std::vector<int>& cpus) {
  alignas(64) std::atomic<long long> turn{0};
  std::exception_ptr partner_error;
  std::thread partner([&] {
    // A failed pin is reported after the passes, which run anyway: the calling thread waits on every one of them.
    try {
      bench::pin_to(second, cpus, "core_link");
    } catch (...) {
      partner_error = std::current_exception();
    }
    for (long long i = 0; i < trips; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::exception_ptr own_error;
  try {
    bench::pin_to(first, cpus, "core_link");
  } catch (...) {
    own_error = std::current_exception();
  }
  const auto start = clock_type::now();
  for (long long i = 0; i < trips; ++i) {
    turn.store(2 * i + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / double(trips);
  partner.join();
  if (own_error) std::rethrow_exception(own_error);
  if (partner_error) std::rethrow_exception(partner_error);
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
  const std::vector<int> cpus = bench::allowed_cpus();
  if (cpus.size() < 2)
    throw kiln::error("core_link: expected 2 or more CPUs to run on, found " + std::to_string(cpus.size()));
  std::printf("kiln core_link: CPUs %d and %d, %lld rounds %lld ms apart, each %lld round trips of a cache line and "
              "%lld two-thread OpenMP barriers\n\n| round | round trip, ns | barrier, ns |\n|---:|---:|---:|\n",
              cpus[0], cpus[1], rounds, pause_ms, trips, trips);
  std::vector<double> trip_ns, barrier_times;
  for (long long r = 0; r < rounds; ++r) {
    trip_ns.push_back(round_trip_ns(trips, cpus[0], cpus[1], cpus));
    bench::pin_to(-1, cpus, "core_link");
    barrier_times.push_back(barrier_ns(trips));
    std::printf("| %lld | %.0f | %.0f |\n", r, trip_ns.back(), barrier_times.back());
    std::fflush(stdout);
    if (r + 1 < rounds) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  std::printf("RESULT bench=core_link round_trip_median_ns=%.1f round_trip_min_ns=%.1f round_trip_max_ns=%.1f "
              "barrier_median_ns=%.1f\n",
              median(trip_ns), *std::min_element(trip_ns.begin(), trip_ns.end()),
              *std::max_element(trip_ns.begin(), trip_ns.end()), median(barrier_times));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
