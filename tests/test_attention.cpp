// Attention in dynamic mode: nn::scaled_dot_product_attention (kiln's tiled CPU kernel, kernels/cpu/attention.hpp)
// and nn::MultiheadAttention against PyTorch's fixtures (tests/fixtures/generate_attention.py), forward and every
// gradient; the tiled kernel against softmax(q k^T) v composed of the existing ops on random shapes; central
// differences in double through both; dropout's masks against nn::dropout's; MultiheadAttention's parameters and
// their initialisation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "gradient_check.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;

namespace {

template <class T>
using var = nn::basic_variable<T>;

std::span<const float> values_of(const nn::Variable& v) {
  return {v.data(), static_cast<std::size_t>(v.numel())};
}
std::span<const float> grad_of(const nn::Variable& v) {
  auto g = v.grad();
  return {g.data(), static_cast<std::size_t>(g.numel())};
}

bool flag(const fixture& fx, const std::string& name) { return fx.has(name) && fx.i64(name)[0] != 0; }

// A fixture's mask: boolean (1 = True) or additive, by its <name>_bool flag; none when absent.
nn::AttentionMask mask_of(const fixture& fx, const std::string& name) {
  if (!fx.has(name)) return {};
  nn::Variable values(fx.f32(name));
  return flag(fx, name + "_bool") ? nn::bool_mask(values) : nn::AttentionMask(values);
}

// softmax(q k^T scale + mask) v composed of matmul, masked_fill, add, softmax (and dropout): the reference the tiled
// kernel is checked against.
template <class T>
var<T> naive_attention(const var<T>& q, const var<T>& k, const var<T>& v, const nn::basic_attention_mask<T>& mask,
                       bool causal, T scale, T dropout_p = T(0), random_generator* rng = nullptr) {
  const index_t l_dim = q.shape()[q.dim() - 2], s_dim = k.shape()[k.dim() - 2];
  var<T> scores = nn::mul(nn::matmul(q, nn::transpose(k, -2, -1)), scale);
  if (mask.defined())
    scores = mask.boolean ? nn::masked_fill(scores, nn::eq(mask.values, T(0)), T(-INFINITY))
                          : nn::add(scores, mask.values);
  if (causal) {
    Tensor<T> future(shape{l_dim, s_dim});
    for (index_t i = 0; i < l_dim; ++i)
      for (index_t j = 0; j < s_dim; ++j) future[i * s_dim + j] = j > i ? T(1) : T(0);
    scores = nn::masked_fill(scores, var<T>(future), T(-INFINITY));
  }
  var<T> weights = nn::softmax(scores, -1);
  if (dropout_p > T(0)) weights = nn::dropout(weights, dropout_p, true, *rng);
  return nn::matmul(weights, v);
}

template <class T>
var<T> random_variable(const shape& s, random_generator& rng, bool requires_grad = true, double scale = 1.0) {
  Tensor<T> t(s);
  for (auto& x : t.span()) x = static_cast<T>(scale * rng.normal<double>());
  return var<T>(t, requires_grad);
}

// A boolean mask of the given shape in which every row keeps its first key.
template <class T>
var<T> random_keep_mask(const shape& s, random_generator& rng) {
  Tensor<T> t(s);
  const index_t cols = s[s.rank() - 1];
  for (index_t i = 0; i < t.numel(); ++i) t[i] = (i % cols == 0 || rng.uniform<double>() < 0.7) ? T(1) : T(0);
  return var<T>(t, false);
}

template <class T>
Tensor<float> as_float(const var<T>& v) {
  Tensor<float> out(v.shape());
  const T* src = v.data();
  for (index_t i = 0; i < v.numel(); ++i) out[i] = static_cast<float>(src[i]);
  return out;
}
template <class T>
Tensor<float> grad_as_float(const var<T>& v) {
  Tensor<float> out(v.shape());
  auto g = v.grad();
  for (index_t i = 0; i < v.numel(); ++i) out[i] = static_cast<float>(g[i]);
  return out;
}

// Float rounding for results of O(1) inputs: 1e-5 of each value plus 2e-6 absolute (a few float ulps of sums of tens
// of products of N(0, 1) values, summed in another order than the reference's). check_close's floor follows the
// expected tensor's own largest value, which is too tight where a gradient is small by cancellation (dS = P (dW -
// rowsum(dO O)) of terms near 1).
void check_rounding(std::span<const float> actual, const Tensor<float>& expected, const char* what) {
  REQUIRE(actual.size() == static_cast<std::size_t>(expected.numel()));
  std::size_t failures = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double e = expected[static_cast<index_t>(i)];
    const double ratio = std::abs(actual[i] - e) / (1e-5 * std::abs(e) + 2e-6);
    if (!(ratio <= 1)) ++failures;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  INFO(std::string(what), ": ", failures, " elements beyond 1e-5 |e| + 2e-6; worst at ", worst, ": ", actual[worst],
       " against ", expected[static_cast<index_t>(worst)]);
  CHECK(failures == 0);
}

template <class T>
var<T> cast_to(const nn::Variable& v, bool requires_grad) {
  Tensor<T> t(v.shape());
  for (index_t i = 0; i < v.numel(); ++i) t[i] = static_cast<T>(v.data()[i]);
  return var<T>(t, requires_grad);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: forward and gradients match PyTorch") {
  for (std::string name : {"sdpa_plain", "sdpa_long_keys", "sdpa_causal", "sdpa_causal_more_queries", "sdpa_bool_mask",
                           "sdpa_bool_mask_batch", "sdpa_additive_mask", "sdpa_scale"}) {
    CAPTURE(name);
    fixture fx("attention/" + name);
    nn::Variable q(fx.f32("q"), true), k(fx.f32("k"), true), v(fx.f32("v"), true);
    std::optional<double> scale;
    if (fx.has("scale")) scale = fx.scalar("scale");
    nn::Variable out = nn::scaled_dot_product_attention(q, k, v, mask_of(fx, "mask"), 0.0, flag(fx, "causal"), scale);
    check_close(values_of(out), fx.f32("out"), "out");
    nn::sum(nn::mul(out, nn::Variable(fx.f32("dout")))).backward();
    check_close(grad_of(q), fx.f32("dq"), "dq");
    check_close(grad_of(k), fx.f32("dk"), "dk");
    check_close(grad_of(v), fx.f32("dv"), "dv");
  }
}

TEST_CASE("MultiheadAttention: forward, weights and every gradient match PyTorch") {
  for (std::string name : {"mha_self_batch_first", "mha_seq_first_kpm_bool_per_head", "mha_attn_mask_float_no_weights",
                           "mha_attn_mask_bool3d", "mha_both_masks_no_weights", "mha_kdim_vdim",
                           "mha_kdim_vdim_seq_first_no_weights", "mha_causal_hint", "mha_no_bias", "mha_unbatched"}) {
    CAPTURE(name);
    fixture fx("attention/" + name);
    auto int_of = [&](const char* n) { return static_cast<index_t>(fx.i64(n)[0]); };
    nn::MultiheadAttention m(int_of("embed_dim"), int_of("num_heads"),
                             {.bias = flag(fx, "bias"), .batch_first = flag(fx, "batch_first"), .kdim = int_of("kdim"),
                              .vdim = int_of("vdim")});
    auto params = m.named_parameters();
    for (auto& [param_name, p] : params) {
      CAPTURE(param_name);
      const Tensor<float> expected = fx.f32(param_name);
      REQUIRE(expected.shape() == p.shape());
      std::copy_n(expected.data(), expected.numel(), p.data());
    }
    nn::Variable query(fx.f32("query"), true), key = query, value = query;
    if (!flag(fx, "self")) {
      key = nn::Variable(fx.f32("key"), true);
      value = nn::Variable(fx.f32("value"), true);
    }
    nn::MultiheadAttentionForwardOptions options{.key_padding_mask = mask_of(fx, "key_padding_mask"),
                                                 .need_weights = flag(fx, "need_weights"),
                                                 .attn_mask = mask_of(fx, "attn_mask"),
                                                 .average_attn_weights = flag(fx, "average_attn_weights"),
                                                 .is_causal = flag(fx, "is_causal")};
    auto [out, weights] = m.forward(query, key, value, options);
    check_close(values_of(out), fx.f32("out"), "out");
    REQUIRE(out.shape() == fx.shape_of("out"));
    nn::Variable loss = nn::sum(nn::mul(out, nn::Variable(fx.f32("dout"))));
    if (options.need_weights) {
      REQUIRE(weights.defined());
      REQUIRE(weights.shape() == fx.shape_of("weights"));
      check_close(values_of(weights), fx.f32("weights"), "weights");
      loss = nn::add(loss, nn::sum(nn::mul(weights, nn::Variable(fx.f32("dweights")))));
    } else {
      CHECK(!weights.defined());
    }
    loss.backward();
    check_close(grad_of(query), fx.f32("grad.query"), "grad.query");
    if (!flag(fx, "self")) {
      check_close(grad_of(key), fx.f32("grad.key"), "grad.key");
      check_close(grad_of(value), fx.f32("grad.value"), "grad.value");
    }
    for (auto& [param_name, p] : params) check_close(grad_of(p), fx.f32("grad." + param_name), param_name.c_str());
  }
}

TEST_CASE("scaled_dot_product_attention: the tiled kernel agrees with softmax(q k^T) v on random shapes") {
  random_generator rng(2024);
  struct config {
    shape qb, kb, vb;  // leading dimensions of q, k, v (they broadcast)
    index_t l, s, e, ev;
    int mask;  // 0 none, 1 boolean [L, S], 2 additive [B0, 1, L, S], 3 boolean [..., L, S] over q's batch
    bool causal;
  };
  const std::vector<config> configs = {
      {{2, 3}, {2, 3}, {2, 3}, 37, 53, 16, 24, 0, false}, {{1}, {1}, {1}, 1, 3, 4, 4, 0, false},
      {{4}, {4}, {4}, 64, 128, 8, 8, 1, false},            {{2, 2}, {2, 2}, {2, 2}, 65, 33, 5, 7, 2, false},
      {{3}, {3}, {3}, 100, 100, 16, 16, 0, true},          {{2}, {2}, {2}, 31, 97, 3, 9, 3, false},
      {{2, 3}, {3}, {1, 3}, 13, 70, 6, 4, 1, false},       {{2}, {2}, {2}, 90, 20, 8, 8, 0, true},
  };
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const config& cf = configs[c];
    CAPTURE(c);
    auto with = [](shape b, index_t rows, index_t cols) {
      b.push_back(rows);
      b.push_back(cols);
      return b;
    };
    const nn::Variable q = random_variable<float>(with(cf.qb, cf.l, cf.e), rng),
                       k = random_variable<float>(with(cf.kb, cf.s, cf.e), rng),
                       v = random_variable<float>(with(cf.vb, cf.s, cf.ev), rng);
    nn::Variable mask_values;
    const index_t b0 = cf.qb[0];
    if (cf.mask == 1) mask_values = random_keep_mask<float>(shape{cf.l, cf.s}, rng);
    if (cf.mask == 2) mask_values = random_variable<float>(shape{b0, 1, cf.l, cf.s}, rng, false, 2.0);
    if (cf.mask == 3) mask_values = random_keep_mask<float>(with(cf.qb, cf.l, cf.s), rng);
    nn::AttentionMask mask;
    if (cf.mask == 2) mask = nn::AttentionMask(mask_values);
    else if (cf.mask != 0) mask = nn::bool_mask(mask_values);
    const double scale = 1.0 / std::sqrt(double(cf.e));

    nn::Variable out = nn::scaled_dot_product_attention(q, k, v, mask, 0.0, cf.causal);
    const nn::Variable dout = random_variable<float>(out.shape(), rng, false);
    nn::sum(nn::mul(out, dout)).backward();

    // The reference in double, from the same values.
    const var<double> qd = cast_to<double>(q, true), kd = cast_to<double>(k, true), vd = cast_to<double>(v, true);
    nn::basic_attention_mask<double> md;
    if (mask.defined()) {
      md.values = cast_to<double>(mask.values, false);
      md.boolean = mask.boolean;
    }
    var<double> ref = naive_attention<double>(qd, kd, vd, md, cf.causal, scale);
    nn::sum(nn::mul(ref, cast_to<double>(dout, false))).backward();
    check_rounding(values_of(out), as_float(ref), "out");
    check_rounding(grad_of(q), grad_as_float(qd), "dq");
    check_rounding(grad_of(k), grad_as_float(kd), "dk");
    check_rounding(grad_of(v), grad_as_float(vd), "dv");

    // The kernel in double against the same reference: the algebra, without float's rounding.
    const var<double> q2 = cast_to<double>(q, true), k2 = cast_to<double>(k, true), v2 = cast_to<double>(v, true);
    var<double> out2 = nn::scaled_dot_product_attention(q2, k2, v2, md, 0.0, cf.causal);
    nn::sum(nn::mul(out2, cast_to<double>(dout, false))).backward();
    auto max_diff = [](const var<double>& a, tensor_view<const double> b) {
      double worst = 0;
      for (index_t i = 0; i < b.numel(); ++i) worst = std::max(worst, std::abs(a.data()[i] - b[i]));
      return worst;
    };
    auto grad_diff = [](const var<double>& a, const var<double>& b) {
      double worst = 0;
      auto ga = a.grad(), gb = b.grad();
      for (index_t i = 0; i < ga.numel(); ++i) worst = std::max(worst, std::abs(ga[i] - gb[i]));
      return worst;
    };
    CHECK(max_diff(out2, ref.value()) < 1e-12);
    CHECK(grad_diff(q2, qd) < 1e-12);
    CHECK(grad_diff(k2, kd) < 1e-12);
    CHECK(grad_diff(v2, vd) < 1e-12);
  }
}

