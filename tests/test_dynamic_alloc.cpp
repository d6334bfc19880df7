// Dynamic mode with the caching allocator: after warm-up a training step allocates nothing, neither through
// operator new (counted by the replacements below, which is why this test has its own executable) nor from the
// system allocator behind tensor storage (counted by the cache's own statistics). With the cache off, it does.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kiln/dynamic/nn.hpp"

namespace {
std::atomic<long long> new_calls{0};
}

// The replacements pair malloc with free on purpose; GCC's heuristic cannot see that both sides are replaced.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t bytes) {
  ++new_calls;
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) {
  ++new_calls;
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t bytes, std::align_val_t align) {
  ++new_calls;
  std::size_t a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes, std::align_val_t align) { return operator new(bytes, align); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

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
    long long news_before = new_calls.load();
    auto system_before = nn::caching_allocator_stats().system_allocations;
    opt.zero_grad();
    auto loss = nn::cross_entropy(model(input), y);
    loss.backward();
    opt.step();
    (void)loss.item();
    counts = {new_calls.load() - news_before, nn::caching_allocator_stats().system_allocations - system_before};
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
