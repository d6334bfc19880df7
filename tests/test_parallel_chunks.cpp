// Parallel loops handed out in chunks (kernels/cpu/parallel.hpp: element-wise loops, row slices, the products' splits
// along one dimension): every row and element covered once, and results that are the same bits on one thread, on two
// and on three, since each chunk computes the same outputs whichever thread takes it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kiln.hpp"
#include "thread_settings.hpp"

using namespace kiln;

namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale) {
  random_generator rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * rng.normal<float>();
  return v;
}

}  // namespace

#if defined(_OPENMP)
TEST_CASE("no split of the work changes a product or an update") {
  thread_settings_guard guard;
  const index_t batch = 64, in = 784, hidden = 128;
  const auto x = random_values(std::size_t(batch * in), 1, 1.0f);
  const auto w = random_values(std::size_t(hidden * in), 2, 0.05f);
  const auto bias = random_values(std::size_t(hidden), 3, 0.1f);
  const auto dh = random_values(std::size_t(batch * hidden), 4, 0.01f);

  auto forward = [&] {
    std::vector<float> h(std::size_t(batch * hidden));
    kernels::cpu::epilogue<float> ep{};
    ep.bias = bias.data();
    ep.act = activation::relu;
    kernels::cpu::gemm(false, true, batch, hidden, in, 1.0f, x.data(), in, w.data(), in, 0.0f, h.data(), hidden, ep);
    return h;
  };
  auto weight_gradient = [&] {
    std::vector<float> dw(std::size_t(hidden * in));
    kernels::cpu::gemm(true, false, hidden, in, batch, 1.0f, dh.data(), hidden, x.data(), in, 0.0f, dw.data(), in);
    return dw;
  };
  auto adam = [&] {
    std::vector<float> p = w, m(w.size(), 0.0f), v(w.size(), 0.0f);
    const auto g = random_values(w.size(), 5, 0.01f);
    const kernels::cpu::adam_step_args<float> args{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, false, 1};
    for (int step = 0; step < 3; ++step)
      kernels::cpu::optim_kernels::adam_update(p.data(), g.data(), m.data(), v.data(), static_cast<float*>(nullptr),
                                               index_t(p.size()), args);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
  };

  for (bool amx : {true, false}) {
    CAPTURE(amx);
    kernels::cpu::set_amx_gemm(amx);
    set_num_threads(1);
    const auto h1 = forward(), dw1 = weight_gradient(), p1 = adam();
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      set_num_threads(threads);
      CHECK(bitwise_equal(forward(), h1));
      CHECK(bitwise_equal(weight_gradient(), dw1));
      CHECK(bitwise_equal(adam(), p1));
    }
  }
}

// The losses of `steps` training steps of Net (batch 64, random inputs, labels 0-9) on `threads` threads, followed by
// the trained parameters.
template <class Net>
std::vector<float> train_losses(int threads, int steps) {
  const index_t batch = 64;
  const auto x = random_values(std::size_t(batch * Net::input_shape::size), 11, 1.0f);
  std::vector<std::int64_t> y(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int64_t((i * 7) % 10);
  const tensor_view<const float> xv(x.data(), Net::input_shape::batch_shape(batch));
  const tensor_view<const std::int64_t> yv(y.data(), shape{batch});
  set_num_threads(threads);
  Net net(batch, 3);
  optim::Adam opt(optim::adam_options{.lr = 1e-3});
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(net.train_step(xv, yv, loss::cross_entropy{}, opt));
  losses.insert(losses.end(), net.parameter_values().begin(), net.parameter_values().end());
  return losses;
}

// A static model trained on two or three threads takes the one-thread run's steps exactly.
TEST_CASE("a static model's losses are the same bits on one thread, two and three") {
  thread_settings_guard guard;
  using Net = Sequential<policy::cpu, Input<784>, Dense<128, ReLU>, Dense<10>>;
  const auto one = train_losses<Net>(1, 5);
  CHECK(bitwise_equal(train_losses<Net>(2, 5), one));
  CHECK(bitwise_equal(train_losses<Net>(3, 5), one));
}

// The slices one call of parallel_row_slices handed out, in order of their first row.
std::vector<std::pair<index_t, index_t>> row_slices(index_t rows, index_t min_rows) {
  std::mutex mutex;
  std::vector<std::pair<index_t, index_t>> slices;
  kernels::cpu::parallel_row_slices(rows, min_rows, [&](index_t begin, index_t end) {
    std::lock_guard lock(mutex);
    slices.emplace_back(begin, end);
  });
  std::sort(slices.begin(), slices.end());
  return slices;
}

TEST_CASE("row slices cover the rows once, in more slices than threads, each of its minimum rows") {
  thread_settings_guard guard;
  set_num_threads(2);
  using slices = std::vector<std::pair<index_t, index_t>>;
  CHECK(row_slices(64, 8) == slices{{0, 8}, {8, 16}, {16, 24}, {24, 32}, {32, 40}, {40, 48}, {48, 56}, {56, 64}});
  CHECK(row_slices(64, 16) == slices{{0, 16}, {16, 32}, {32, 48}, {48, 64}});
  CHECK(row_slices(64, 17) == slices{{0, 21}, {21, 42}, {42, 64}});
  CHECK(row_slices(64, 33) == slices{{0, 64}});  // too few rows for two slices: one thread
  set_num_threads(1);
  CHECK(row_slices(64, 8) == slices{{0, 64}});
}

// A static LSTM's batch rows run in slices (policy::cpu::for_batch_slices): on two or three threads they take the
// one-thread run's steps exactly.
TEST_CASE("a static LSTM's losses are the same bits on one thread, two and three") {
  thread_settings_guard guard;
  using Net = Sequential<policy::cpu, Input<28, 28>, FinalState<LSTM<128>>, Dense<10>>;
  const auto one = train_losses<Net>(1, 3);
  CHECK(bitwise_equal(train_losses<Net>(2, 3), one));
  CHECK(bitwise_equal(train_losses<Net>(3, 3), one));
}
#endif
