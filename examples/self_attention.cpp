// A module of one's own in dynamic mode: multi-head self-attention written by hand with the tensor ops (chunk, view,
// transpose, matmul, masked_fill, softmax), as one would write it in PyTorch. It classifies MNIST digits read as
// sequences of 28 rows of 28 pixels: each row becomes a token of width 64, the tokens attend to one another, and a
// Linear reads all of them.
//   nn::Sequential(nn::Linear(28, 64), SelfAttention(64, 4), nn::ReLU(), nn::Flatten(), nn::Linear(28 * 64, 10))
//
//   self_attention [--epochs 1] [--causal] [--limit N] [--data DIR] [--threads N] [--seed 42]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "common.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

// Multi-head self-attention over [batch, length, width]; with causal, a token sees only itself and the ones before.
struct SelfAttention : nn::Module {
  SelfAttention(index_t width, index_t heads, bool causal = false) : heads(heads), causal(causal) {
    qkv = register_module("qkv", nn::Linear(width, 3 * width));
    out = register_module("out", nn::Linear(width, width));
  }
  nn::Variable forward(const nn::Variable& x) override {
    const index_t B = x.shape()[0], L = x.shape()[1], W = x.shape()[2], D = W / heads;
    auto parts = nn::chunk((*qkv)(x), 3, -1);  // q, k, v: [B, L, W]
    auto split_heads = [&](const nn::Variable& t) { return nn::transpose(nn::view(t, {B, L, heads, D}), 1, 2); };
    auto q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);  // [B, heads, L, D]
    auto scores = nn::matmul(q, nn::transpose(k, -2, -1)) / std::sqrt(float(D));        // [B, heads, L, L]
    if (causal) {
      Tensor<float> later({L, L});  // 1 where the key comes after the query
      for (index_t i = 0; i < L; ++i)
        for (index_t j = i + 1; j < L; ++j) later.at(i, j) = 1;
      scores = nn::masked_fill(scores, nn::Variable(later), -1e9f);
    }
    auto mixed = nn::matmul(nn::softmax(scores, -1), v);                     // [B, heads, L, D]
    return (*out)(nn::reshape(nn::transpose(mixed, 1, 2), {B, L, W}));      // heads side by side again
  }
  std::string name() const override { return "SelfAttention"; }

  index_t heads;
  bool causal;
  std::shared_ptr<nn::Linear> qkv, out;
};

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--causal", "--data", "--epochs", "--limit", "--seed"});
  const int epochs = static_cast<int>(flags.get_int("--epochs", 1));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const index_t limit = flags.get_int("--limit", 0);
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const bool causal = flags.has("--causal");
  set_num_threads(threads);
  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  auto train =
      data::load_mnist(dir, data::split::train, {.mean = data::mnist_mean, .std = data::mnist_std, .limit = limit});
  auto test = data::load_mnist(dir, data::split::test, {.mean = data::mnist_mean, .std = data::mnist_std});

  manual_seed(seed);
  auto model = nn::Sequential(nn::Linear(28, 64), SelfAttention(64, 4, causal), nn::ReLU(), nn::Flatten(),
                              nn::Linear(28 * 64, 10));
  std::printf("MNIST as sequences of 28 rows: %s\n%lld training images, %d epoch%s, %d thread%s\n",
              model.to_string().c_str(), static_cast<long long>(train.size()), epochs, epochs == 1 ? "" : "s",
              threads, threads == 1 ? "" : "s");
  Model fit_model(model);
  fit_model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
  const auto start = std::chrono::steady_clock::now();
  fit_model.fit(train, {.epochs = epochs, .batch_size = 64, .seed = seed});
  const double train_s = examples::seconds_since(start);
  const auto result = fit_model.evaluate(test);
  std::printf("RESULT example=self_attention causal=%d epochs=%d test_acc=%.4f train_s=%.2f step_us=%.1f\n",
              causal ? 1 : 0, epochs, result["accuracy"], train_s, fit_model.timing().step_microseconds());
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "self_attention: %s\n", e.what());
  return 1;
}
