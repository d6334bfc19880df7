// Dynamic mode's general tensor ops (dynamic/functional/: pointwise, broadcast, reduce, shape, matmul) one op at a
// time, in µs per call, against PyTorch's peer script bench/tensor_ops_bench_torch.py, which runs the same cases
// with the same timing. Each case is timed twice:
//   forward           the op under nn::no_grad (inputs require grad, nothing is recorded);
//   forward_backward  the op with autograd recording, then loss = nn::sum(y) and loss.backward(), into inputs that
//                     require grad (their gradients marked zero before each call). The time includes the sum, its
//                     backward (a fill of y's shape with ones) and the input gradients; op=sum_all times that loss
//                     alone (nn::sum of every element), to subtract by eye.
// Element-wise, reduction and shape ops run at 1x8, 64x64, 256x256 and 1024x1024 (the 1x8 case is the per-op
// overhead, summarised after the table); the outer broadcast [N,1,F] + [1,M,F] at outputs of the same element counts;
// matmul at square 8, 64, 256 and 1024; and attention's scores q k^T for q, k of [8, 4, 128, 32], through
// matmul(q, transpose(k, -2, -1)) and einsum("bhqd,bhkd->bhqk").
//
// Timing: a warm-up call, a calibration of the call's cost, then rounds of repeated calls (11 rounds, or fewer when a
// call is long) filling about --seconds per case and mode; each line is the median over rounds of µs per call:
//   RESULT tensor_ops op=<name> size=<shape> mode=<forward|forward_backward> us=<median>
// bench/tensor_ops_compare.py puts it beside PyTorch's.
//
//   tensor_ops_bench [--threads 1] [--seconds 0.5] [--filter substring]   (the filter matches "<op>/<size>")
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../examples/common.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The median over rounds of µs per call of body, filling about `seconds`.
template <class Body>
double median_us(double seconds, Body&& body) {
  body();  // warm-up: the caching allocator, the tape's capacity, the caches
  // Calibration: calls until 2% of the budget (at least one) has passed.
  long calibration = 0;
  auto start = clock_type::now();
  double elapsed = 0;
  do {
    body();
    ++calibration;
    elapsed = seconds_between(start, clock_type::now());
  } while (elapsed < seconds * 0.02);
  const double per_call = elapsed / double(calibration);
  int rounds = 11;
  long calls = static_cast<long>(seconds / rounds / per_call);
  if (calls < 1) {
    calls = 1;
    rounds = std::clamp(static_cast<int>(seconds / per_call), 3, 11);
  }
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = clock_type::now();
    for (long i = 0; i < calls; ++i) body();
    us.push_back(seconds_between(t0, clock_type::now()) * 1e6 / double(calls));
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

nn::Variable random_input(const kiln::shape& s, random_generator& rng, float low = 0, float high = 0) {
  Tensor<float> t(s);
  for (index_t i = 0; i < t.numel(); ++i)
    t.data()[i] = low < high ? rng.uniform<float>(low, high) : rng.normal<float>();
  return nn::Variable(t, true);
}

struct size2 {
  index_t rows, cols;
};

std::string label(std::initializer_list<index_t> extents) {
  std::string s;
  for (index_t e : extents) {
    if (!s.empty()) s += 'x';
    s += std::to_string(e);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--seconds", "--filter"});
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const double seconds = flags.get_double("--seconds", 0.5);
  const std::string filter = flags.get("--filter", "");
  set_num_threads(threads);
  random_generator rng(1);

  struct overhead_entry {
    std::string op;
    double forward, forward_backward;
  };
  std::vector<overhead_entry> overhead;
  volatile float sink = 0;

  // Times one case: op(inputs) forward under no_grad, and forward + sum + backward.
  auto run = [&](const std::string& op, const std::string& size, std::vector<nn::Variable> inputs,
                 std::function<nn::Variable(const std::vector<nn::Variable>&)> f) {
    if (!filter.empty() && (op + "/" + size).find(filter) == std::string::npos) return;
    const double fwd = median_us(seconds, [&] {
      nn::no_grad guard;
      auto y = f(inputs);
      sink = sink + static_cast<float>(y.numel());
    });
    std::printf("RESULT tensor_ops op=%s size=%s mode=forward us=%.3f\n", op.c_str(), size.c_str(), fwd);
    std::fflush(stdout);
    const double fwd_bwd = median_us(seconds, [&] {
      for (auto& x : inputs) x.zero_grad();
      auto loss = nn::sum(f(inputs));
      loss.backward();
    });
    std::printf("RESULT tensor_ops op=%s size=%s mode=forward_backward us=%.3f\n", op.c_str(), size.c_str(), fwd_bwd);
    std::fflush(stdout);
    if (size == "1x8" || size == "1x1x8") overhead.push_back({op, fwd, fwd_bwd});
  };

  using V = std::vector<nn::Variable>;
  for (size2 s : {size2{1, 8}, size2{64, 64}, size2{256, 256}, size2{1024, 1024}}) {
    const index_t n = s.rows, f = s.cols;
    const std::string sz = label({n, f});
    run("add_row", sz, {random_input({n, f}, rng), random_input({f}, rng)},
        [](const V& v) { return nn::add(v[0], v[1]); });
    run("mul", sz, {random_input({n, f}, rng), random_input({n, f}, rng)},
        [](const V& v) { return nn::mul(v[0], v[1]); });
    run("div", sz, {random_input({n, f}, rng), random_input({n, f}, rng, 1.0f, 2.0f)},
        [](const V& v) { return nn::div(v[0], v[1]); });
    run("exp", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::exp(v[0]); });
    run("sum_all", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::sum(v[0]); });  // the loss itself
    run("sum_last", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::sum(v[0], -1); });
    run("sum_dim0", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::sum(v[0], 0); });
    run("amax_last", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::amax(v[0], -1); });
    run("softmax_last", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::softmax(v[0], -1); });
    // kiln's transpose copies; PyTorch's is a view, so its peer also times transpose(0, 1).contiguous().
    run("transpose", sz, {random_input({n, f}, rng)}, [](const V& v) { return nn::transpose(v[0], 0, 1); });
    run("transpose_contiguous", sz, {random_input({n, f}, rng)},
        [](const V& v) { return nn::contiguous(nn::transpose(v[0], 0, 1)); });
    run("cat_dim1", sz, {random_input({n, f}, rng), random_input({n, f}, rng)},
        [](const V& v) { return nn::cat(v, 1); });
  }
  // [N, 1, F] + [1, M, F] -> [N, M, F], at outputs of 8, 64^2, 256^2 and 1024^2 elements.
  for (auto [n, m, f] : {std::array<index_t, 3>{1, 1, 8}, std::array<index_t, 3>{16, 16, 16},
                         std::array<index_t, 3>{64, 64, 16}, std::array<index_t, 3>{128, 128, 64}}) {
    run("add_outer", label({n, m, f}), {random_input({n, 1, f}, rng), random_input({1, m, f}, rng)},
        [](const V& v) { return nn::add(v[0], v[1]); });
  }
  for (index_t n : {8, 64, 256, 1024})
    run("matmul", label({n, n}), {random_input({n, n}, rng), random_input({n, n}, rng)},
        [](const V& v) { return nn::matmul(v[0], v[1]); });
  {
    const index_t b = 8, h = 4, l = 128, d = 32;
    const std::string sz = label({b, h, l, d});
    run("attn_matmul_transpose", sz, {random_input({b, h, l, d}, rng), random_input({b, h, l, d}, rng)},
        [](const V& v) { return nn::matmul(v[0], nn::transpose(v[1], -2, -1)); });
    run("attn_einsum", sz, {random_input({b, h, l, d}, rng), random_input({b, h, l, d}, rng)},
        [](const V& v) { return nn::einsum("bhqd,bhkd->bhqk", v); });
  }

  if (!overhead.empty()) {
    auto median_of = [&](auto member) {
      std::vector<double> v;
      for (const auto& o : overhead) v.push_back(o.*member);
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("# per-op overhead at 1x8 (threads=%d), µs per call:\n", threads);
    for (const auto& o : overhead)
      std::printf("#   %-22s forward %8.3f   forward_backward %8.3f\n", o.op.c_str(), o.forward, o.forward_backward);
    std::printf("OVERHEAD tensor_ops size=1x8 ops=%zu mode=forward us=%.3f\n", overhead.size(),
                median_of(&overhead_entry::forward));
    std::printf("OVERHEAD tensor_ops size=1x8 ops=%zu mode=forward_backward us=%.3f\n", overhead.size(),
                median_of(&overhead_entry::forward_backward));
  }
  return sink == -1.0f ? 1 : 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "tensor_ops_bench: %s\n", e.what());
  return 1;
}
