// Ensembles: five MNIST MLPs (Flatten -> Dense 128 ReLU -> Dense 10) trained from different seeds, alternately in
// static and dynamic mode (--mode mixed, the default), combined by kiln::ensemble: the mean of their softmax
// probabilities and a majority vote. Prints each model's test accuracy and the ensemble's.
//
//   ensemble [--models 5] [--mode mixed|static|dynamic] [--epochs 1] [--data DIR] [--threads N] [--seed 42]
#include <cstdio>
#include <list>
#include <string>

#include "common.hpp"
#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"
#include "kiln/train/ensemble.hpp"

using namespace kiln;

using static_mlp = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--models", "--seed"});
  int count = static_cast<int>(flags.get_int("--models", 5));
  int epochs = static_cast<int>(flags.get_int("--epochs", 1));
  std::string mode = flags.get("--mode", "mixed");
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  set_num_threads(static_cast<int>(flags.get_int("--threads", 1)));
  if (mode != "mixed" && mode != "static" && mode != "dynamic")
    fail("ensemble: expected --mode mixed|static|dynamic, found ", mode);

  auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
  data::mnist_options normalise{.scale = true, .mean = data::mnist_mean, .std = data::mnist_std};
  auto train = data::load_mnist(dir, data::split::train, normalise);
  auto test = data::load_mnist(dir, data::split::test, normalise);
  std::printf("MNIST from %s: %d MLPs (%s mode), %d epoch%s each\n", dir.string().c_str(), count, mode.c_str(), epochs,
              epochs == 1 ? "" : "s");

  std::list<static_mlp> static_models;  // stable addresses: the ensemble references its models
  std::list<nn::Sequential> dynamic_models;
  ensemble ens;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    std::uint64_t s = seed + static_cast<std::uint64_t>(i);
    bool dynamic = mode == "dynamic" || (mode == "mixed" && i % 2 == 1);
    double acc;
    auto fit = [&](auto& net) {
      Model model(net);
      model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
      model.fit(train, {.epochs = epochs, .batch_size = 64, .verbose = 0, .seed = s});
      return model.evaluate(test)["accuracy"];
    };
    if (dynamic) {
      manual_seed(s);
      auto& m = dynamic_models.emplace_back(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
      acc = fit(m);
      ens.add(m);
    } else {
      auto& net = static_models.emplace_back(64, s);
      acc = fit(net);
      ens.add(net);
    }
    std::printf("model %d (%s, seed %llu): test accuracy %.4f\n", i, dynamic ? "dynamic" : "static",
                static_cast<unsigned long long>(s), acc);
    std::printf("RESULT example=ensemble model=%d mode=%s seed=%llu test_acc=%.4f\n", i,
                dynamic ? "dynamic" : "static", static_cast<unsigned long long>(s), acc);
  }
  double average = ensemble::accuracy(ensemble::argmax(ens.predict(test.features())), test.labels());
  double vote = ensemble::accuracy(ens.vote(test.features()), test.labels());
  std::printf("ensemble of %d: test accuracy %.4f (mean probabilities), %.4f (majority vote)\n", count, average, vote);
  std::printf("RESULT example=ensemble models=%d mode=%s average_acc=%.4f vote_acc=%.4f seconds=%.2f\n", count,
              mode.c_str(), average, vote, examples::seconds_since(start));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ensemble: %s\n", e.what());
  return 1;
}
