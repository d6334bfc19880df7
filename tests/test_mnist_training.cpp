// End to end on real data: one epoch of the MNIST MLP in static mode reaches >= 0.95 test accuracy, and the dynamic
// mode's first steps give the same losses on the same batches.
#include <doctest/doctest.h>

#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {
std::filesystem::path mnist_dir() {
  try {
    return data::find_data_dir("mnist");
  } catch (const kiln::error& e) {
    MESSAGE("MNIST not found, skipping: " << e.what());
    return {};
  }
}
using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
}  // namespace

TEST_CASE("one epoch of the static MNIST MLP reaches 0.95 test accuracy") {
  auto dir = mnist_dir();
  if (dir.empty()) return;
  data::mnist_options normalise{.scale = true, .mean = data::mnist_mean, .std = data::mnist_std};
  auto train = data::load_mnist(dir, data::split::train, normalise);
  auto test = data::load_mnist(dir, data::split::test, normalise);
  Net net(64, 42);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
  model.fit(train, {.epochs = 1, .batch_size = 64, .verbose = 0, .seed = 42});
  auto result = model.evaluate(test);
  MESSAGE("test accuracy after one epoch: " << result["accuracy"]);
  CHECK(result["accuracy"] >= 0.95);
}

TEST_CASE("static and dynamic mode give bit-identical losses for 100 steps on MNIST batches") {
  auto dir = mnist_dir();
  if (dir.empty()) return;
  auto train = data::load_mnist(dir, data::split::train, {.limit = 6400});
  Net net(64, 7);
  manual_seed(7);
  auto model = nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
  optim::Adam static_opt({.lr = 1e-3}), dynamic_opt(model.parameters(), {.lr = 1e-3});
  data::data_loader loader(train, {.batch_size = 64, .seed = 3});
  int steps = 0;
  for (const auto& b : loader.epoch(0)) {
    float s = net.train_step(b.x, b.y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(nn::Variable(b.x)), b.y.span());
    l.backward();
    dynamic_opt.step();
    REQUIRE(s == l.item());
    ++steps;
  }
  CHECK(steps == 100);
}
