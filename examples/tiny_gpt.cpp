// A decoder-only transformer (a tiny GPT) trained on English text, one byte per token: the model a PyTorch user writes
// from nn.Embedding, a learned position table, nn.TransformerEncoderLayer blocks under the causal mask (pre-norm,
// GELU), a final LayerNorm and a Linear head, trained with AdamW on a one-cycle schedule in the manual loop.
//
//   tokens [N, L] -> Embedding(256, d) + positions -> CausalTransformerLayer x layers -> LayerNorm -> Linear(d, 256)
//
// It prints each epoch's training and validation loss in nats and bits per character, the loss of the best add-k
// bigram model of the training text (the baseline every language model must beat), and text sampled from the model
// (greedy and at a temperature, seeded). The data is the fortune collection in ../shared/data/text/, the last 10% of
// each file held out (data/text.hpp).
//
//   tiny_gpt [--epochs 4] [--minutes 0] [--layers 4] [--width 128] [--heads 4] [--context 128] [--batch 32]
//            [--lr 2e-3] [--dropout 0] [--limit-steps 0] [--data DIR] [--threads 1] [--seed 42]
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "tiny_gpt_net.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/text.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/optim/lr_scheduler.hpp"

using namespace kiln;
using kiln::examples::gpt_options;
using kiln::examples::TinyGPT;

