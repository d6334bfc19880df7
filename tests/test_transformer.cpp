// Transformer layers in dynamic mode: nn::TransformerEncoderLayer and nn::TransformerEncoder against PyTorch's fixtures
// (tests/fixtures/generate_transformer.py), forward and every gradient, with each mask kind, norm_first on and off, relu
// and gelu; central differences in double; nn::CausalTransformerLayer against the layer with the causal mask;
// positional embeddings (the sinusoidal table against PyTorch's, the learned one's gradient); the text corpus's split
// and windows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "gradient_check.hpp"
#include "same_training.hpp"
#include "kiln/data/text.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;

namespace {

std::span<const float> values_of(const nn::Variable& v) { return {v.data(), static_cast<std::size_t>(v.numel())}; }
std::span<const float> grad_of(const nn::Variable& v) {
  auto g = v.grad();
  return {g.data(), static_cast<std::size_t>(g.numel())};
}

bool flag(const fixture& fx, const std::string& name) { return fx.has(name) && fx.i64(name)[0] != 0; }
index_t int_of(const fixture& fx, const std::string& name) { return static_cast<index_t>(fx.i64(name)[0]); }

nn::AttentionMask mask_of(const fixture& fx, const std::string& name) {
  if (!fx.has(name)) return {};
  nn::Variable values(fx.f32(name));
  return flag(fx, name + "_bool") ? nn::bool_mask(values) : nn::AttentionMask(values);
}

nn::TransformerEncoderLayerOptions options_of(const fixture& fx) {
  return {.dim_feedforward = int_of(fx, "dim_feedforward"),
          .dropout = 0.0,
          .activation = flag(fx, "gelu") ? nn::transformer_activation::gelu : nn::transformer_activation::relu,
          .layer_norm_eps = fx.scalar("layer_norm_eps"),
          .batch_first = flag(fx, "batch_first"),
          .norm_first = flag(fx, "norm_first"),
          .bias = flag(fx, "bias")};
}

// Copies every parameter of m from the fixture, by name, and checks that the names are PyTorch's (each one found).
void load_parameters(nn::Module& m, const fixture& fx) {
  for (auto& [name, p] : m.named_parameters()) {
    CAPTURE(name);
    REQUIRE(fx.has(name));
    const Tensor<float> expected = fx.f32(name);
    REQUIRE(expected.shape() == p.shape());
    std::copy_n(expected.data(), expected.numel(), p.data());
  }
}

void check_gradients_against(nn::Module& m, const nn::Variable& src, const fixture& fx) {
  check_close(grad_of(src), fx.f32("grad.src"), "grad.src");
  for (auto& [name, p] : m.named_parameters()) check_close(grad_of(p), fx.f32("grad." + name), name.c_str());
}

}  // namespace

TEST_CASE("TransformerEncoderLayer: forward and every gradient match PyTorch") {
  for (std::string name : {"layer_post_norm_relu", "layer_pre_norm_gelu_batch_first", "layer_masks",
                           "layer_float_mask_no_bias", "layer_causal", "layer_unbatched"}) {
    CAPTURE(name);
    fixture fx("transformer/" + name);
    nn::TransformerEncoderLayer layer(int_of(fx, "d_model"), int_of(fx, "nhead"), options_of(fx));
    load_parameters(layer, fx);
    CHECK(layer.named_parameters().size() + 2 <= fx.names().size());
    nn::Variable src(fx.f32("src"), true);
    nn::Variable out = layer.forward(src, {.mask = mask_of(fx, "mask"),
                                           .src_key_padding_mask = mask_of(fx, "src_key_padding_mask"),
                                           .is_causal = flag(fx, "is_causal")});
    REQUIRE(out.shape() == fx.shape_of("out"));
    check_close(values_of(out), fx.f32("out"), "out");
    nn::sum(nn::mul(out, nn::Variable(fx.f32("dout")))).backward();
    check_gradients_against(layer, src, fx);
  }
}

