// A static recurrent training step (stacked and bidirectional LSTM and GRU, on one thread and on two) allocates
// nothing after the first: gate buffers, saved states and the packed recurrent weights live in scratch planned at
// construction or grown once.
#include <doctest/doctest.h>

#include "allocation_counter.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// Two full batches and two short ones after a warm-up step of each size; returns the allocations they made.
template <class Net>
long steady_allocations(int threads) {
  const int saved = num_threads();
  set_num_threads(threads);
  const long long at_start = kiln_test::heap_allocations.load();
  Net net(32, 7);
  REQUIRE(kiln_test::heap_allocations.load() > at_start);  // the counter sees the model's own buffers
  Tensor<float> x(shape{32, 9, 6});
  for (index_t i = 0; i < x.numel(); ++i) x[i] = float(i % 11) * 0.1f - 0.5f;
  Tensor<std::int64_t> labels(shape{32});
  for (int i = 0; i < 32; ++i) labels[i] = i % 10;
  optim::Adam adam({.lr = 1e-3});
  net.train_step(x, labels, loss::cross_entropy{}, adam);
  net.train_step(x.rows(0, 9), labels.rows(0, 9), loss::cross_entropy{}, adam);
  const long long before = kiln_test::heap_allocations.load();
  for (int step = 0; step < 2; ++step) {
    net.train_step(x, labels, loss::cross_entropy{}, adam);
    net.train_step(x.rows(0, 9), labels.rows(0, 9), loss::cross_entropy{}, adam);
  }
  set_num_threads(saved);
  return kiln_test::heap_allocations.load() - before;
}

}  // namespace

TEST_CASE("no heap allocation in a static LSTM or GRU training step after the first, on one thread and two") {
  using Lstm = Sequential<policy::cpu, Input<9, 6>, FinalState<LSTM<16, 2, true>>, Dense<10>>;
  using Gru = Sequential<policy::cpu, Input<9, 6>, FinalState<GRU<16, 2, true>>, Dense<10>>;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    CHECK(steady_allocations<Lstm>(threads) == 0);
    CHECK(steady_allocations<Gru>(threads) == 0);
  }
}