namespace {

// Mean cross-entropy in nats of logits [N, L, V] against targets [N, L].
nn::Variable next_token_loss(const nn::Variable& logits, tensor_view<const std::int64_t> targets) {
  const index_t rows = logits.shape()[0] * logits.shape()[1];
  return nn::cross_entropy(nn::view(logits, {rows, logits.shape()[2]}),
                           std::span<const std::int64_t>(targets.data(), static_cast<std::size_t>(rows)));
}

// The mean loss over every window of `windows` (evaluation mode, no autograd).
double mean_loss(TinyGPT& model, const data::text_windows<float>& windows, index_t batch) {
  nn::no_grad guard;
  model.eval();
  data::data_loader loader(windows, {.batch_size = batch, .shuffle = false});
  double total = 0;
  index_t count = 0;
  for (const auto& b : loader.epoch(0)) {
    const nn::Variable logits = model(nn::Variable(Tensor<float>(b.x)));
    total += static_cast<double>(next_token_loss(logits, b.y).item()) * static_cast<double>(b.size);
    count += b.size;
  }
  model.train();
  return total / static_cast<double>(std::max<index_t>(count, 1));
}

// The validation loss in nats of the bigram model P(b | a) = (count(a b) + k) / (count(a) + 256 k) from the training
// text, with the best k of a few (a stronger baseline than add-one alone).
double bigram_loss(const std::vector<std::uint8_t>& train, const std::vector<std::uint8_t>& validation) {
  std::vector<double> pairs(256 * 256, 0.0), firsts(256, 0.0);
  for (std::size_t i = 0; i + 1 < train.size(); ++i) {
    pairs[train[i] * 256u + train[i + 1]] += 1;
    firsts[train[i]] += 1;
  }
  double best = INFINITY;
  for (double k : {1.0, 0.3, 0.1, 0.03, 0.01}) {
    double total = 0;
    for (std::size_t i = 0; i + 1 < validation.size(); ++i) {
      const unsigned a = validation[i], b = validation[i + 1];
      total -= std::log((pairs[a * 256u + b] + k) / (firsts[a] + 256 * k));
    }
    best = std::min(best, total / static_cast<double>(validation.size() - 1));
  }
  return best;
}

// `count` bytes generated after `prompt`: greedy at temperature 0, else sampled from softmax(logits / temperature).
std::string generate(TinyGPT& model, const std::string& prompt, index_t count, index_t context, double temperature,
                     random_generator& rng) {
  nn::no_grad guard;
  model.eval();
  std::vector<std::uint8_t> text = data::byte_vocabulary::encode(prompt);
  for (index_t n = 0; n < count; ++n) {
    const index_t length = std::min<index_t>(context, static_cast<index_t>(text.size()));
    Tensor<float> ids(shape{1, length});
    for (index_t j = 0; j < length; ++j) ids[j] = text[text.size() - static_cast<std::size_t>(length - j)];
    const nn::Variable logits = model(nn::Variable(ids));
    const float* last = logits.data() + (length - 1) * data::byte_vocabulary::size;
    index_t pick = std::max_element(last, last + 256) - last;
    if (temperature > 0) {
      std::array<double, 256> p{};
      double total = 0;
      for (int v = 0; v < 256; ++v) total += p[v] = std::exp((last[v] - last[pick]) / temperature);
      double u = rng.uniform<double>() * total;
      for (pick = 0; pick < 255 && (u -= p[pick]) > 0; ++pick) {
      }
    }
    text.push_back(static_cast<std::uint8_t>(pick));
  }
  model.train();
  std::string out = data::byte_vocabulary::decode(std::span(text).subspan(prompt.size()));
  for (char& c : out)
    if (c != '\n' && (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126)) c = '?';
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--epochs", "--minutes", "--layers", "--width", "--heads", "--context", "--batch", "--lr",
                         "--dropout", "--limit-steps", "--data", "--seed"});
  gpt_options o;
  o.layers = flags.get_int("--layers", 4);
  o.width = flags.get_int("--width", 128);
  o.heads = flags.get_int("--heads", 4);
  o.context = flags.get_int("--context", 128);
  o.dropout = flags.get_double("--dropout", 0.0);
  const index_t batch = flags.get_int("--batch", 32);
  const int epochs = static_cast<int>(flags.get_int("--epochs", 4));
  const double minutes = flags.get_double("--minutes", 0.0);
  const double lr = flags.get_double("--lr", 2e-3);
  const index_t limit_steps = flags.get_int("--limit-steps", 0);
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);

  const auto corpus = data::load_text_corpus(data::find_data_dir("text", flags.get("--data", "")));
  const data::text_windows<float> train(corpus.train, o.context), validation(corpus.validation, o.context);
  const double bigram = bigram_loss(corpus.train, corpus.validation);

  manual_seed(seed);
  TinyGPT model(o);
  data::data_loader loader(train, {.batch_size = batch, .shuffle = true, .drop_last = true, .seed = seed});
  const index_t steps_per_epoch = limit_steps > 0 ? std::min(limit_steps, loader.batches_per_epoch())
                                                  : loader.batches_per_epoch();
  optim::AdamW opt(model.parameters(), {.lr = lr, .weight_decay = 0.01, .clip = {.norm = 1.0}});
  optim::OneCycleLR schedule(opt, {.max_lr = lr, .total_steps = epochs * steps_per_epoch, .pct_start = 0.1,
                                   .div_factor = 10, .final_div_factor = 10});
  std::printf("TinyGPT: %d layers, width %lld, %lld heads, context %lld, %lld parameters; batch %lld, %d thread%s\n"
              "text: %zu training and %zu validation bytes from %zu files; %lld steps per epoch\n",
              static_cast<int>(o.layers), static_cast<long long>(o.width), static_cast<long long>(o.heads),
              static_cast<long long>(o.context), static_cast<long long>(model.parameter_count()),
              static_cast<long long>(batch), threads, threads == 1 ? "" : "s", corpus.train.size(),
              corpus.validation.size(), corpus.files.size(), static_cast<long long>(steps_per_epoch));
  std::printf("bigram baseline: validation %.4f nats, %.4f bits per character\n", bigram, bigram / std::log(2.0));

  const auto start = std::chrono::steady_clock::now();
  double validation_loss = 0, train_loss = 0;
  long long steps = 0;
  int epoch = 0;
  bool out_of_time = false;
  for (; epoch < epochs && !out_of_time; ++epoch) {
    double total = 0;
    index_t count = 0;
    for (const auto& b : loader.epoch(static_cast<std::uint64_t>(epoch))) {
      if (b.index >= steps_per_epoch) break;
      opt.zero_grad();
      nn::Variable loss = next_token_loss(model(nn::Variable(Tensor<float>(b.x))), b.y);
      loss.backward();
      opt.step();
      schedule.step();
      total += loss.item();
      ++count;
      ++steps;
      if (minutes > 0 && examples::seconds_since(start) > 60 * minutes) {
        out_of_time = true;
        break;
      }
    }
    train_loss = total / static_cast<double>(std::max<index_t>(count, 1));
    validation_loss = mean_loss(model, validation, batch);
    std::printf("epoch %d: train %.4f nats (%.3f bits/char), validation %.4f nats (%.3f bits/char), %.0f s\n",
                epoch + 1, train_loss, train_loss / std::log(2.0), validation_loss, validation_loss / std::log(2.0),
                examples::seconds_since(start));
    std::fflush(stdout);
  }
  const double train_s = examples::seconds_since(start);
  random_generator sampling(seed, 7);
  std::printf("greedy:          \"The %s\"\n", generate(model, "The ", 120, o.context, 0.0, sampling).c_str());
  std::printf("temperature 0.8: \"The %s\"\n", generate(model, "The ", 120, o.context, 0.8, sampling).c_str());
  std::printf("RESULT example=tiny_gpt mode=dynamic epochs=%d steps=%lld train_loss=%.4f val_loss=%.4f "
              "val_bpc=%.4f bigram_loss=%.4f below_bigram=%.3f train_s=%.1f step_ms=%.1f\n",
              epoch, steps, train_loss, validation_loss, validation_loss / std::log(2.0), bigram,
              1.0 - validation_loss / bigram, train_s, 1e3 * train_s / static_cast<double>(std::max(1LL, steps)));
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "tiny_gpt: %s\n", e.what());
  return 1;
}