TEST_CASE("TransformerEncoder: stacked layers and the final norm match PyTorch") {
  for (std::string name : {"encoder_causal_final_norm", "encoder_post_norm"}) {
    CAPTURE(name);
    fixture fx("transformer/" + name);
    const index_t d_model = int_of(fx, "d_model"), nhead = int_of(fx, "nhead");
    const auto options = options_of(fx);
    std::shared_ptr<nn::LayerNorm> norm;
    if (flag(fx, "final_norm"))
      norm = std::make_shared<nn::LayerNorm>(d_model, static_cast<float>(options.layer_norm_eps), true, options.bias);
    nn::TransformerEncoder encoder([&] { return nn::TransformerEncoderLayer(d_model, nhead, options); },
                                   int_of(fx, "num_layers"), norm);
    load_parameters(encoder, fx);
    nn::Variable src(fx.f32("src"), true);
    nn::Variable out = encoder.forward(src, {.mask = mask_of(fx, "mask"), .is_causal = flag(fx, "is_causal")});
    check_close(values_of(out), fx.f32("out"), "out");
    nn::sum(nn::mul(out, nn::Variable(fx.f32("dout")))).backward();
    check_gradients_against(encoder, src, fx);
  }
}

TEST_CASE("CausalTransformerLayer: the one-argument forward is the layer under the causal mask") {
  manual_seed(3);
  const nn::TransformerEncoderLayerOptions options{.dim_feedforward = 32, .dropout = 0.0, .batch_first = true,
                                                   .norm_first = true};
  nn::CausalTransformerLayer causal(16, 4, options);
  nn::TransformerEncoderLayer plain(16, 4, options);
  plain.load_state_dict(causal.state_dict());
  random_generator rng(4);
  Tensor<float> x(shape{2, 9, 16});
  for (auto& v : x.span()) v = rng.normal<float>();
  const nn::Variable a = causal(nn::Variable(x));
  const nn::Variable b = plain.forward(nn::Variable(x), {.mask = nn::bool_mask(nn::Variable([] {
                                                           Tensor<float> m(shape{9, 9});
                                                           for (index_t i = 0; i < 9; ++i)
                                                             for (index_t j = 0; j < 9; ++j) m[i * 9 + j] = j > i;
                                                           return m;
                                                         }()))});
  check_close(values_of(a), Tensor<float>(b.tensor()), "causal", 1e-5);
  // The future cannot change the past: the first 5 positions' outputs ignore the last 4 inputs.
  Tensor<float> changed = x;
  for (index_t n = 0; n < 2; ++n)
    for (index_t t = 5; t < 9; ++t)
      for (index_t c = 0; c < 16; ++c) changed[(n * 9 + t) * 16 + c] += 1.0f;
  const nn::Variable c = causal(nn::Variable(changed));
  for (index_t n = 0; n < 2; ++n)
    for (index_t i = 0; i < 5 * 16; ++i) CHECK(c.data()[n * 9 * 16 + i] == a.data()[n * 9 * 16 + i]);
  // A chain of them is a language model's trunk; the names are TransformerEncoderLayer's.
  nn::TransformerEncoder trunk([&] { return nn::CausalTransformerLayer(16, 4, options); }, 2);
  CHECK(trunk(nn::Variable(x)).shape() == shape{2, 9, 16});
  CHECK(trunk.state_dict()[0].first == "layers.0.self_attn.in_proj_weight");
}

