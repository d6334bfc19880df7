// The arithmetic of a single-precision matrix product: exact float operands (the default), or operands rounded to
// bfloat16 with the sums kept in float, which is what torch.set_float32_matmul_precision("medium") allows PyTorch's
// CPU products and what policy::cpu_bf16 asks of every product kiln runs. On CPUs with AMX, bfloat16 operands take
// one tile product where float operands take six (gemm_amx.hpp); elsewhere the rounded operands go through the float
// kernels, the same arithmetic at no gain.
#pragma once

#include <bit>
#include <cstdint>

#include "kiln/core/config.hpp"

namespace kiln::kernels::cpu {

// How a single-precision product treats its operands (products in double are always exact).
enum class product_precision {
  single,    // float operands as they are
  bfloat16,  // each operand rounded to bfloat16 (to nearest, ties to even) before it is multiplied; float sums
};

// x rounded to the nearest bfloat16 (ties to even), returned as the float of equal value: 8 significant bits, the
// float's exponent range. Infinities stay, finite values beyond bfloat16's largest round to infinity as IEEE
// rounding does, and a NaN stays a NaN (made quiet, its sign kept).
inline float round_to_bfloat16(float x) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return std::bit_cast<float>((bits | 0x00400000u) & 0xFFFF0000u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

// to = from rounded to bfloat16, for a rows x cols block of floats (row strides ld_from, ld_to).
inline void round_block_to_bfloat16(const float* from, index_t ld_from, index_t rows, index_t cols,
                                    float* KILN_RESTRICT to, index_t ld_to) {
  for (index_t r = 0; r < rows; ++r) {
    const float* src = from + r * ld_from;
    float* dst = to + r * ld_to;
    for (index_t c = 0; c < cols; ++c) dst[c] = round_to_bfloat16(src[c]);
  }
}

}  // namespace kiln::kernels::cpu
