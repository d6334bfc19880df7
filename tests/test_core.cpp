// Core types: shape, tensor, views, the counter-based generator, the initialisations and the run-time switches.
#include <doctest/doctest.h>

#include <cmath>
#include <iterator>
#include <set>
#include <string>

#include "kiln/core/cpu_check.hpp"
#include "kiln/core/init.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/switches.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/kernels/cpu/dense_sparse_input.hpp"

using namespace kiln;

TEST_CASE("shape counts elements and prints itself") {
  shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.row_size() == 12);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(s.with_batch(5) == shape{5, 3, 4});
  CHECK(s.normalize_dim(-1, "test") == 2);
  CHECK_THROWS_AS(s.normalize_dim(3, "test"), kiln::error);
  CHECK(shape{}.numel() == 1);
}

TEST_CASE("tensor owns aligned storage, views slice rows without copying") {
  Tensor<float> t(shape{4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % memory_alignment == 0);
  CHECK(t.at(2, 1) == 7);
  auto rows = t.rows(1, 2);
  CHECK(rows.shape() == shape{2, 3});
  CHECK(rows.data() == t.data() + 3);
  rows[0] = 42;
  CHECK(t.at(1, 0) == 42);
  CHECK_THROWS_AS(t.rows(3, 2), kiln::error);
  CHECK_THROWS_AS(Tensor<float>(shape{2, 2}, {1, 2, 3}), kiln::error);
  Tensor<double> copy(Tensor<double>(shape{2}, {1.5, 2.5}));
  CHECK(copy[1] == 2.5);
  CHECK_THROWS_AS(t.reshape(shape{5}), kiln::error);
  t.reshape(shape{12});
  CHECK(t.rank() == 1);
}

TEST_CASE("philox matches the Random123 known-answer vectors") {
  // Known-answer test from the Random123 distribution (kat_vectors, philox4x32 10 rounds).
  auto zero = philox4x32({0, 0, 0, 0}, {0, 0});
  CHECK(zero[0] == 0x6627e8d5u);
  CHECK(zero[1] == 0xe169c58du);
  CHECK(zero[2] == 0xbc57ac4cu);
  CHECK(zero[3] == 0x9b00dbd8u);
  auto ones = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  CHECK(ones[0] == 0x408f276du);
  CHECK(ones[1] == 0x41c83b0eu);
  CHECK(ones[2] == 0xa20bc7c6u);
  CHECK(ones[3] == 0x6d5451fdu);
}

TEST_CASE("random generator is reproducible, restartable and well spread") {
  random_generator a(7), b(7), other_stream = a.fork(1);
  for (int i = 0; i < 10; ++i) CHECK(a.next_u32() == b.next_u32());
  auto saved = a.state();
  std::uint32_t next = a.next_u32();
  random_generator c;
  c.set_state(saved);
  CHECK(c.next_u32() == next);
  CHECK(other_stream.next_u32() != random_generator(7).next_u32());

  random_generator rng(1);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double z = rng.normal<double>();
    sum += z;
    sum_sq += z * z;
  }
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(sum_sq / n - 1.0) < 0.02);
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    auto v = rng.below(10);
    CHECK(v < 10);
    seen.insert(v);
  }
  CHECK(seen.size() == 10);
}

TEST_CASE("PyTorch's Linear initialisation bounds") {
  random_generator rng(3);
  Tensor<float> w(shape{64, 100});
  init::linear_weight_default(w.span(), 100, rng);
  float max_abs = 0;
  for (float v : w.span()) max_abs = std::max(max_abs, std::abs(v));
  CHECK(max_abs <= 0.1f);
  CHECK(max_abs > 0.09f);
  Tensor<float> x(shape{1000});
  init::xavier_uniform(x.span(), 10, 20, rng);
  for (float v : x.span()) CHECK(std::abs(v) <= std::sqrt(6.0f / 30.0f));
}

TEST_CASE("run-time switches: one registry, in order, each named once, and its setters are the kernels'") {
  std::set<std::string> names;
  for (std::size_t i = 0; i < std::size(run_switches); ++i) {
    CHECK(static_cast<std::size_t>(run_switches[i].id) == i);
    CHECK(std::string(run_switches[i].environment).rfind("KILN_", 0) == 0);
    CHECK(names.insert(run_switches[i].environment).second);
    CHECK(&switch_info(run_switches[i].id) == &run_switches[i]);
  }
  const bool was = switch_on(run_switch::sparse_input);
  set_switch(run_switch::sparse_input, false);
  CHECK_FALSE(kernels::cpu::sparse_input_products_enabled());
  kernels::cpu::set_sparse_input_products(true);
  CHECK(switch_on(run_switch::sparse_input));
  set_switch(run_switch::sparse_input, was);
}

TEST_CASE("the notice of unused vector extensions names only what the CPU has and the build leaves out") {
  const std::string unused = unused_vector_extensions();
  MESSAGE("unused vector extensions: '", unused, "'");
#if defined(__AVX512F__)
  CHECK(unused.find("AVX-512") == std::string::npos);
#endif
#if defined(__AVX2__)
  CHECK(unused.find("AVX2") == std::string::npos);
#endif
#if defined(__FMA__)
  CHECK(unused.find("FMA") == std::string::npos);
#endif
#if defined(__x86_64__)
  if (unused.find("AVX2") != std::string::npos) CHECK(__builtin_cpu_supports("avx2"));
  if (unused.find("AVX-512") != std::string::npos) CHECK(__builtin_cpu_supports("avx512f"));
#endif
}