TEST_CASE("Transformer layers: gradients match central differences in double, with dropout off") {
  using kiln::test::check_gradients;
  using kiln::test::random_leaf;
  using kiln::test::weighted_sum;
  manual_seed(9);
  for (bool norm_first : {false, true}) {
    CAPTURE(norm_first);
    nn::basic_transformer_encoder_layer<double> layer(
        6, 2, {.dim_feedforward = 8, .dropout = 0.0, .activation = nn::transformer_activation::gelu,
               .batch_first = true, .norm_first = norm_first});
    const auto x = random_leaf(shape{2, 4, 6}, 1);
    const Tensor<double> padded(shape{2, 4}, {0, 0, 1, 0, 0, 1, 0, 1});
    std::vector<test::double_variable> leaves = {x};
    for (const auto& p : layer.parameters()) leaves.push_back(p);
    check_gradients(leaves, [&] {
      return weighted_sum(layer.forward(x, {.src_key_padding_mask = nn::bool_mask(nn::basic_variable<double>(padded))}));
    });
  }
  nn::basic_learned_positional_embedding<double> positions(7, 6, {.batch_first = true, .std = 1.0});
  const auto x = random_leaf(shape{2, 5, 6}, 2);
  check_gradients({x, positions.weight}, [&] { return weighted_sum(positions(x)); });
}

TEST_CASE("TransformerEncoderLayer: PyTorch's names, dropout in training only, errors that name the problem") {
  manual_seed(1);
  nn::TransformerEncoderLayer layer(16, 4, {.dim_feedforward = 24, .dropout = 0.25, .batch_first = true});
  std::vector<std::string> keys;
  for (const auto& [name, t] : layer.state_dict()) keys.push_back(name);
  CHECK(keys == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                         "self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear1.weight",
                                         "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight",
                                         "norm1.bias", "norm2.weight", "norm2.bias"});
  nn::TransformerEncoderLayer no_bias(8, 2, {.bias = false});
  for (const auto& [name, t] : no_bias.state_dict()) CHECK(name.find("bias") == std::string::npos);
  CHECK(no_bias.state_dict().size() == 6);

  random_generator rng(2);
  Tensor<float> x(shape{2, 5, 16});
  for (auto& v : x.span()) v = rng.normal<float>();
  layer.eval();
  const nn::Variable a = layer(nn::Variable(x)), b = layer(nn::Variable(x));
  CHECK(std::equal(values_of(a).begin(), values_of(a).end(), values_of(b).begin()));
  layer.train();
  const nn::Variable c = layer(nn::Variable(x));
  CHECK(!std::equal(values_of(a).begin(), values_of(a).end(), values_of(c).begin()));

  CHECK_THROWS_WITH_AS(layer(nn::Variable(Tensor<float>(shape{2, 5, 12}))),
                       doctest::Contains("TransformerEncoderLayer"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::TransformerEncoderLayer(16, 4, {.dim_feedforward = 0}),
                       doctest::Contains("dim_feedforward"), kiln::error);
  CHECK_THROWS_WITH_AS(nn::TransformerEncoderLayer(10, 3), doctest::Contains("divisible"), kiln::error);
}

TEST_CASE("Positional embeddings: the sinusoidal table is PyTorch's; both add the first L rows") {
  for (index_t d_model : {16, 7}) {
    CAPTURE(d_model);
    fixture fx("transformer/sinusoidal_" + std::to_string(d_model));
    nn::SinusoidalPositionalEncoding pe(d_model, int_of(fx, "max_len"));
    check_close(values_of(pe.pe), fx.f32("pe"), "pe", 1e-6);
    CHECK(pe.state_dict()[0].first == "pe");
  }
  nn::SinusoidalPositionalEncoding seq_first(4, 10);
  const nn::Variable zeros(Tensor<float>(shape{3, 2, 4}));
  const nn::Variable y = seq_first(zeros);  // [L, N, E]: row t of the table at every batch entry of position t
  for (index_t t = 0; t < 3; ++t)
    for (index_t n = 0; n < 2; ++n)
      for (index_t c = 0; c < 4; ++c) CHECK(y.data()[(t * 2 + n) * 4 + c] == seq_first.pe.data()[t * 4 + c]);
  manual_seed(2);
  nn::LearnedPositionalEmbedding learned(5, 4, {.batch_first = true});
  CHECK(learned.state_dict()[0].first == "weight");
  double square_sum = 0;
  for (float w : values_of(learned.weight)) square_sum += double(w) * w;
  CHECK(std::sqrt(square_sum / 20) < 0.05);
  CHECK(std::sqrt(square_sum / 20) > 0.005);
  CHECK_THROWS_WITH_AS(learned(nn::Variable(Tensor<float>(shape{1, 6, 4}))), doctest::Contains("max_len"),
                       kiln::error);
}

