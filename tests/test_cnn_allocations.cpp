// A static CNN training step (convolutions, pooling, batch and layer norm, dropout) allocates nothing after the
// first: im2col buffers, saved statistics and dropout masks live in the scratch planned at construction, and
// SyncBatchNorm's sums over the replicas on the stack.
#include <doctest/doctest.h>

#include <span>

#include "allocation_counter.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

TEST_CASE("no heap allocation in a static CNN training step after the first") {
  using Net = Sequential<policy::cpu, Input<1, 12, 12>, Conv2D<8, 3, conv_options{.padding = 1}>, BatchNorm2d<>, ReLU,
                         MaxPool2D<2>, Conv2D<8, 3, conv_options{.groups = 2}>, ReLU, AvgPool2D<2>, Dropout<0.25>,
                         Flatten, Dense<16>, LayerNorm<16>, ReLU, Dense<10>>;
  Net net(32, 42);
  Tensor<float> x(shape{32, 1, 12, 12}, 0.1f);
  for (index_t i = 0; i < x.numel(); ++i) x[i] = float(i % 7) * 0.1f;
  Tensor<std::int64_t> labels(shape{32});
  for (int i = 0; i < 32; ++i) labels[i] = i % 10;
  optim::Adam adam({.lr = 1e-3});
  net.train_step(x, labels, loss::cross_entropy{}, adam);
  net.train_step(x.rows(0, 9), labels.rows(0, 9), loss::cross_entropy{}, adam);
  const long long before = kiln_test::heap_allocations.load();
  for (int step = 0; step < 5; ++step) {
    net.train_step(x, labels, loss::cross_entropy{}, adam);
    net.train_step(x.rows(0, 9), labels.rows(0, 9), loss::cross_entropy{}, adam);
  }
  CHECK(kiln_test::heap_allocations.load() - before == 0);
}

TEST_CASE("no heap allocation in a static training step whose SyncBatchNorm layers sum over the replicas") {
  // One replica, whose sums are the values themselves: the layers' data-parallel path, with nothing to send.
  struct one_replica final : replica_reducer {
    void sum(std::span<float>) override {}
    void sum(std::span<double>) override {}
  } replicas;
  using Net = Sequential<policy::cpu, Input<2, 8, 8>, Conv2D<8, 3, conv_options{.padding = 1}>, SyncBatchNorm2d<>,
                         ReLU, Residual<Conv2D<8, 3, conv_options{.padding = 1}>, SyncBatchNorm2d<>>, Flatten,
                         Dense<16>, SyncBatchNorm1d<>, ReLU, Dense<4>>;
  Net net(16, 42);
  net.set_replicas(&replicas);
  Tensor<float> x(shape{16, 2, 8, 8});
  for (index_t i = 0; i < x.numel(); ++i) x[i] = float(i % 7) * 0.1f;
  Tensor<std::int64_t> labels(shape{16});
  for (int i = 0; i < 16; ++i) labels[i] = i % 4;
  optim::Adam adam({.lr = 1e-3});
  net.train_step(x, labels, loss::cross_entropy{}, adam);
  const long long before = kiln_test::heap_allocations.load();
  for (int step = 0; step < 5; ++step) net.train_step(x, labels, loss::cross_entropy{}, adam);
  CHECK(kiln_test::heap_allocations.load() - before == 0);
}
