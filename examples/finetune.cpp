// Fine-tuning: pre-train an MLP on MNIST digits 0-4, save its weights (safetensors, PyTorch's names), load them into
// a model whose head is replaced by a new 5-way layer, freeze (part of) the body and train the rest on a few hundred
// samples of digits 5-9. The same small sample trains a model from scratch for comparison; both are tested on all
// test images of digits 5-9. In static mode the head is a different type (Dense<5>) and the body is frozen with
// net.freeze(i); in dynamic mode the head is swapped with erase/push_back and the body frozen with
// set_requires_grad(false).
//
// --frozen N freezes the first N of the body's two Dense layers (default 1: the first layer stays as pre-trained, the
// second and the new head adapt).
//
//   finetune [--mode static|dynamic|both] [--samples 300] [--frozen 1] [--pretrain-epochs 1] [--epochs 30] [--data DIR]
//            [--threads N] [--seed 42]
#include <cstdio>
#include <filesystem>
#include <string>

#include "common.hpp"
#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;
using dataset = data::tensor_dataset<float, std::int64_t>;

namespace {

// The samples whose label is in [low, low + 5), at most `limit` of them (0: all), relabelled 0-4 when `shift`.
dataset digits(const dataset& d, std::int64_t low, index_t limit, bool shift) {
  index_t n = 0;
  for (index_t i = 0; i < d.size() && (limit == 0 || n < limit); ++i) n += d.labels()[i] >= low && d.labels()[i] < low + 5;
  Tensor<float> x(shape{n, 28, 28});
  Tensor<std::int64_t> y(shape{n});
  index_t k = 0;
  for (index_t i = 0; i < d.size() && k < n; ++i) {
    std::int64_t label = d.labels()[i];
    if (label < low || label >= low + 5) continue;
    std::copy_n(d.features().data() + i * 784, 784, x.data() + k * 784);
    y[k++] = shift ? label - low : label;
  }
  return {std::move(x), std::move(y)};
}

template <class Net>
double fit_and_test(Net& net, const dataset& train, const dataset& test, int epochs, std::uint64_t seed, double lr) {
  Model model(net);
  model.compile(optim::Adam({.lr = lr}), loss::cross_entropy{}, {metric::accuracy});
  model.fit(train, {.epochs = epochs, .batch_size = 32, .verbose = 0, .seed = seed});
  return model.evaluate(test)["accuracy"];
}

struct outcome {
  double pretrain_acc, finetuned_acc, scratch_acc;
};

using static_pre = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<256, ReLU>, Dense<128, ReLU>, Dense<10>>;
using static_fine = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<256, ReLU>, Dense<128, ReLU>, Dense<5>>;

outcome run_static(const dataset& pre_train, const dataset& pre_test, const dataset& few, const dataset& test,
                   int pre_epochs, int epochs, std::uint64_t seed, const std::filesystem::path& weights, int frozen) {
  outcome r{};
  static_pre pre(64, seed);
  r.pretrain_acc = fit_and_test(pre, pre_train, pre_test, pre_epochs, seed, 1e-3);
  io::save_weights(pre, weights);

  static_fine fine(64, seed + 1);
  // Torch names: 0 Flatten, 1 Linear, 2 ReLU, 3 Linear, 4 ReLU, 5 Linear (the head, left out: its shape changed).
  io::load_weights(fine, weights, {.exclude = {"5."}});
  // Layers in the type list after Input: 0 Flatten, 1 Dense<256>, 2 Dense<128>, 3 Dense<5>.
  for (int i = 1; i <= frozen; ++i) fine.freeze(static_cast<std::size_t>(i));
  r.finetuned_acc = fit_and_test(fine, few, test, epochs, seed, 1e-3);

  static_fine scratch(64, seed + 1);
  r.scratch_acc = fit_and_test(scratch, few, test, epochs, seed, 1e-3);
  return r;
}

nn::Sequential dynamic_mlp(std::uint64_t seed, index_t classes) {
  manual_seed(seed);
  return nn::Sequential(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 128), nn::ReLU(),
                        nn::Linear(128, classes));
}

