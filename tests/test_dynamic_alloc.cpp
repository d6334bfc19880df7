// Dynamic mode with the caching allocator: after warm-up a training step allocates nothing, neither through
// operator new (counted by allocation_counter.hpp's replacements, which is why this test has its own executable) nor from the
// system allocator behind tensor storage (counted by the cache's own statistics). With the cache off, it does.
#include <doctest/doctest.h>

#include "allocation_counter.hpp"
#include "kiln/dynamic/nn.hpp"

using namespace kiln;

namespace {
struct step_counts {
  long long news;
  std::uint64_t system_allocations;
};

// Runs `steps` training steps of a small MLP and counts allocations during the last one.
step_counts train_and_count(int steps) {
  manual_seed(1);
  nn::Sequential model(nn::Flatten(), nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 16), nn::Tanh(),
                       nn::Linear(16, 3));
  optim::Adam opt(model.parameters(), {.lr = 1e-3});
  Tensor<float> x(shape{8, 3, 4}, 0.25f);
  Tensor<std::int64_t> y(shape{8}, {0, 1, 2, 0, 1, 2, 0, 1});
  nn::Variable input(x);
  step_counts counts{};
  for (int step = 0; step < steps; ++step) {
    long long news_before = kiln_test::heap_allocations.load();
    auto system_before = nn::caching_allocator_stats().system_allocations;
    opt.zero_grad();
    auto loss = nn::cross_entropy(model(input), y);
    loss.backward();
    opt.step();
    (void)loss.item();
    counts = {kiln_test::heap_allocations.load() - news_before,
              nn::caching_allocator_stats().system_allocations - system_before};
  }
  return counts;
}
}  // namespace

TEST_CASE("after warm-up a dynamic training step allocates nothing with the caching allocator") {
  nn::set_caching_allocator(true);
  auto counts = train_and_count(4);
  CHECK(counts.news == 0);
  CHECK(counts.system_allocations == 0);
  CHECK(nn::caching_allocator_stats().cache_hits > 0);
}

TEST_CASE("with the caching allocator off every step goes to the system allocator") {
  nn::set_caching_allocator(false);
  CHECK(nn::caching_allocator_stats().bytes_cached == 0);
  auto counts = train_and_count(3);
  CHECK(counts.news == 0);
  CHECK(counts.system_allocations > 0);
  nn::set_caching_allocator(true);
}
