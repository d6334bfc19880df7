// Small helpers shared by the examples: command-line flags and a steady clock.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/product_precision.hpp"

namespace kiln::examples {

// Reads "--name value" flags (and "--name" switches). Every example accepts --threads N, and --precision
// single|bf16x3|bf16, which the constructor applies to the whole program: the precision of policy::cpu's
// single-precision products (kernels::cpu::set_default_product_precision; bf16 rounds their operands to bfloat16,
// bf16x3 splits each into two bfloat16 values). A program names the other
// flags it takes; any other "--" argument, a flag without its value, or a number that does not parse is a kiln::error
// that says so (a mistyped "--epoch 10" would otherwise run the default silently).
class flags {
 public:
  flags(int argc, char** argv, std::initializer_list<const char*> known) : argc_(argc), argv_(argv) {
    known_.push_back("--threads");
    known_.push_back("--precision");
    known_.insert(known_.end(), known.begin(), known.end());
    for (int i = 1; i < argc_; ++i) {
      if (std::strncmp(argv_[i], "--", 2) != 0) continue;
      if (std::find_if(known_.begin(), known_.end(), [&](const char* k) { return std::strcmp(k, argv_[i]) == 0; }) ==
          known_.end()) {
        std::string list;
        for (const char* k : known_) list += std::string(list.empty() ? "" : ", ") + k;
        throw kiln::error(std::string(argv_[0]) + ": unknown flag '" + argv_[i] + "'; this program takes " + list);
      }
    }
    const std::string precision = get("--precision", "");
    using kernels::cpu::product_precision;
    if (precision == "bf16" || precision == "bfloat16")
      kernels::cpu::set_default_product_precision(product_precision::bfloat16);
    else if (precision == "bf16x3" || precision == "bfloat16x3")
      kernels::cpu::set_default_product_precision(product_precision::bfloat16x3);
    else if (precision == "single" || precision == "float32")
      kernels::cpu::set_default_product_precision(product_precision::single);
    else if (!precision.empty())
      throw kiln::error("--precision: expected single, bf16x3 or bf16, found '" + precision + "'");
  }
  std::string get(const char* name, const std::string& fallback) const {
    for (int i = 1; i < argc_; ++i)
      if (std::strcmp(argv_[i], name) == 0) {
        if (i + 1 >= argc_) throw kiln::error(std::string(name) + ": expected a value after the flag, found none");
        return argv_[i + 1];
      }
    return fallback;
  }
  long long get_int(const char* name, long long fallback) const {
    return get_number<long long>(name, fallback, "an integer");
  }
  double get_double(const char* name, double fallback) const { return get_number<double>(name, fallback, "a number"); }
  bool has(const char* name) const {
    for (int i = 1; i < argc_; ++i)
      if (std::strcmp(argv_[i], name) == 0) return true;
    return false;
  }

 private:
  template <class N>
  N get_number(const char* name, N fallback, const char* expected) const {
    const std::string v = get(name, "");
    if (v.empty()) return fallback;
    N value = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
    if (ec != std::errc() || end != v.data() + v.size())
      throw kiln::error(std::string(name) + ": expected " + expected + ", found '" + v + "'");
    return value;
  }

  int argc_;
  char** argv_;
  std::vector<const char*> known_;
};

// What policy::cpu's single-precision products run on now, for a program's first line: "single-precision products on
// AMX tiles", "products of bfloat16 operands on AMX tiles" (or "on AVX512-BF16 dot products" on CPUs without tiles),
// or the same on AVX-512/AVX2 FMAs.
inline std::string products_description() {
  using kernels::cpu::product_precision;
  const product_precision precision = kernels::cpu::default_product_precision();
  std::string text = precision == product_precision::bfloat16     ? "products of bfloat16 operands (--precision bf16)"
                     : precision == product_precision::bfloat16x3 ? "products of bfloat16x3 (--precision bf16x3)"
                                                                  : "single-precision products";
  text.append(kernels::cpu::amx_gemm_active()                  ? " on AMX tiles"
              : kernels::cpu::bfloat16_path_active(precision) ? " on AVX512-BF16 dot products"
                                                              : " on AVX-512/AVX2 FMAs");
  return text;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kiln::examples
