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
// --mode static trains examples::StaticTinyGPT, the same model in static mode (default sizes, no dropout); --mode
// both trains each from the seed, dynamic mode first: the same weights, so the same losses.
//
//   tiny_gpt [--mode dynamic|static|both] [--epochs 4] [--minutes 0] [--layers 4] [--width 128] [--heads 4]
//            [--context 128] [--batch 32] [--lr 2e-3] [--dropout 0] [--limit-steps 0] [--data DIR] [--threads 1]
//            [--seed 42]
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

// The logits at position length - 1 of one sequence's logits [length, 256]: those of the next byte.
std::vector<float> last_logits(const float* logits, index_t length) {
  const float* last = logits + (length - 1) * data::byte_vocabulary::size;
  return {last, last + data::byte_vocabulary::size};
}

// The model in dynamic mode: TinyGPT, any size.
struct dynamic_gpt {
  dynamic_gpt(const gpt_options& o, std::uint64_t seed, const optim::adamw_options& adamw)
      : model((manual_seed(seed), o)), opt(model.parameters(), adamw) {}
  float step(const tensor_view<const float>& x, const tensor_view<const std::int64_t>& y) {
    opt.zero_grad();
    nn::Variable loss = next_token_loss(model(nn::Variable(Tensor<float>(x))), y);
    loss.backward();
    opt.step();
    return loss.item();
  }
  double loss(const tensor_view<const float>& x, const tensor_view<const std::int64_t>& y) {
    nn::no_grad guard;
    model.eval();
    const double value = next_token_loss(model(nn::Variable(Tensor<float>(x))), y).item();
    model.train();
    return value;
  }
  // The logits after the last of `ids` (at most the context).
  std::vector<float> next_logits(const std::vector<float>& ids) {
    nn::no_grad guard;
    model.eval();
    const nn::Variable logits = model(nn::Variable(Tensor<float>(shape{1, static_cast<index_t>(ids.size())}, ids)));
    model.train();
    return last_logits(logits.data(), static_cast<index_t>(ids.size()));
  }
  index_t parameter_count() const { return model.parameter_count(); }

  TinyGPT model;
  optim::AdamW opt;
};

// The model in static mode: StaticTinyGPT at the default size (sizes are template arguments), the same weights as
// dynamic mode's from the same seed.
constexpr gpt_options static_size{};
using StaticNet = examples::StaticTinyGPT<static_size.layers, static_size.width, static_size.heads, static_size.context>;
struct static_gpt {
  static_gpt(index_t batch, std::uint64_t seed, const optim::adamw_options& adamw) : net(batch, seed), opt(adamw) {}
  float step(const tensor_view<const float>& x, const tensor_view<const std::int64_t>& y) {
    return net.train_step(x, y, loss::cross_entropy{}, opt);
  }
  double loss(const tensor_view<const float>& x, const tensor_view<const std::int64_t>& y) {
    net.eval();
    const double value = net.loss_value(x, y, loss::cross_entropy{});
    net.train();
    return value;
  }
  // A window shorter than the context is padded after its end: under the causal mask the padding does not reach
  // the positions before it.
  std::vector<float> next_logits(const std::vector<float>& ids) {
    Tensor<float> window(shape{1, static_size.context}, 0.0f);
    std::copy(ids.begin(), ids.end(), window.span().begin());
    net.eval();
    const Tensor<float> logits = net.predict(window.view());
    net.train();
    return last_logits(logits.data(), static_cast<index_t>(ids.size()));
  }
  index_t parameter_count() const { return StaticNet::parameter_count(); }

