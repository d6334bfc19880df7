// Restores the process-wide settings that the threading tests change: the thread count, balancing by the threads'
// speeds, fixed shares and the AMX path.
#pragma once

#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"

struct thread_settings_guard {
  int threads = kiln::num_threads();
  bool balancing = kiln::kernels::cpu::thread_balancing_active();
  bool amx = kiln::kernels::cpu::amx_gemm_active();
  ~thread_settings_guard() {
    kiln::set_num_threads(threads);
    kiln::kernels::cpu::set_thread_balancing(balancing);
    kiln::kernels::cpu::set_fixed_thread_shares({});
    kiln::kernels::cpu::set_amx_gemm(amx);
  }
};
