// Products of bfloat16x3 (product_precision::bfloat16x3, policy::cpu_bf16x3): each operand split into x rounded to
// bfloat16 and the remainder rounded (to nearest, ties away from zero), three piece products summed in float. The split checked bit for bit through
// products with one term per output; the products on AMX tiles against a double reference over the pieces, and
// between single precision and bfloat16 in accuracy; every other route with single precision's bits; a product
// computed as its transpose, on two threads or with its right-hand side packed once, with the same bits; both modes
// under policy::cpu_bf16x3 giving the same bits. Dynamic mode's policy is chosen before kiln is included.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cpu_bf16x3
#include "precision_products.hpp"

#include <string>

using namespace kiln;
using namespace kiln::precision_test;

namespace {

constexpr auto bf16x3 = product_precision::bfloat16x3;

// Values whose split exercises the rounding: random ones, halfway cases of the first rounding (1 + 2^-8) and of the
// second (1 + 2^-10 + 2^-18: a remainder halfway between two bfloat16 values), and their neighbours.
std::vector<float> awkward_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> v = random_values(count, seed);
  for (std::size_t i = 0; i < v.size(); i += 7) v[i] = from_bits(0x3F808000u + std::uint32_t(i % 3) - 1u);
  for (std::size_t i = 3; i < v.size(); i += 11) v[i] = -from_bits(0x3F802020u + std::uint32_t(i % 3) - 1u);
  return v;
}

}  // namespace

