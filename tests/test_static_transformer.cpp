// Static mode's transformer: TransformerEncoderLayer and CausalTransformerLayer (PyTorch's names, dynamic mode's
// initial values, the same training bit for bit), the positional tables, labels per position, and the tiny GPT of
// examples/tiny_gpt in both modes from one seed: the same losses over 20 steps of AdamW with clipping.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../examples/tiny_gpt_net.hpp"
#include "../examples/vit_net.hpp"
#include "allocation_counter.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "same_training.hpp"

using namespace kiln;

namespace {

// The static and the dynamic state_dict hold the same names and the same values (each in its own order).
template <class Net>
void check_same_state(Net& net, nn::Module& model) {
  std::map<std::string, Tensor<float>> dynamic;
  for (const auto& [name, tensor] : model.state_dict()) dynamic.emplace(name, tensor);
  const auto static_dict = net.state_dict();
  CHECK(static_dict.size() == dynamic.size());
  for (const auto& [name, tensor] : static_dict) {
    CAPTURE(name);
    const auto found = dynamic.find(name);
    REQUIRE(found != dynamic.end());
    CHECK(found->second.shape() == tensor.shape());
    CHECK(std::equal(tensor.span().begin(), tensor.span().end(), found->second.span().begin()));
  }
}

// A batch of normal inputs [N, L, E] and one class label per sample.
std::pair<Tensor<float>, Tensor<std::int64_t>> sequence_batch(index_t n, index_t length, index_t width,
                                                              index_t classes, std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<float> x(shape{n, length, width});
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> y(shape{n});
  for (auto& l : y.span()) l = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(classes)));
  return {x, y};
}

}  // namespace

TEST_CASE("TransformerEncoderLayer: static mode's layer has PyTorch's names and trains as nn's, bit for bit") {
  const auto batch = sequence_batch(3, 7, 16, 5, 4);
  SUBCASE("norm first, gelu") {
    constexpr transformer_layer_options options{.feed_forward_activation = activation::gelu, .norm_first = true};
    using Net = Sequential<policy::cpu, Input<7, 16>, TransformerEncoderLayer<4, 32, options>, Flatten, Dense<5>>;
    Net net(3, 8);
    manual_seed(8);
    auto model = nn::Sequential(
        nn::TransformerEncoderLayer(16, 4, {.dim_feedforward = 32, .dropout = 0.0,
                                            .activation = nn::transformer_activation::gelu, .batch_first = true,
                                            .norm_first = true}),
        nn::Flatten(), nn::Linear(7 * 16, 5));
    check_same_state(net, model);  // "0.self_attn.in_proj_weight", ..., "0.norm2.bias", "2.weight"
    check_same_losses(net, model, batch, 20, {.lr = 1e-2}, [](auto&, auto&) {});
    CHECK(Net::plan::bound<0>::description() == "TransformerEncoderLayer(4 heads, feed-forward 32, GELU, norm first)");
  }
  SUBCASE("norm after (PyTorch's default), relu, layer_norm_eps") {
    constexpr transformer_layer_options options{.layer_norm_eps = 1e-6};
    using Net = Sequential<policy::cpu, Input<7, 16>, TransformerEncoderLayer<2, 24, options>, Flatten, Dense<5>>;
    Net net(3, 9);
    manual_seed(9);
    auto model = nn::Sequential(
        nn::TransformerEncoderLayer(16, 2, {.dim_feedforward = 24, .dropout = 0.0, .layer_norm_eps = 1e-6,
                                            .batch_first = true}),
        nn::Flatten(), nn::Linear(7 * 16, 5));
    check_same_state(net, model);
    check_same_losses(net, model, batch, 20, {.lr = 1e-2}, [](auto&, auto&) {});
  }
  SUBCASE("causal: nn::CausalTransformerLayer's one-argument forward") {
    constexpr transformer_layer_options options{.norm_first = true};
    using Net = Sequential<policy::cpu, Input<7, 16>, CausalTransformerLayer<4, 32, options>, Flatten, Dense<5>>;
    Net net(3, 10);
    manual_seed(10);
    auto model = nn::Sequential(
        nn::CausalTransformerLayer(16, 4, {.dim_feedforward = 32, .dropout = 0.0, .batch_first = true,
                                           .norm_first = true}),
        nn::Flatten(), nn::Linear(7 * 16, 5));
    check_same_state(net, model);
    check_same_losses(net, model, batch, 20, {.lr = 1e-2}, [](auto&, auto&) {});
    // The future does not reach the past: position 0's output ignores positions 1 to 6.
    using Trunk = Sequential<policy::cpu, Input<7, 16>, CausalTransformerLayer<4, 32, options>>;
    Trunk trunk(3, 10);
    Tensor<float> changed = batch.first;
    for (index_t i = 16; i < 7 * 16; ++i) changed[i] += 1.0f;
    const Tensor<float> a(trunk.predict(batch.first.view())), b(trunk.predict(changed.view()));
    for (index_t i = 0; i < 16; ++i) CHECK(a[i] == b[i]);
    CHECK(a[16] != b[16]);
  }
}