outcome run_dynamic(const dataset& pre_train, const dataset& pre_test, const dataset& few, const dataset& test,
                    int pre_epochs, int epochs, std::uint64_t seed, const std::filesystem::path& weights, int frozen) {
  outcome r{};
  auto pre = dynamic_mlp(seed, 10);
  r.pretrain_acc = fit_and_test(pre, pre_train, pre_test, pre_epochs, seed, 1e-3);
  io::save_weights(pre, weights);

  auto fine = dynamic_mlp(seed + 1, 10);
  io::load_weights(fine, weights);  // the same architecture: every tensor loads
  manual_seed(seed + 2);
  fine.erase(5);  // replace the head
  fine.push_back(nn::Linear(128, 5));
  for (int i = 1; i <= frozen; ++i)  // modules 1 and 3 are the body's Linears
    for (auto& p : fine[static_cast<std::size_t>(2 * i - 1)].parameters())
      p.set_requires_grad(false);  // the optimizer skips frozen parameters
  r.finetuned_acc = fit_and_test(fine, few, test, epochs, seed, 1e-3);

  auto scratch = dynamic_mlp(seed + 1, 5);
  r.scratch_acc = fit_and_test(scratch, few, test, epochs, seed, 1e-3);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv,
                        {"--data", "--epochs", "--frozen", "--mode", "--pretrain-epochs", "--samples", "--seed"});
  std::string mode = flags.get("--mode", "both");
  index_t samples = flags.get_int("--samples", 300);
  int pre_epochs = static_cast<int>(flags.get_int("--pretrain-epochs", 1));
  int epochs = static_cast<int>(flags.get_int("--epochs", 30));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  int frozen = static_cast<int>(flags.get_int("--frozen", 1));
  if (frozen < 0 || frozen > 2) fail("finetune: expected --frozen 0, 1 or 2 (body layers frozen), found ", frozen);
  set_num_threads(static_cast<int>(flags.get_int("--threads", 1)));
  if (mode != "static" && mode != "dynamic" && mode != "both")
    fail("finetune: expected --mode static|dynamic|both, found ", mode);

  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  data::mnist_options normalise{.scale = true, .mean = data::mnist_mean, .std = data::mnist_std};
  auto train = data::load_mnist(dir, data::split::train, normalise);
  auto test = data::load_mnist(dir, data::split::test, normalise);
  dataset pre_train = digits(train, 0, 0, false), pre_test = digits(test, 0, 0, false);
  dataset few = digits(train, 5, samples, true), few_test = digits(test, 5, 0, true);
  std::printf("MNIST from %s: pre-training on %lld images of digits 0-4 (%d epoch%s); fine-tuning on %lld images of "
              "digits 5-9 (%d epochs), tested on %lld\n",
              dir.string().c_str(), static_cast<long long>(pre_train.size()), pre_epochs, pre_epochs == 1 ? "" : "s",
              static_cast<long long>(few.size()), epochs, static_cast<long long>(few_test.size()));

  auto weights = std::filesystem::temp_directory_path() / "kiln_finetune_pretrained.safetensors";
  for (const char* m : {"static", "dynamic"}) {
    if (mode != "both" && mode != m) continue;
    auto start = std::chrono::steady_clock::now();
    outcome r = std::string(m) == "static" ? run_static(pre_train, pre_test, few, few_test, pre_epochs, epochs, seed, weights, frozen)
                                           : run_dynamic(pre_train, pre_test, few, few_test, pre_epochs, epochs, seed, weights, frozen);
    std::printf("%-7s pre-trained accuracy on digits 0-4: %.4f | digits 5-9 from %lld samples: fine-tuned head %.4f, "
                "from scratch %.4f\n",
                m, r.pretrain_acc, static_cast<long long>(few.size()), r.finetuned_acc, r.scratch_acc);
    std::printf("RESULT example=finetune mode=%s samples=%lld pretrain_acc=%.4f finetuned_acc=%.4f scratch_acc=%.4f "
                "seconds=%.2f\n",
                m, static_cast<long long>(few.size()), r.pretrain_acc, r.finetuned_acc, r.scratch_acc,
                examples::seconds_since(start));
  }
  std::filesystem::remove(weights);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "finetune: %s\n", e.what());
  return 1;
}