TEST_CASE("bfloat16x3 pieces: x rounded to bfloat16, and the remainder rounded, to nearest with ties away from zero") {
  CHECK(bfloat16x3_hi(1.0f) == 1.0f);
  CHECK(bfloat16x3_lo(1.0f) == 0.0f);
  CHECK(bfloat16x3_hi(1.0f + 0x1p-8f) == 1.0f + 0x1p-7f);  // a tie: away from zero (round_to_bfloat16 gives 1)
  CHECK(bfloat16x3_lo(1.0f + 0x1p-8f) == -0x1p-8f);        // and the remainder exact
  CHECK(bfloat16x3_hi(-(1.0f + 0x1p-8f)) == -(1.0f + 0x1p-7f));
  // 1 + 2^-10 + 2^-18: hi 1, the remainder 2^-10 (1 + 2^-8) a tie, away from zero to 2^-10 (1 + 2^-7).
  CHECK(bfloat16x3_hi(1.0f + 0x1p-10f + 0x1p-18f) == 1.0f);
  CHECK(bfloat16x3_lo(1.0f + 0x1p-10f + 0x1p-18f) == 0x1p-10f + 0x1p-17f);
  CHECK(bfloat16x3_hi(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // past the tie: up
  CHECK(bfloat16x3_hi(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);            // short of it: down
  CHECK(bfloat16x3_hi(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(bfloat16x3_hi(from_bits(0x7F7F0000u)) == from_bits(0x7F7F0000u));
  CHECK(bfloat16x3_hi(from_bits(0x00008000u)) == from_bits(0x00010000u));  // subnormals round alike
  // Two pieces keep about 16 significant bits: within 2^-16 of x, for values of every binade.
  random_generator rng(5);
  for (int i = 0; i < 1000; ++i) {
    const float v = std::ldexp(rng.uniform<float>(1.0f, 2.0f), int(rng.below(60)) - 30);
    CHECK(std::abs(double(bfloat16x3_hi(v)) + bfloat16x3_lo(v) - v) <= std::ldexp(double(v), -16));
  }
  CHECK(std::string(kernels::cpu::product_precision_name(bf16x3)) == "bf16x3");
}

TEST_CASE("a bfloat16x3 product with one term per output gives each operand's two pieces summed" *
          doctest::skip(no_amx)) {
  // One operand holds one 1 per row (or column), so that every output is hi + lo of one element of the other, as
  // the packing split it: bit for bit, halfway cases included, whichever operand and whichever way it is stored.
  const index_t m = 48, n = 128, k = 160;  // n * k >= 128^2: on the tiles
  const std::vector<float> values_a = awkward_values(std::size_t(m * k), 21);
  const std::vector<float> values_b = awkward_values(std::size_t(k * n), 11);
  for (const bool ones_in_a : {true, false}) {
    for (const bool transposed : {false, true}) {  // the random operand stored the other way round
      CAPTURE(ones_in_a);
      CAPTURE(transposed);
      const bool ta = !ones_in_a && transposed, tb = ones_in_a && transposed;
      std::vector<float> a(std::size_t(m * k), 0.0f), b(std::size_t(k * n), 0.0f), c(std::size_t(m * n));
      for (index_t i = 0; i < m; ++i)
        for (index_t p = 0; p < k; ++p) {
          const float v = ones_in_a ? (p == (i * 37) % k ? 1.0f : 0.0f) : values_a[std::size_t(i * k + p)];
          a[std::size_t(ta ? p * m + i : i * k + p)] = v;
        }
      for (index_t p = 0; p < k; ++p)
        for (index_t j = 0; j < n; ++j) {
          const float v = ones_in_a ? values_b[std::size_t(p * n + j)] : (p == (j * 29) % k ? 1.0f : 0.0f);
          b[std::size_t(tb ? j * k + p : p * n + j)] = v;
        }
      kernels::cpu::gemm<float>(ta, tb, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0f, c.data(), n,
                                {}, bf16x3);
      int differing = 0;
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          const float v = ones_in_a ? values_b[std::size_t(((i * 37) % k) * n + j)]
                                    : values_a[std::size_t(i * k + (j * 29) % k)];
          const float expected = bfloat16x3_hi(v) + bfloat16x3_lo(v);  // exact in float
          differing += std::memcmp(&expected, &c[std::size_t(i * n + j)], sizeof(float)) != 0;
        }
      CHECK(differing == 0);
    }
  }
}

TEST_CASE("bfloat16x3: float sums of the piece products on AMX tiles, between single precision and bfloat16; "
          "single precision's bits elsewhere") {
  for_every_route(bf16x3, [](const product& pr, const epilogue<float>& ep, float beta, bool on_tiles) {
    const auto out = pr.run(bf16x3, ep, beta);
    const auto single = pr.run(product_precision::single, ep, beta);
    if (on_tiles) {
      // Against the piece products: a float dot product's error. Against the operands themselves: about 16 bits,
      // far closer than bfloat16 operands (2^-8 each) and further than single precision (here about 1e-6 of the
      // terms' magnitudes, against 1e-7 for single precision).
      CHECK(pr.worst_error(out, bf16x3, ep, beta) <= 2e-7 * double(pr.k + 2));
      const double error = pr.worst_error(out, product_precision::single, ep, beta);
      CHECK(error <= 1e-5);
      CHECK(error > 4 * pr.worst_error(single, product_precision::single, ep, beta));
      CHECK(error * 30 <
            pr.worst_error(pr.run(product_precision::bfloat16, ep, beta), product_precision::single, ep, beta));
    } else {  // too small for the tiles, or no tiles: single precision, bit for bit
      CHECK(std::memcmp(out.data(), single.data(), out.size() * sizeof(float)) == 0);
    }
  });
}

TEST_CASE("a bfloat16x3 product computed as its transpose, on two threads, or with B packed once: the same bits") {
  // B stored n x k with fewer rows than columns (a Dense layer's forward) runs as C^T = B A^T, with the piece products
  // in the mirrored order; B stored k x n runs directly. Each element must add the same products in the same order.
  const auto [transposed, direct] = forward_as_stored_both_ways();
  const epilogue<float> fused{transposed.bias.data(), activation::relu};
  const auto one = transposed.run(bf16x3, fused, 0.5f);
  const auto straight = direct.run(bf16x3, fused, 0.5f);
  CHECK(std::memcmp(one.data(), straight.data(), one.size() * sizeof(float)) == 0);

  const index_t saved_threads = num_threads();
  set_num_threads(2);
  const auto two = transposed.run(bf16x3, fused, 0.5f);
  set_num_threads(saved_threads);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);

  check_prepacked_b_has_gemm_bits(bf16x3);
}

TEST_CASE("policy::cpu_bf16x3 trains a static MLP as dynamic mode does, bit for bit, near policy::cpu's losses") {
  check_mlp_in_both_modes<policy::cpu_bf16x3>(1e-4f);
}

TEST_CASE("policy::cpu_bf16x3 runs convolutions and recurrent layers in both modes with the same bits") {
  check_cnn_and_lstm_in_both_modes<policy::cpu_bf16x3>();
}

TEST_CASE("set_default_product_precision switches policy::cpu to bfloat16x3 and back") {
  check_global_switch<policy::cpu_bf16x3>();
}

TEST_CASE("a NaN in a bfloat16x3 operand, whatever its payload, reaches the outputs it touches" *
          doctest::skip(no_amx)) {
  // Rounding adds half a bfloat16 step to the bits: a NaN whose payload fills its low bits would carry into the sign
  // and read as zero, were it not kept a NaN.
  for (const std::uint32_t bits : {0x7FC00000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F800001u}) {
    CAPTURE(bits);
    product pr(false, true, 64, 128, 784, 17);
    pr.a[std::size_t(5 * pr.lda + 300)] = from_bits(bits);  // row 5 of A
    pr.b[std::size_t(9 * pr.ldb + 100)] = from_bits(bits);  // column 9 of op(B)
    const auto out = pr.run(bf16x3, {}, 0.0f);
    int wrong = 0;
    for (index_t i = 0; i < pr.m; ++i)
      for (index_t j = 0; j < pr.n; ++j)
        wrong += std::isnan(out[std::size_t(i * pr.ldc + j)]) != (i == 5 || j == 9);
    CHECK(wrong == 0);
  }
}