TEST_CASE("scaled_dot_product_attention: gradients match central differences in double") {
  using kiln::test::check_gradients;
  using kiln::test::random_leaf;
  using kiln::test::weighted_sum;
  random_generator rng(7);
  const auto q = random_leaf(shape{2, 5, 3}, 1), k = random_leaf(shape{2, 7, 3}, 2), v = random_leaf(shape{2, 7, 4}, 3);
  SUBCASE("plain") {
    check_gradients({q, k, v}, [&] { return weighted_sum(nn::scaled_dot_product_attention(q, k, v)); });
  }
  SUBCASE("causal, scale") {
    check_gradients({q, k, v}, [&] {
      return weighted_sum(nn::scaled_dot_product_attention(q, k, v, {}, 0.0, true, 0.7));
    });
  }
  SUBCASE("boolean mask") {
    const auto mask = nn::bool_mask(random_keep_mask<double>(shape{2, 5, 7}, rng));
    check_gradients({q, k, v}, [&] { return weighted_sum(nn::scaled_dot_product_attention(q, k, v, mask)); });
  }
  SUBCASE("additive mask, broadcast batch") {
    const auto mask = random_variable<double>(shape{5, 7}, rng, false);
    const auto k1 = random_leaf(shape{1, 7, 3}, 4);
    check_gradients({q, k1, v}, [&] {
      return weighted_sum(nn::scaled_dot_product_attention(q, k1, v, nn::basic_attention_mask<double>(mask)));
    });
  }
  SUBCASE("one tensor as query, key and value") {
    const auto x = random_leaf(shape{2, 6, 4}, 5);
    check_gradients({x}, [&] { return weighted_sum(nn::scaled_dot_product_attention(x, x, x)); });
  }
}

