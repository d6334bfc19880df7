// Products of bfloat16 operands (product_precision::bfloat16, policy::cpu_bf16): rounding to nearest with ties to
// even; the products on the bfloat16 path (AMX tiles, or AVX512-BF16 dot products where there are no tiles) against a
// double reference over the rounded operands, every other route with single precision's bits; prepacked right-hand
// sides, products computed as their transpose and in parts; both modes under policy::cpu_bf16 giving the same bits.
// The checks that bfloat16 changed a result are skipped where the CPU has neither engine (there nothing changes).
// Dynamic mode's policy is chosen before kiln is included, for this whole program.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cpu_bf16
#include "precision_products.hpp"

using namespace kiln;
using namespace kiln::precision_test;

namespace {
constexpr auto bf16 = product_precision::bfloat16;
}  // namespace

TEST_CASE("rounding to bfloat16: to nearest, ties to even, infinities and NaN kept") {
  CHECK(round_to_bfloat16(1.0f) == 1.0f);
  CHECK(round_to_bfloat16(1.0f + 0x1p-8f) == 1.0f);                            // a tie, down to the even 1
  CHECK(round_to_bfloat16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);              // a tie, up to the even neighbour
  CHECK(round_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);       // past the tie: up
  CHECK(round_to_bfloat16(-(1.0f + 0x1p-8f + 0x1p-20f)) == -(1.0f + 0x1p-7f));  // the same below zero
  CHECK(round_to_bfloat16(0.1f) == from_bits(0x3DCD0000u));
  CHECK(round_to_bfloat16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bfloat16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bfloat16(from_bits(0x7F7F0000u)) == from_bits(0x7F7F0000u));  // bfloat16's largest stays
  const float nan = round_to_bfloat16(from_bits(0xFFFFFFFFu));
  CHECK(std::isnan(nan));
  CHECK(std::signbit(nan));
  CHECK(std::isnan(round_to_bfloat16(from_bits(0x7F800001u))));  // a signalling NaN whose payload is all low bits
  CHECK((std::bit_cast<std::uint32_t>(round_to_bfloat16(0.3f)) & 0xFFFFu) == 0u);
}

TEST_CASE("a product with one term per output on the bfloat16 path gives each operand rounded" *
          doctest::skip(!rounds_products(bf16))) {
  // A holds one 1 per row, so that every output is one element of B rounded: the rounding the packing does must be
  // round_to_bfloat16's, bit for bit, halfway cases included, whichever way B is stored.
  const index_t m = 48, n = 128, k = 160;  // n * k >= 128^2: on the tiles
  std::vector<float> b_values = random_values(std::size_t(k * n), 11);
  // Halfway cases (0x3F808000: ties to the even 1) and their neighbours. (No infinities: the zeros of A would make
  // NaN of them in every other row.)
  for (std::size_t i = 0; i < b_values.size(); i += 7) b_values[i] = from_bits(0x3F808000u + std::uint32_t(i % 3));
  b_values[9] = from_bits(0x3F818000u);  // a tie up to the even neighbour
  for (const bool tb : {false, true}) {  // B stored n x k is packed through 16 x 16 transposes
    CAPTURE(tb);
    std::vector<float> a(std::size_t(m * k), 0.0f), b(std::size_t(k * n)), c(std::size_t(m * n));
    for (index_t i = 0; i < m; ++i) a[std::size_t(i * k + (i * 37) % k)] = 1.0f;
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j) b[std::size_t(tb ? j * k + p : p * n + j)] = b_values[std::size_t(p * n + j)];
    kernels::cpu::gemm<float>(false, tb, m, n, k, 1.0f, a.data(), k, b.data(), tb ? k : n, 0.0f, c.data(), n, {},
                              bf16);
    int differing = 0;
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        const float expected = round_to_bfloat16(b_values[std::size_t(((i * 37) % k) * n + j)]);
        differing += std::memcmp(&expected, &c[std::size_t(i * n + j)], sizeof(float)) != 0;
      }
    CHECK(differing == 0);
  }
}

