// kiln's run-time switches and settings, all in one place: the only code of the library that reads the environment.
//
// A switch turns one kernel path on or off for every later call. Each starts from its environment variable ("0"
// starts it off; anything else, or nothing, leaves the default) and is changed from the program by set_switch, or by
// the setter beside its kernel (set_amx_gemm, set_sparse_input_products, ...), which sets the same switch. The settings
// that are not on/off are read through environment_setting: KILN_PRODUCT_PRECISION (kernels/cpu/product_precision.hpp)
// and KILN_DATA (data/find_data.hpp).
//
//   kiln::set_switch(kiln::run_switch::sparse_input, false);   // every later Dense product takes the GEMM
//   for (const auto& s : kiln::run_switches)
//     std::printf("%s=%d: %s\n", s.environment, kiln::switch_on(s.id), s.chooses);
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <iterator>

namespace kiln {

enum class run_switch { amx, bf16_dot, sparse_input, sparse_gradient, thread_balance };

// One switch: its environment variable, its default and what it chooses.
struct run_switch_info {
  run_switch id;
  const char* environment;
  bool default_on;
  const char* chooses;
};

// Every switch, in run_switch's order.
inline constexpr run_switch_info run_switches[] = {
    {run_switch::amx, "KILN_AMX", true,
     "single-precision and bfloat16 products on Intel AMX tiles, where the CPU has them and Linux grants them"},
    {run_switch::bf16_dot, "KILN_BF16_DOT", true,
     "bfloat16 products on AVX512-BF16 dot products, on CPUs that have them and no AMX"},
    {run_switch::sparse_input, "KILN_SPARSE_INPUT", true,
     "Dense products that skip the elements of an input equal to its background value (inputs mostly one value), "
     "on the policies that take them (policy::cpu_sparse_input)"},
    {run_switch::sparse_gradient, "KILN_SPARSE_GRADIENT", true,
     "convolution gradients that skip zero output gradients (after a ReLU); the same bits as the dense path"},
    {run_switch::thread_balance, "KILN_BALANCE", true,
     "the fused MLP step's shares of the hidden units by the threads' measured speeds instead of equal shares"},
};

// The environment's value of one of kiln's settings, or null when it is not set.
inline const char* environment_setting(const char* name) { return std::getenv(name); }

namespace switches_detail {
inline constexpr std::size_t count = std::size(run_switches);
static_assert([] {
  for (std::size_t i = 0; i < count; ++i)
    if (static_cast<std::size_t>(run_switches[i].id) != i) return false;
  return true;
}(), "run_switches lists the switches in run_switch's order");

// The switches' states, each from its environment variable at the first use of any.
struct states {
  std::atomic<bool> on[count];
  states() {
    for (std::size_t i = 0; i < count; ++i) {
      const char* value = environment_setting(run_switches[i].environment);
      const bool off = value && value[0] == '0' && value[1] == '\0';
      on[i].store(run_switches[i].default_on && !off, std::memory_order_relaxed);
    }
  }
};
inline std::atomic<bool>& state(run_switch s) {
  static states all;
  return all.on[static_cast<std::size_t>(s)];
}
}  // namespace switches_detail

inline bool switch_on(run_switch s) { return switches_detail::state(s).load(std::memory_order_relaxed); }
inline void set_switch(run_switch s, bool on) { switches_detail::state(s).store(on, std::memory_order_relaxed); }
inline const run_switch_info& switch_info(run_switch s) { return run_switches[static_cast<std::size_t>(s)]; }

}  // namespace kiln