TEST_CASE("scaled_dot_product_attention: dropout draws nn::dropout's masks over the weights") {
  random_generator data(11);
  const nn::Variable q = random_variable<float>(shape{2, 2, 37, 8}, data),
                     k = random_variable<float>(shape{2, 2, 53, 8}, data),
                     v = random_variable<float>(shape{2, 2, 53, 6}, data);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    random_generator a(5, 9), b(5, 9);
    nn::Variable out = nn::scaled_dot_product_attention(q, k, v, {}, 0.25, causal, std::nullopt, &a);
    const nn::Variable dout = random_variable<float>(out.shape(), data, false);
    nn::sum(nn::mul(out, dout)).backward();
    const Tensor<float> dq(q.grad()), dk(k.grad()), dv(v.grad());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
    nn::Variable ref = naive_attention<float>(q, k, v, {}, causal, 1.0f / std::sqrt(8.0f), 0.25f, &b);
    nn::sum(nn::mul(ref, dout)).backward();
    CHECK(a.state().position == b.state().position);
    check_close(values_of(out), ref.tensor(), "out", 2e-5);
    check_close(dq.span(), Tensor<float>(q.grad()), "dq", 2e-5);
    check_close(dk.span(), Tensor<float>(k.grad()), "dk", 2e-5);
    check_close(dv.span(), Tensor<float>(v.grad()), "dv", 2e-5);
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, k, v, {}, 0.5), doctest::Contains("needs a generator"),
                       kiln::error);
}

