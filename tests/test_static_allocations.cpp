// A static training step allocates nothing after the first: all memory is planned at construction.
#include <doctest/doctest.h>

#include "allocation_counter.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

TEST_CASE("no heap allocation in a static training step after the first") {
  using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
  Net net(64, 42);
  Tensor<float> x(shape{64, 28, 28}, 0.1f);
  Tensor<std::int64_t> labels(shape{64}, 3);
  for (int i = 0; i < 64; ++i) labels[i] = i % 10;
  optim::Adam adam({.lr = 1e-3});
  optim::SGD sgd({.lr = 0.1, .momentum = 0.9});
  net.train_step(x, labels, loss::cross_entropy{}, adam);
  net.train_step(x.rows(0, 17), labels.rows(0, 17), loss::cross_entropy{}, adam);  // a smaller last batch
  long long before = kiln_test::heap_allocations.load();
  for (int step = 0; step < 5; ++step) {
    net.train_step(x, labels, loss::cross_entropy{}, adam);
    net.train_step(x.rows(0, 17), labels.rows(0, 17), loss::cross_entropy{}, adam);
  }
  CHECK(kiln_test::heap_allocations.load() - before == 0);
  net.train_step(x, labels, loss::cross_entropy{}, sgd);
  before = kiln_test::heap_allocations.load();
  for (int step = 0; step < 5; ++step) net.train_step(x, labels, loss::cross_entropy{}, sgd);
  CHECK(kiln_test::heap_allocations.load() - before == 0);
}
