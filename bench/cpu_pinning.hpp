// Pinning a bench's threads to CPUs (Linux), shared by bench/thread_scaling and bench/core_link.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <string>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln::bench {

// The CPUs this process may run on, in order.
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Pins the calling thread to `cpu`, or lets it run on all of `cpus` again (cpu -1); `program` names the bench in the
// error where the system refuses.
inline void pin_to(int cpu, const std::vector<int>& cpus, const char* program) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu >= 0) CPU_SET(cpu, &set);
  else
    for (int c : cpus) CPU_SET(c, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0) return;
  if (cpu >= 0) throw kiln::error(std::string(program) + ": could not pin the thread to CPU " + std::to_string(cpu));
  std::string listed;
  for (int c : cpus) {
    if (!listed.empty()) listed += ',';
    listed += std::to_string(c);
  }
  throw kiln::error(std::string(program) + ": could not let the thread run on CPUs " + listed + " again");
}

}  // namespace kiln::bench
