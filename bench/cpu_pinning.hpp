// Pinning a bench's threads to CPUs (Linux), shared by bench/thread_scaling and bench/core_link, and a competing load
// for a bench to run beside itself.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Another process that spins on one CPU for as long as this object lives: the load of a machine shared with other
// work, which a bench runs itself so that a measurement under load is one command. The process is started before
// the bench's own threads exist (construct it first), dies with the bench (PR_SET_PDEATHSIG) and is killed when the
// object goes.
class competing_load {
 public:
  competing_load(int cpu, const char* program) {
    pid_ = ::fork();
    if (pid_ < 0) throw kiln::error(std::string(program) + ": could not start the competing load (fork failed)");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) ::_exit(1);
      volatile unsigned long spin = 0;
      for (;;) spin = spin + 1;
    }
  }
  competing_load(const competing_load&) = delete;
  competing_load& operator=(const competing_load&) = delete;
  ~competing_load() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace kiln::bench