TEST_CASE("scaled_dot_product_attention: the same bits on one thread and on two; errors name the problem") {
  random_generator data(3);
  const nn::Variable q = random_variable<float>(shape{8, 70, 16}, data),
                     k = random_variable<float>(shape{8, 90, 16}, data),
                     v = random_variable<float>(shape{8, 90, 16}, data);
  auto run = [&](int threads) {
    set_num_threads(threads);
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
    nn::Variable out = nn::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
    nn::sum(nn::mul(out, out)).backward();
    std::vector<float> all(out.data(), out.data() + out.numel());
    for (const auto* x : {&q, &k, &v}) {
      auto g = x->grad();
      all.insert(all.end(), g.data(), g.data() + g.numel());
    }
    return all;
  };
  const int threads = num_threads();
  const auto one = run(1), two = run(2);
  set_num_threads(threads);
  CHECK(one == two);

  const nn::Variable mask(Tensor<float>(shape{70, 90}));
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, k, v, mask, 0.0, true), doctest::Contains("is_causal"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, k, nn::Variable(Tensor<float>(shape{8, 89, 16}))),
                       doctest::Contains("same number of keys"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::scaled_dot_product_attention(q, k, v, nn::Variable(Tensor<float>(shape{71, 90}))),
                       doctest::Contains("broadcast"), kiln::error);
  // A query that sees no key gets 0, with zero gradients.
  Tensor<float> none(shape{70, 90});
  nn::Variable out = nn::scaled_dot_product_attention(q, k, v, nn::bool_mask(nn::Variable(none)));
  double total = 0;
  for (float x : values_of(out)) total += std::abs(x);
  CHECK(total == 0);
}