  StaticNet net;
  optim::AdamW opt;
};

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
template <class Gpt>
std::string generate(Gpt& gpt, const std::string& prompt, index_t count, index_t context, double temperature,
                     random_generator& rng) {
  std::vector<std::uint8_t> text = data::byte_vocabulary::encode(prompt);
  for (index_t n = 0; n < count; ++n) {
    const index_t length = std::min<index_t>(context, static_cast<index_t>(text.size()));
    std::vector<float> ids(static_cast<std::size_t>(length));
    for (index_t j = 0; j < length; ++j) ids[j] = text[text.size() - static_cast<std::size_t>(length - j)];
    const std::vector<float> last = gpt.next_logits(ids);
    index_t pick = std::max_element(last.begin(), last.end()) - last.begin();
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
  std::string out = data::byte_vocabulary::decode(std::span(text).subspan(prompt.size()));
  for (char& c : out)
    if (c != '\n' && (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126)) c = '?';
  return out;
}

// What a run of one mode prints and reports.
struct run_settings {
  gpt_options model;
  index_t batch;
  int epochs;
  double minutes, lr;
  index_t limit_steps;
  std::uint64_t seed;
};

// The mean loss over every window of `windows` (evaluation mode).
template <class Gpt>
double mean_loss(Gpt& gpt, const data::text_windows<float>& windows, index_t batch) {
  data::data_loader loader(windows, {.batch_size = batch, .shuffle = false});
  double total = 0;
  index_t count = 0;
  for (const auto& b : loader.epoch(0)) {
    total += gpt.loss(b.x, b.y) * static_cast<double>(b.size);
    count += b.size;
  }
  return total / static_cast<double>(std::max<index_t>(count, 1));
}

// Trains `gpt` (either mode) with AdamW on a one-cycle schedule and prints each epoch, samples and the RESULT line.
template <class Gpt>
void train_and_report(Gpt& gpt, const char* mode, const run_settings& r,
                      const data::text_windows<float>& train_windows, const data::text_windows<float>& validation,
                      double bigram) {
  data::data_loader loader(train_windows, {.batch_size = r.batch, .shuffle = true, .drop_last = true, .seed = r.seed});
  const index_t steps_per_epoch = r.limit_steps > 0 ? std::min(r.limit_steps, loader.batches_per_epoch())
                                                    : loader.batches_per_epoch();
  optim::OneCycleLR schedule(gpt.opt, {.max_lr = r.lr, .total_steps = r.epochs * steps_per_epoch, .pct_start = 0.1,
                                       .div_factor = 10, .final_div_factor = 10});
  std::printf("%s mode: %lld parameters, %lld steps per epoch\n", mode,
              static_cast<long long>(gpt.parameter_count()), static_cast<long long>(steps_per_epoch));
  const auto start = std::chrono::steady_clock::now();
  double validation_loss = 0, train_loss = 0;
  long long steps = 0;
  int epoch = 0;
  bool out_of_time = false;
  for (; epoch < r.epochs && !out_of_time; ++epoch) {
    double total = 0;
    index_t count = 0;
    for (const auto& b : loader.epoch(static_cast<std::uint64_t>(epoch))) {
      if (b.index >= steps_per_epoch) break;
      total += gpt.step(b.x, b.y);
      schedule.step();
      ++count;
      ++steps;
      if (r.minutes > 0 && examples::seconds_since(start) > 60 * r.minutes) {
        out_of_time = true;
        break;
      }
    }
    train_loss = total / static_cast<double>(std::max<index_t>(count, 1));
    validation_loss = mean_loss(gpt, validation, r.batch);
    std::printf("%s epoch %d: train %.4f nats (%.3f bits/char), validation %.4f nats (%.3f bits/char), %.0f s\n", mode,
                epoch + 1, train_loss, train_loss / std::log(2.0), validation_loss, validation_loss / std::log(2.0),
                examples::seconds_since(start));
    std::fflush(stdout);
  }
  const double train_s = examples::seconds_since(start);
  random_generator sampling(r.seed, 7);
  std::printf("greedy:          \"The %s\"\n", generate(gpt, "The ", 120, r.model.context, 0.0, sampling).c_str());
  std::printf("temperature 0.8: \"The %s\"\n", generate(gpt, "The ", 120, r.model.context, 0.8, sampling).c_str());
  std::printf("RESULT example=tiny_gpt mode=%s epochs=%d steps=%lld train_loss=%.4f val_loss=%.4f "
              "val_bpc=%.4f bigram_loss=%.4f below_bigram=%.3f train_s=%.1f step_ms=%.1f\n",
              mode, epoch, steps, train_loss, validation_loss, validation_loss / std::log(2.0), bigram,
              1.0 - validation_loss / bigram, train_s, 1e3 * train_s / static_cast<double>(std::max(1LL, steps)));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--epochs", "--minutes", "--layers", "--width", "--heads", "--context", "--batch", "--lr",
                         "--dropout", "--limit-steps", "--data", "--seed", "--mode"});
  run_settings r;
  r.model.layers = flags.get_int("--layers", 4);
  r.model.width = flags.get_int("--width", 128);
  r.model.heads = flags.get_int("--heads", 4);
  r.model.context = flags.get_int("--context", 128);
  r.model.dropout = flags.get_double("--dropout", 0.0);
  r.batch = flags.get_int("--batch", 32);
  r.epochs = static_cast<int>(flags.get_int("--epochs", 4));
  r.minutes = flags.get_double("--minutes", 0.0);
  r.lr = flags.get_double("--lr", 2e-3);
  r.limit_steps = flags.get_int("--limit-steps", 0);
  r.seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  const std::string mode = flags.get("--mode", "dynamic");
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  set_num_threads(threads);
  if (mode != "dynamic" && mode != "static" && mode != "both")
    fail("tiny_gpt: --mode is dynamic, static or both, found '", mode, "'");
  if (mode != "dynamic" && (r.model.layers != static_size.layers || r.model.width != static_size.width ||
                            r.model.heads != static_size.heads || r.model.context != static_size.context ||
                            r.model.dropout != 0.0))
    fail("tiny_gpt: static mode is compiled for ", static_size.layers, " layers of width ", static_size.width, ", ",
         static_size.heads, " heads, context ", static_size.context,
         " and no dropout (StaticNet in examples/tiny_gpt.cpp); other sizes run with --mode dynamic");

  const auto corpus = data::load_text_corpus(data::find_data_dir("text", flags.get("--data", "")));
  const data::text_windows<float> train_windows(corpus.train, r.model.context),
      validation(corpus.validation, r.model.context);
  const double bigram = bigram_loss(corpus.train, corpus.validation);
  std::printf("TinyGPT: %d layers, width %lld, %lld heads, context %lld; batch %lld, %d thread%s\n"
              "text: %zu training and %zu validation bytes from %zu files\n",
              static_cast<int>(r.model.layers), static_cast<long long>(r.model.width),
              static_cast<long long>(r.model.heads), static_cast<long long>(r.model.context),
              static_cast<long long>(r.batch), threads, threads == 1 ? "" : "s", corpus.train.size(),
              corpus.validation.size(), corpus.files.size());
  std::printf("bigram baseline: validation %.4f nats, %.4f bits per character\n", bigram, bigram / std::log(2.0));

  const optim::adamw_options adamw{.lr = r.lr, .weight_decay = 0.01, .clip = {.norm = 1.0}};
  if (mode != "static") {
    dynamic_gpt gpt(r.model, r.seed, adamw);
    train_and_report(gpt, "dynamic", r, train_windows, validation, bigram);
  }
  if (mode != "dynamic") {
    auto gpt = std::make_unique<static_gpt>(r.batch, r.seed, adamw);
    train_and_report(*gpt, "static", r, train_windows, validation, bigram);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "tiny_gpt: %s\n", e.what());
  return 1;
}