TEST_CASE("Text corpus: each file's end held out at an entry boundary; windows with next-token targets") {
  const auto dir = std::filesystem::temp_directory_path() / "kiln_text_corpus_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string a;
  for (int i = 0; i < 20; ++i) a += "entry " + std::to_string(i) + " of file a\n%\n";
  std::ofstream(dir / "a") << a;
  const std::string b = "no separators at all in this one: its last tenth is cut at the byte\n";
  std::ofstream(dir / "b") << b;
  std::ofstream(dir / ".hidden") << "skipped";
  const auto corpus = data::load_text_corpus(dir);
  REQUIRE(corpus.files.size() == 2);
  const std::string train(corpus.train.begin(), corpus.train.end());
  const std::string validation(corpus.validation.begin(), corpus.validation.end());
  // a's cut is the start of the first entry at or after 90% of its bytes; b has no entries and is cut at 90%.
  // (entry 18 starts 2 bytes before a's 90% byte, so entry 19 is the first at or after it)
  const std::size_t a_cut = a.find("entry 19 of file a");
  CHECK(a.find("entry 18 of file a") < static_cast<std::size_t>(static_cast<double>(a.size()) * 0.9));
  CHECK(a_cut >= static_cast<std::size_t>(static_cast<double>(a.size()) * 0.9));
  const auto b_cut = static_cast<std::size_t>(static_cast<double>(b.size()) * 0.9);
  CHECK(train == a.substr(0, a_cut) + b.substr(0, b_cut));
  CHECK(validation == a.substr(a_cut) + b.substr(b_cut));

  data::text_windows<float> windows(data::byte_vocabulary::encode("abcdefghij"), 3);
  CHECK(windows.size() == 3);  // abc|bcd, def|efg, ghi|hij
  Tensor<float> x(shape{3});
  Tensor<std::int64_t> y(shape{3});
  windows.get(2, x.view(), y.view());
  CHECK(x[0] == 'g');
  CHECK(x[2] == 'i');
  CHECK(y[0] == 'h');
  CHECK(y[2] == 'j');
  data::text_windows<float> overlapping(data::byte_vocabulary::encode("abcdefghij"), 3, 1);
  CHECK(overlapping.size() == 7);
  CHECK_THROWS_WITH_AS(windows.get(3, x.view(), y.view()), doctest::Contains("out of range"), kiln::error);
  CHECK_THROWS_WITH_AS(data::load_text_corpus(dir / "missing"), doctest::Contains("missing"), kiln::error);
  CHECK_THROWS_WITH_AS(data::load_text_corpus(dir, {.max_bytes = 100}), doctest::Contains("limit"), kiln::error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("TimeDistributed<Dense>: static mode's Linear at every position trains as nn::Linear on [N, T, E]") {
  using Net = Sequential<policy::cpu, Input<5, 12>, TimeDistributed<Dense<16, GELU>>, TimeDistributed<Dense<8>>,
                         Flatten, Dense<3>>;
  static_assert(std::is_same_v<Net::plan::bound<0>::output, dims<5, 16>>);
  static_assert(std::is_same_v<Net::plan::bound<1>::output, dims<5, 8>>);
  Net net(4, 7);
  manual_seed(7);
  auto model = nn::Sequential(nn::Linear(12, 16), nn::GELU(), nn::Linear(16, 8), nn::Flatten(), nn::Linear(40, 3));
  const auto static_dict = net.state_dict(), dynamic_dict = model.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  for (std::size_t i = 0; i < static_dict.size(); ++i) {
    CAPTURE(dynamic_dict[i].first);
    CHECK(static_dict[i].first == dynamic_dict[i].first);  // "0.weight", "2.weight", "4.weight": PyTorch's numbering
    CHECK(std::equal(static_dict[i].second.span().begin(), static_dict[i].second.span().end(),
                     dynamic_dict[i].second.span().begin()));
  }
  random_generator rng(3);
  Tensor<float> x(shape{4, 5, 12});
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> y(shape{4}, {0, 2, 1, 2});
  check_same_losses(net, model, {x, y}, 20, {.lr = 1e-2}, [](auto&, auto&) {});
  CHECK(Net::plan::bound<0>::description() == "TimeDistributed(Dense+GELU)");
}

namespace {
// nn::MultiheadAttention under the causal mask (is_causal): the dynamic twin of MultiheadSelfAttention<H, true>.
struct causal_self_attention : nn::Module {
  causal_self_attention(index_t width, index_t heads) {
    attn = register_module("attn", nn::MultiheadAttention(width, heads, {.batch_first = true}));
  }
  nn::Variable forward(const nn::Variable& x) override {
    return attn->forward(x, x, x,
                         {.need_weights = false,
                          .attn_mask = nn::generate_square_subsequent_mask(x.shape()[1]),
                          .is_causal = true})
        .first;
  }
  std::shared_ptr<nn::MultiheadAttention> attn;
};
}  // namespace

TEST_CASE("MultiheadSelfAttention: static mode's self-attention trains as nn::MultiheadAttention, bit for bit") {
  random_generator rng(11);
  Tensor<float> x(shape{3, 7, 16});
  for (auto& v : x.span()) v = rng.normal<float>();
  const Tensor<std::int64_t> y(shape{3}, {4, 0, 2});
  SUBCASE("no mask: the one-argument forward, PyTorch's names and initial values") {
    using Net = Sequential<policy::cpu, Input<7, 16>, MultiheadSelfAttention<4>, Flatten, Dense<5>>;
    Net net(3, 21);
    manual_seed(21);
    auto model = nn::Sequential(nn::MultiheadAttention(16, 4, {.batch_first = true}), nn::Flatten(),
                                nn::Linear(7 * 16, 5));
    const auto static_dict = net.state_dict(), dynamic_dict = model.state_dict();
    REQUIRE(static_dict.size() == dynamic_dict.size());
    for (std::size_t i = 0; i < static_dict.size(); ++i) {
      CAPTURE(dynamic_dict[i].first);
      CHECK(static_dict[i].first == dynamic_dict[i].first);  // "0.in_proj_weight" ... "0.out_proj.bias", "2.weight"
      CHECK(std::equal(static_dict[i].second.span().begin(), static_dict[i].second.span().end(),
                       dynamic_dict[i].second.span().begin()));
    }
    check_same_losses(net, model, {x, y}, 20, {.lr = 1e-2}, [](auto&, auto&) {});
  }
  SUBCASE("causal: as is_causal with the causal mask") {
    using Net = Sequential<policy::cpu, Input<7, 16>, MultiheadSelfAttention<2, true>, Flatten, Dense<5>>;
    Net net(3, 5);
    auto model = nn::Sequential(causal_self_attention(16, 2), nn::Flatten(), nn::Linear(7 * 16, 5));
    nn::Module::state_dict_type renamed;
    for (const auto& [name, tensor] : net.state_dict())
      renamed.emplace_back(name.rfind("0.", 0) == 0 ? "0.attn." + name.substr(2) : name, tensor);
    model.load_state_dict(renamed);
    check_same_losses(net, model, {x, y}, 20, {.lr = 1e-2}, [](auto&, auto&) {});
    // The future does not reach the past: position 0's output ignores positions 1 to 6.
    Tensor<float> changed = x;
    for (index_t i = 16; i < 7 * 16; ++i) changed[i] += 1.0f;
    using Trunk = Sequential<policy::cpu, Input<7, 16>, MultiheadSelfAttention<2, true>>;
    Trunk trunk(3, 5);
    const Tensor<float> a(trunk.predict(x.view())), b(trunk.predict(changed.view()));
    for (index_t i = 0; i < 16; ++i) CHECK(a[i] == b[i]);
  }
}