TEST_CASE("Positional tables: static mode's learned and sinusoidal tables are dynamic mode's") {
  const auto batch = sequence_batch(4, 6, 8, 3, 12);
  SUBCASE("learned: the same draws, the same training (the table's gradient summed as dynamic mode sums it)") {
    using Net = Sequential<policy::cpu, Input<6, 8>, LearnedPositionalEmbedding<10>, Flatten, Dense<3>>;
    Net net(4, 13);
    manual_seed(13);
    auto model = nn::Sequential(nn::LearnedPositionalEmbedding(10, 8, {.batch_first = true}), nn::Flatten(),
                                nn::Linear(48, 3));
    check_same_state(net, model);
    check_same_losses(net, model, batch, 20, {.lr = 1e-2}, [](auto&, auto&) {});
    // Rows 6 to 9 get no gradient: they hold their initial values.
    Net fresh(4, 13);
    const auto trained = net.state_dict()[0].second, initial = fresh.state_dict()[0].second;
    CHECK(std::equal(trained.span().begin() + 48, trained.span().end(), initial.span().begin() + 48));
    CHECK(trained[0] != initial[0]);
  }
  SUBCASE("sinusoidal: the buffer pe") {
    using Net = Sequential<policy::cpu, Input<6, 8>, SinusoidalPositionalEncoding<10>, Flatten, Dense<3>>;
    Net net(4, 14);
    manual_seed(14);
    auto model = nn::Sequential(nn::SinusoidalPositionalEncoding(8, 10, {.batch_first = true}), nn::Flatten(),
                                nn::Linear(48, 3));
    check_same_state(net, model);
    check_same_losses(net, model, batch, 20, {.lr = 1e-2}, [](auto&, auto&) {});
  }
}

TEST_CASE("Labels per position: an output [L, C] trains on labels [N, L] with the mean over every position") {
  using Net = Sequential<policy::cpu, Input<5, 6>, TimeDistributed<Dense<4>>>;
  Net net(3, 2);
  random_generator rng(5);
  Tensor<float> x(shape{3, 5, 6});
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> per_position(shape{3, 5});
  for (auto& l : per_position.span()) l = static_cast<std::int64_t>(rng.below(4));
  const Tensor<float> logits = net.predict(x.view());
  double expected = 0;
  for (index_t r = 0; r < 15; ++r) {
    double total = 0;
    for (index_t c = 0; c < 4; ++c) total += std::exp(static_cast<double>(logits[r * 4 + c]));
    expected += std::log(total) - logits[r * 4 + per_position[r]];
  }
  CHECK(net.loss_value(x.view(), per_position.view(), loss::cross_entropy{}) == doctest::Approx(expected / 15));
  // One label per sample still means the whole output is the classes.
  Tensor<std::int64_t> per_sample(shape{3}, {0, 19, 7});
  CHECK(std::isfinite(net.loss_value(x.view(), per_sample.view(), loss::cross_entropy{})));
  Tensor<std::int64_t> wrong(shape{3, 4});
  CHECK_THROWS_WITH_AS(net.loss_value(x.view(), wrong.view(), loss::cross_entropy{}),
                       doctest::Contains("one per position"), kiln::error);
}

