// Restores the process-wide settings that the threading and precision tests change: the thread count, balancing by
// the threads' speeds, fixed shares and the two engines of the bfloat16 path (AMX tiles, AVX512-BF16 dot products).
#pragma once

#include <initializer_list>

#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"

struct thread_settings_guard {
  int threads = kiln::num_threads();
  bool balancing = kiln::kernels::cpu::thread_balancing_active();
  bool amx = kiln::kernels::cpu::amx_gemm_active();
  bool bf16_dot = kiln::kernels::cpu::bf16_dot_gemm_active();
  ~thread_settings_guard() {
    kiln::set_num_threads(threads);
    kiln::kernels::cpu::set_thread_balancing(balancing);
    kiln::kernels::cpu::set_fixed_thread_shares({});
    kiln::kernels::cpu::set_amx_gemm(amx);
    kiln::kernels::cpu::set_bf16_dot_gemm(bf16_dot);
  }
};

// Calls run(engine) once for each engine of the bfloat16 path that is on ("AMX tiles", "AVX512-BF16 dot products")
// with only that one on, and once with both off ("none"); then restores the switches as they were.
template <class Run>
void for_each_bfloat16_engine(Run&& run) {
  namespace cpu = kiln::kernels::cpu;
  // (An engine that is off when this starts, by KILN_AMX=0 or KILN_BF16_DOT=0 in the environment, stays off.)
  const bool has_amx = cpu::amx_gemm_active(), has_dot = cpu::bf16_dot_gemm_active();
  struct engine {
    bool present, amx, dot;
    const char* name;
  };
  for (const engine e : {engine{has_amx, true, false, "AMX tiles"},
                         engine{has_dot, false, true, "AVX512-BF16 dot products"}, engine{true, false, false, "none"}}) {
    if (!e.present) continue;
    cpu::set_amx_gemm(e.amx);
    cpu::set_bf16_dot_gemm(e.dot);
    run(e.name);
  }
  cpu::set_amx_gemm(has_amx);
  cpu::set_bf16_dot_gemm(has_dot);
}