TEST_CASE("MultiheadAttention: gradients match central differences in double") {
  using kiln::test::check_gradients;
  using kiln::test::random_leaf;
  using kiln::test::weighted_sum;
  manual_seed(5);
  random_generator rng(8);
  SUBCASE("packed projection, masks, weights per head") {
    nn::basic_multihead_attention<double> m(6, 2, {.batch_first = true});
    const auto x = random_leaf(shape{2, 4, 6}, 1), y = random_leaf(shape{2, 5, 6}, 2);
    const Tensor<double> padded(shape{2, 5}, {0, 0, 1, 0, 1, 0, 0, 0, 0, 1});
    const auto padding = nn::bool_mask(nn::basic_variable<double>(padded));
    const auto am = random_variable<double>(shape{4, 5}, rng, false);
    std::vector<test::double_variable> leaves = {x, y};
    for (const auto& p : m.parameters()) leaves.push_back(p);
    check_gradients(leaves, [&] {
      auto [out, w] = m.forward(x, y, y,
                                {.key_padding_mask = padding, .attn_mask = nn::basic_attention_mask<double>(am),
                                 .average_attn_weights = false});
      return nn::add(weighted_sum(out), weighted_sum(w, 5));
    });
  }
  SUBCASE("kdim and vdim, sequence first, the kernel's path") {
    nn::basic_multihead_attention<double> m(4, 2, {.kdim = 3, .vdim = 5});
    const auto q = random_leaf(shape{3, 2, 4}, 3), k = random_leaf(shape{5, 2, 3}, 4),
               v = random_leaf(shape{5, 2, 5}, 5);
    std::vector<test::double_variable> leaves = {q, k, v};
    for (const auto& p : m.parameters()) leaves.push_back(p);
    check_gradients(leaves, [&] { return weighted_sum(m.forward(q, k, v, {.need_weights = false}).first); });
  }
}