TEST_CASE("bfloat16 operands: float sums of the rounded operands on the bfloat16 path, single precision's bits "
          "elsewhere") {
  for_every_route(bf16, [](const product& pr, const epilogue<float>& ep, float beta, bool on_path) {
    const auto out = pr.run(bf16, ep, beta);
    if (on_path) {
      // Against the rounded operands: a float dot product's error (k terms, each sum rounded once). Against the
      // operands themselves the rounding shows (bfloat16 keeps 8 bits).
      CHECK(pr.worst_error(out, bf16, ep, beta) <= 2e-7 * double(pr.k + 2));
      CHECK(pr.worst_error(out, product_precision::single, ep, beta) > 1e-4);
    } else {  // too small for the bfloat16 path, or no engine for it: single precision, bit for bit
      const auto single = pr.run(product_precision::single, ep, beta);
      CHECK(std::memcmp(out.data(), single.data(), out.size() * sizeof(float)) == 0);
    }
  });
}

TEST_CASE("bfloat16 products: the same bits on one thread and two, and with the right-hand side packed once") {
  // (Without AMX these are single precision's products, whose bits test_gemm checks the same way.)
  const product pr(false, true, 64, 128, 784, 5);
  const index_t saved_threads = num_threads();
  set_num_threads(1);
  const auto one = pr.run(bf16, {}, 0.0f);
  set_num_threads(2);
  const auto two = pr.run(bf16, {}, 0.0f);
  set_num_threads(saved_threads);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);

  check_prepacked_b_has_gemm_bits(bf16);
}

TEST_CASE("a bfloat16 product computed as its transpose, or in parts, has the bits of the product computed whole") {
  // B stored n x k with fewer rows than columns (a Dense layer's forward) runs as C^T = B A^T on the bfloat16 path;
  // B stored k x n runs directly. Each element adds the same exact pair products in the same order either way.
  const auto [transposed, direct] = forward_as_stored_both_ways();
  for_each_bfloat16_engine([&](const char* engine) {
    CAPTURE(engine);
    const epilogue<float> fused{transposed.bias.data(), activation::relu};
    const auto one = transposed.run(bf16, fused, 0.5f);
    CHECK(std::memcmp(one.data(), direct.run(bf16, fused, 0.5f).data(), one.size() * sizeof(float)) == 0);
    const auto single = transposed.run(product_precision::single, fused, 0.5f);
    CHECK((std::memcmp(one.data(), single.data(), one.size() * sizeof(float)) != 0) == rounds_products(bf16));

    // gemm_part's parts (a fused training step's threads each take one), with beta 0: the whole product's bits.
    REQUIRE(kernels::cpu::gemm_splits<float>(false, true, 64, 128, 784, bf16));
    std::vector<float> whole = transposed.c, parts = transposed.c;
    kernels::cpu::gemm<float>(false, true, 64, 128, 784, 1.0f, transposed.a.data(), transposed.lda,
                              transposed.b.data(), transposed.ldb, 0.0f, whole.data(), transposed.ldc, fused, bf16);
    for (const auto& [i0, i1] : {std::pair<index_t, index_t>{0, 16}, {16, 64}})
      for (const auto& [j0, j1] : {std::pair<index_t, index_t>{0, 48}, {48, 128}})
        kernels::cpu::gemm_part<float>(false, true, 64, 128, 784, 1.0f, transposed.a.data(), transposed.lda,
                                       transposed.b.data(), transposed.ldb, parts.data(), transposed.ldc, i0, i1, j0,
                                       j1, fused, bf16);
    CHECK(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)) == 0);
  });
}

TEST_CASE("policy::cpu_bf16 trains a static MLP as dynamic mode does, bit for bit, near policy::cpu's losses") {
  check_mlp_in_both_modes<policy::cpu_bf16>(1e-2f);  // a few thousandths apart from single precision's
}

TEST_CASE("policy::cpu_bf16 runs convolutions and recurrent layers in both modes with the same bits") {
  check_cnn_and_lstm_in_both_modes<policy::cpu_bf16>();
}

TEST_CASE("set_default_product_precision switches policy::cpu to bfloat16 operands and back") {
  check_global_switch<policy::cpu_bf16>();
}