TEST_CASE("Tiny GPT: static and dynamic mode from one seed, the same weights and the same losses over 20 steps") {
  constexpr index_t layers = 2, width = 16, heads = 2, context = 12, n = 3;
  using Net = examples::StaticTinyGPT<layers, width, heads, context>;
  static_assert(std::is_same_v<Net::output_shape, dims<context, 256>>);
  Net net(n, 42);
  manual_seed(42);
  examples::TinyGPT model({.layers = layers, .width = width, .heads = heads, .context = context});
  // The same values in the same order under each mode's names ("0.weight" is "tokens.weight", ...).
  const auto static_dict = net.state_dict(), dynamic_dict = model.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  std::vector<std::string> dynamic_order;
  for (const auto& entry : dynamic_dict) dynamic_order.push_back(entry.first);
  std::map<std::string, std::string> counterpart{{"0.weight", "tokens.weight"}, {"1.weight", "positions.weight"}};
  for (const auto& [name, tensor] : static_dict) {
    std::string twin;
    if (counterpart.contains(name)) {
      twin = counterpart[name];
    } else {
      const auto dot = name.find('.');
      const int layer = std::stoi(name.substr(0, dot));
      const std::string rest = name.substr(dot + 1);
      twin = layer < 2 + layers ? "trunk.layers." + std::to_string(layer - 2) + "." + rest
             : layer == 2 + layers ? "trunk.norm." + rest
                                   : "head." + rest;
    }
    CAPTURE(name);
    CAPTURE(twin);
    const auto found = std::find_if(dynamic_dict.begin(), dynamic_dict.end(),
                                    [&](const auto& entry) { return entry.first == twin; });
    REQUIRE(found != dynamic_dict.end());
    CHECK(std::equal(tensor.span().begin(), tensor.span().end(), found->second.span().begin()));
  }

  random_generator rng(3);
  Tensor<float> ids(shape{n, context});
  Tensor<std::int64_t> next(shape{n, context});
  for (auto& v : ids.span()) v = static_cast<float>(rng.below(256));
  for (index_t i = 0; i < n * context; ++i)
    next[i] = i % context + 1 < context ? static_cast<std::int64_t>(ids[i + 1]) : std::int64_t(rng.below(256));
  const optim::adamw_options options{.lr = 3e-3, .weight_decay = 0.01, .clip = {.norm = 1.0}};
  optim::AdamW static_opt(options);
  optim::AdamW dynamic_opt(model.parameters(), options);
  const nn::Variable input(ids);
  for (int step = 0; step < 20; ++step) {
    CAPTURE(step);
    const float s = net.train_step(ids.view(), next.view(), loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    nn::Variable logits = model(input);
    nn::Variable l = nn::cross_entropy(nn::view(logits, {n * context, 256}), next.span());
    l.backward();
    dynamic_opt.step();
    REQUIRE(s == l.item());
  }
  // A static step allocates nothing.
  const long long before = kiln_test::heap_allocations.load();
  net.train_step(ids.view(), next.view(), loss::cross_entropy{}, static_opt);
  CHECK(kiln_test::heap_allocations.load() - before == 0);
}

TEST_CASE("Token layers: Patches cuts an image as dynamic mode's view-permute does, and its backward puts it back") {
  using Bound = Patches<2>::bind<dims<3, 4, 6>>;
  static_assert(std::is_same_v<Bound::output, dims<6, 12>>);
  Tensor<float> image(shape{2, 3, 4, 6});
  for (index_t i = 0; i < image.numel(); ++i) image[i] = static_cast<float>(i);
  Tensor<float> tokens(shape{2, 6, 12}), back(shape{2, 3, 4, 6});
  const layer_context ctx{2, true};
  Bound::forward<policy::cpu, float>(nullptr, nullptr, image.data(), tokens.data(), nullptr, ctx, false);
  // [N, C, H, W] -> [N, rows, cols, C, P, P] with nn's ops: the reference.
  const nn::Variable cut = nn::permute(nn::view(nn::Variable(image), {2, 3, 2, 2, 3, 2}), {0, 2, 4, 1, 3, 5});
  const nn::Variable reference = nn::reshape(cut, {2, 6, 12});
  CHECK(std::equal(tokens.span().begin(), tokens.span().end(), reference.data()));
  Bound::backward<policy::cpu, float>(nullptr, nullptr, nullptr, tokens.data(), back.data(), nullptr, nullptr, ctx);
  CHECK(std::equal(back.span().begin(), back.span().end(), image.span().begin()));
}

TEST_CASE("ViT: static and dynamic mode from one seed, the same weights and the same losses over 20 steps") {
  constexpr index_t layers = 1, width = 16, heads = 2, n = 4;
  using Net = examples::StaticViT<layers, width, heads>;
  Net net(n, 5);
  manual_seed(5);
  examples::VisionTransformer vit(width, heads, layers);
  std::map<std::string, std::string> counterpart{{"1.weight", "embed.weight"},   {"1.bias", "embed.bias"},
                                                 {"2.class_token", "class_token"}, {"3.weight", "positions.weight"},
                                                 {"5.weight", "encoder.norm.weight"}, {"5.bias", "encoder.norm.bias"},
                                                 {"7.weight", "head.weight"},     {"7.bias", "head.bias"}};
  const auto dynamic_dict = vit.state_dict();
  const auto static_dict = net.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  for (const auto& [name, tensor] : static_dict) {
    const std::string twin = counterpart.contains(name) ? counterpart[name] : "encoder.layers.0." + name.substr(2);
    CAPTURE(name);
    const auto found = std::find_if(dynamic_dict.begin(), dynamic_dict.end(),
                                    [&](const auto& entry) { return entry.first == twin; });
    REQUIRE(found != dynamic_dict.end());
    CHECK(found->second.shape() == tensor.shape());
    CHECK(std::equal(tensor.span().begin(), tensor.span().end(), found->second.span().begin()));
  }
  random_generator rng(8);
  Tensor<float> x(shape{n, 28, 28});
  for (auto& v : x.span()) v = rng.normal<float>();
  const Tensor<std::int64_t> y(shape{n}, {3, 1, 4, 1});
  optim::AdamW static_opt({.lr = 1e-2});
  optim::AdamW dynamic_opt(vit.parameters(), {.lr = 1e-2});
  const nn::Variable input(x);
  for (int step = 0; step < 20; ++step) {
    CAPTURE(step);
    const float s = net.train_step(x.view(), y.view(), loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    nn::Variable l = nn::cross_entropy(vit(input), y.span());
    l.backward();
    dynamic_opt.step();
    REQUIRE(s == l.item());
  }
}