TEST_CASE("MultiheadAttention: PyTorch's parameters, names and initialisation, reproducible from manual_seed") {
  manual_seed(42);
  nn::MultiheadAttention m(16, 4);
  const auto names = m.state_dict();
  std::vector<std::string> keys;
  for (const auto& [name, t] : names) keys.push_back(name);
  CHECK(keys == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK(m.in_proj_weight.shape() == shape{48, 16});
  const float bound = std::sqrt(6.0f / (16 + 48));  // xavier_uniform_ over [3 E, E]
  float largest = 0;
  for (float w : values_of(m.in_proj_weight)) largest = std::max(largest, std::abs(w));
  CHECK(largest <= bound);
  CHECK(largest > 0.9f * bound);
  for (float b : values_of(m.in_proj_bias)) CHECK(b == 0.0f);
  for (float b : values_of(m.out_proj->bias)) CHECK(b == 0.0f);
  const float linear_bound = 1.0f / std::sqrt(16.0f);  // Linear's default: kaiming_uniform_(a = sqrt(5))
  for (float w : values_of(m.out_proj->weight)) CHECK(std::abs(w) <= linear_bound);
  CHECK(m.holds_initial_values());
  CHECK(m.out_proj->holds_initial_values());

  manual_seed(42);
  nn::MultiheadAttention again(16, 4);
  const auto first = m.state_dict(), second = again.state_dict();
  for (std::size_t i = 0; i < first.size(); ++i)
    CHECK(std::equal(first[i].second.span().begin(), first[i].second.span().end(), second[i].second.span().begin()));

  nn::MultiheadAttention separate(8, 2, {.bias = false, .kdim = 3, .vdim = 5});
  keys.clear();
  for (const auto& [name, t] : separate.state_dict()) keys.push_back(name);
  CHECK(keys == std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"});
  CHECK(separate.k_proj_weight.shape() == shape{8, 3});
  CHECK(separate.v_proj_weight.shape() == shape{8, 5});
  CHECK_THROWS_WITH_AS(nn::MultiheadAttention(10, 3), doctest::Contains("divisible"), kiln::error);

  // forward(x) is self-attention's output; in evaluation dropout is off, in training it draws from the module's own
  // generator.
  nn::MultiheadAttention dropping(8, 2, {.dropout = 0.5, .batch_first = true});
  random_generator data(1);
  const nn::Variable x = random_variable<float>(shape{2, 5, 8}, data, false);
  const auto before = dropping.generator().state().position;
  dropping.eval();
  nn::Variable y0 = dropping(x), y1 = dropping(x);
  CHECK(dropping.generator().state().position == before);
  CHECK(std::equal(values_of(y0).begin(), values_of(y0).end(), values_of(y1).begin()));
  dropping.train();
  nn::Variable y2 = dropping(x);
  CHECK(dropping.generator().state().position == before + 2 * 2 * 5 * 5);
  CHECK(!std::equal(values_of(y0).begin(), values_of(y0).end(), values_of(y2).begin()));
}
