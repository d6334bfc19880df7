// The arithmetic of a single-precision matrix product: exact float operands (the default), or, where bfloat16 pays,
// operands rounded to bfloat16 with the sums kept in float. That is what torch.set_float32_matmul_precision("medium")
// allows PyTorch's products: bfloat16 where the hardware makes it faster, single precision elsewhere. kiln's products
// that run on AMX tiles (gemm_amx.hpp: Sapphire Rapids and later, products of at least 16 rows with n * k >= 128^2)
// then take one tile product where float operands take six; on CPUs with AVX512-BF16 but no AMX (Zen 4, Cooper Lake)
// the same products of bfloat16 operands run on its dot products (gemm_bf16_dot.hpp), at twice the float FMAs' flop
// per instruction. Smaller products, and every product on CPUs with neither, stay single precision, since rounding
// their operands would only add work. Between the two, bfloat16x3 is
// set_float32_matmul_precision("high") on such CPUs: each operand the sum of two bfloat16 values (about 16
// significant bits) and three tile products. policy::cpu takes the precision set by set_default_product_precision
// (single unless set), so that one switch, or KILN_PRODUCT_PRECISION in the environment, changes a whole program;
// policy::cpu_bf16 and policy::cpu_bf16x3 fix one in the type.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"

namespace kiln::kernels::cpu {

// How a single-precision product treats its operands (products in double are always exact).
enum class product_precision {
  single,      // float operands as they are
  bfloat16,    // on AMX tiles or AVX512-BF16, each operand rounded to bfloat16 (to nearest, ties to even); float sums
  bfloat16x3,  // on AMX tiles, each operand as hi + lo, two bfloat16 values (each rounded to nearest, ties away from
               // zero): hi*hi + lo*hi + hi*lo in float sums
};

// The precision's name as KILN_PRODUCT_PRECISION and the examples' --precision flag spell it.
inline const char* product_precision_name(product_precision precision) {
  switch (precision) {
    case product_precision::bfloat16: return "bf16";
    case product_precision::bfloat16x3: return "bf16x3";
    case product_precision::single: break;
  }
  return "single";
}

namespace product_precision_detail {
// policy::cpu's precision: set_default_product_precision, initialised from KILN_PRODUCT_PRECISION ("bfloat16" or
// "bf16" ask for bfloat16 operands, "bfloat16x3" or "bf16x3" for bfloat16x3; anything else, or nothing, is single
// precision).
inline std::atomic<product_precision>& default_precision() {
  static std::atomic<product_precision> precision{[] {
    const char* env = environment_setting("KILN_PRODUCT_PRECISION");
    const auto is = [env](const char* name) { return env && std::strcmp(env, name) == 0; };
    if (is("bfloat16") || is("bf16")) return product_precision::bfloat16;
    if (is("bfloat16x3") || is("bf16x3")) return product_precision::bfloat16x3;
    return product_precision::single;
  }()};
  return precision;
}
}  // namespace product_precision_detail

// Sets the precision of policy::cpu's single-precision products from now on, in both modes, as PyTorch's global
// torch.set_float32_matmul_precision does ("highest" is single, "high" bfloat16x3, "medium" bfloat16).
// policy::cpu_bf16 and policy::cpu_bf16x3 keep their own. Set it between steps, not while a product runs: a layer that
// packs an operand once (a recurrent layer's W_hh) packs it for the precision of the moment.
inline void set_default_product_precision(product_precision precision) {
  product_precision_detail::default_precision().store(precision, std::memory_order_relaxed);
}
// The precision policy::cpu's products now take (single unless set, or asked for by KILN_PRODUCT_PRECISION).
inline product_precision default_product_precision() {
  return product_precision_detail::default_precision().load(std::memory_order_relaxed);
}

// x rounded to the nearest bfloat16 (ties to even), returned as the float of equal value: 8 significant bits, the
// float's exponent range. Infinities stay, finite values beyond bfloat16's largest round to infinity as IEEE
// rounding does, and a NaN stays a NaN (made quiet, its sign kept).
inline float round_to_bfloat16(float x) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return std::bit_cast<float>((bits | 0x00400000u) & 0xFFFF0000u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

}  // namespace kiln::kernels::cpu
