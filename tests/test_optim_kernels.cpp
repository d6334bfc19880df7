// The optimizer update kernels over long spans: split over threads (kernels/cpu/parallel.hpp), they must give the
// one-thread result bit for bit, in every variant of Adam, and touch no element outside the span; subnormal state is
// flushed to zero without changing the caller's floating-point mode.
// Float Adam's division, computed from a reciprocal estimate where AVX-512 is available, must equal the formula's.
// Also the threaded fill that zero_grad uses.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/optim.hpp"

using namespace kiln;
using kiln::kernels::cpu::adam_step_args;
using kiln::kernels::cpu::optim_kernels;

namespace {

// Parameters, gradients and Adam's state for n values, with a guard value on either side of every array.
template <class T>
struct adam_arrays {
  static constexpr index_t guard = 16;
  std::vector<T> param, grad, exp_avg, exp_avg_sq, exp_avg_sq_max;
  index_t n;
  explicit adam_arrays(index_t count, std::uint64_t seed) : n(count) {
    random_generator rng(seed);
    for (auto* v : {&param, &grad, &exp_avg, &exp_avg_sq, &exp_avg_sq_max}) v->assign(std::size_t(n + 2 * guard), T(7));
    for (index_t i = 0; i < n; ++i) {
      param[std::size_t(guard + i)] = rng.template uniform<T>(T(-1), T(1));
      grad[std::size_t(guard + i)] = rng.template uniform<T>(T(-0.5), T(0.5));
      exp_avg[std::size_t(guard + i)] = T(0);
      exp_avg_sq[std::size_t(guard + i)] = T(0);
      exp_avg_sq_max[std::size_t(guard + i)] = T(0);
    }
  }
  void step(const adam_step_args<T>& a) {
    optim_kernels::adam_update(param.data() + guard, grad.data() + guard, exp_avg.data() + guard,
                               exp_avg_sq.data() + guard, a.amsgrad ? exp_avg_sq_max.data() + guard : nullptr, n, a);
  }
  bool operator==(const adam_arrays& o) const {
    auto same = [](const std::vector<T>& x, const std::vector<T>& y) {
      return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
    };
    return same(param, o.param) && same(exp_avg, o.exp_avg) && same(exp_avg_sq, o.exp_avg_sq) &&
           same(exp_avg_sq_max, o.exp_avg_sq_max);
  }
  bool guards_intact() const {
    for (const auto* v : {&param, &grad, &exp_avg, &exp_avg_sq, &exp_avg_sq_max})
      for (index_t i = 0; i < guard; ++i)
        if ((*v)[std::size_t(i)] != T(7) || (*v)[std::size_t(guard + n + i)] != T(7)) return false;
    return true;
  }
};

}  // namespace

TEST_CASE_TEMPLATE("Adam over a long span: bit-identical on one and two threads, in every variant", T, float, double) {
  const int saved = num_threads();
  struct variant {
    T weight_decay;
    bool decoupled, amsgrad;
  };
  // 100003 values: above the parallel threshold, and not a multiple of a cache line, so the last chunk is ragged.
  for (const variant v : {variant{0, false, false}, variant{T(0.01), false, false}, variant{T(0.01), true, false},
                          variant{0, false, true}, variant{T(0.01), true, true}}) {
    CAPTURE(v.weight_decay);
    CAPTURE(v.decoupled);
    CAPTURE(v.amsgrad);
    adam_arrays<T> one(100003, 5), two(100003, 5);
    for (long long step = 1; step <= 3; ++step) {
      const adam_step_args<T> a{T(1e-3), T(0.9), T(0.999), T(1e-8), v.weight_decay, v.decoupled, v.amsgrad, step};
      set_num_threads(1);
      one.step(a);
      set_num_threads(2);
      two.step(a);
    }
    CHECK(one == two);
    CHECK(one.guards_intact());
    CHECK(two.guards_intact());
  }
  set_num_threads(saved);
}

TEST_CASE_TEMPLATE("Adam updates an element the same wherever it falls: vector body, scalar tail, any alignment", T,
                   float, double) {
  // The loop's vector body and its scalar tail are separate copies of the arithmetic: contracted into FMAs
  // differently, an element's bits would depend on the span's length and alignment (a static model's flat buffer
  // against a dynamic model's per-tensor slots).
  random_generator rng(9);
  const index_t n = 37, padded = 64;
  std::vector<T> param(static_cast<std::size_t>(n)), grad(static_cast<std::size_t>(n));
  for (auto& v : param) v = rng.template uniform<T>(T(-1), T(1));
  for (auto& v : grad) v = rng.template uniform<T>(T(-0.5), T(0.5));
  auto run = [&](index_t length, index_t offset) {
    std::vector<T> p(std::size_t(length + offset)), g(p.size()), m(p.size()), v(p.size());
    for (index_t i = 0; i < n; ++i) {
      p[std::size_t(offset + i)] = param[std::size_t(i)];
      g[std::size_t(offset + i)] = grad[std::size_t(i)];
    }
    for (long long step = 1; step <= 3; ++step) {
      const adam_step_args<T> a{T(1e-2), T(0.9), T(0.999), T(1e-8), T(0.01), true, false, step};
      optim_kernels::adam_update(p.data() + offset, g.data() + offset, m.data() + offset, v.data() + offset,
                                 static_cast<T*>(nullptr), length, a);
    }
    return std::vector<T>(p.begin() + offset, p.begin() + offset + n);
  };
  const auto reference = run(n, 0);
  for (index_t length : {n, padded})
    for (index_t offset : {0, 1, 3}) {
      CAPTURE(length);
      CAPTURE(offset);
      CHECK(std::memcmp(run(length, offset).data(), reference.data(), std::size_t(n) * sizeof(T)) == 0);
    }
}

TEST_CASE_TEMPLATE("Optimizer state in the subnormal range is flushed to zero, and the caller's float mode is kept", T,
                   float, double) {
  // Adam's m for a weight whose gradient stays zero decays by beta1 per step into the subnormal range, where every
  // x86 operation on it is a microcode assist; the updates flush such values to zero instead.
  const T tiny = std::numeric_limits<T>::denorm_min() * T(1000);
  REQUIRE(tiny < std::numeric_limits<T>::min());
  REQUIRE(tiny > T(0));
#if defined(__SSE__) || defined(_M_X64)
  const unsigned control_before = _mm_getcsr();
#endif
  std::vector<T> param{T(0.5), T(0.25)}, grad{T(0), T(0.1)}, exp_avg{tiny, T(0)}, exp_avg_sq{tiny, T(0)};
  const adam_step_args<T> a{T(1e-3), T(0.9), T(0.999), T(1e-8), T(0), false, false, 2};
  optim_kernels::adam_update(param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(), static_cast<T*>(nullptr),
                             2, a);
#if defined(__SSE__) || defined(_M_X64)
  CHECK(exp_avg[0] == T(0));
  CHECK(exp_avg_sq[0] == T(0));
  CHECK(_mm_getcsr() == control_before);
#endif
  CHECK(param[0] == T(0.5));
  CHECK(exp_avg[1] > T(0));  // normal values are untouched by the flush
  CHECK(param[1] < T(0.25));

  std::vector<T> momentum{tiny};
  std::vector<T> p{T(1)}, g{T(0)};
  const kernels::cpu::sgd_step_args<T> s{T(0.1), T(0.9), T(0), T(0), false, false};
  optim_kernels::sgd_update(p.data(), g.data(), momentum.data(), 1, s);
#if defined(__SSE__) || defined(_M_X64)
  CHECK(momentum[0] == T(0));
  CHECK(_mm_getcsr() == control_before);
#endif
  CHECK(p[0] == T(1));
}

namespace {

// Adam's update of one float by the formula as written, with a division: the reference for the kernel's.
void adam_reference(float& param, float grad, float& exp_avg, float& exp_avg_sq, const adam_step_args<float>& a) {
  const double step = static_cast<double>(a.step);
  const float bias_correction1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta1), step));
  const float bias_correction2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta2), step));
  const float step_size = a.lr / bias_correction1, inverse_bias_correction2 = 1.0f / bias_correction2;
  const float m = exp_avg + (grad - exp_avg) * (1.0f - a.beta1);
  const float v = a.beta2 * exp_avg_sq + (1.0f - a.beta2) * grad * grad;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = std::sqrt(v * inverse_bias_correction2) + a.eps;
  param = param - step_size * (m / denom);
}

bool same_float(float x, float y) {
  return std::isnan(x) ? std::isnan(y) : std::memcmp(&x, &y, sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("Float Adam equals the formula with a true division, over magnitudes from 1e-18 to 1e3 and at the edges") {
  // The AVX-512 loop divides by a reciprocal estimate, a Newton step and a correction by the exact residual; each
  // element must still get the bits of the division. Gradients and state span 21 decades, so that the quotient meets
  // many exponents and significands. Dropping the correction makes about one element in twenty differ (48,520 of
  // 2^20 with eps = 1e-8).
  random_generator rng(17);
  const index_t n = 1 << 20;
  std::vector<float> param(static_cast<std::size_t>(n)), grad(param.size()), exp_avg(param.size()),
      exp_avg_sq(param.size());
  auto log_uniform = [&](float low_exponent, float high_exponent) {
    const float magnitude = std::pow(10.0f, rng.uniform<float>(low_exponent, high_exponent));
    return rng.uniform<float>() < 0.5f ? -magnitude : magnitude;
  };
  for (std::size_t i = 0; i < param.size(); ++i) {
    param[i] = rng.uniform<float>(-1.0f, 1.0f);
    grad[i] = log_uniform(-18.0f, 3.0f);
    exp_avg[i] = log_uniform(-18.0f, 3.0f);
    exp_avg_sq[i] = std::fabs(log_uniform(-30.0f, 6.0f));
  }
  // The edges: a zero gradient onto zero state (0 / eps), one whose square overflows (m / infinity), a NaN.
  grad[0] = 0.0f;
  exp_avg[0] = exp_avg_sq[0] = 0.0f;
  grad[1] = 1e21f;
  grad[2] = std::numeric_limits<float>::quiet_NaN();
  for (const float eps : {1e-8f, 0.0f}) {
    CAPTURE(eps);
    auto p = param, m = exp_avg, v = exp_avg_sq;
    auto p_ref = param, m_ref = exp_avg, v_ref = exp_avg_sq;
    const adam_step_args<float> a{1e-3f, 0.9f, 0.999f, eps, 0.0f, false, false, 3};
    optim_kernels::adam_update(p.data(), grad.data(), m.data(), v.data(), static_cast<float*>(nullptr), n, a);
    index_t differing = 0;
    for (std::size_t i = 0; i < param.size(); ++i) {
      adam_reference(p_ref[i], grad[i], m_ref[i], v_ref[i], a);
      differing += !same_float(p[i], p_ref[i]) || !same_float(m[i], m_ref[i]) || !same_float(v[i], v_ref[i]);
    }
    CHECK(differing == 0);
    if (eps > 0.0f) CHECK(p[0] == param[0]);  // 0 / (0 + eps) is 0
    else CHECK(std::isnan(p[0]));             // 0 / 0
    CHECK(p[1] == param[1]);  // m / infinity is 0
  }
}

TEST_CASE("Adam's bias corrections follow the betas and the step of each call") {
  // adam_update keeps the last bias corrections per thread (a dynamic model's tensors share them): two optimizers with
  // different betas at the same step, and one step count after another, must each get their own.
  random_generator rng(23);
  const index_t n = 40;
  std::vector<float> param(static_cast<std::size_t>(n)), grad(param.size());
  for (auto& v : param) v = rng.uniform<float>(-1.0f, 1.0f);
  for (auto& v : grad) v = rng.uniform<float>(-0.5f, 0.5f);
  struct call {
    float beta1, beta2;
    long long step;
  };
  for (const call c : {call{0.9f, 0.999f, 3}, call{0.8f, 0.99f, 3}, call{0.8f, 0.99f, 4}, call{0.9f, 0.999f, 4}}) {
    CAPTURE(c.beta1);
    CAPTURE(c.step);
    const adam_step_args<float> a{1e-2f, c.beta1, c.beta2, 1e-8f, 0.0f, false, false, c.step};
    auto p = param, m = grad, v = grad;  // some nonzero state
    for (auto& x : v) x = x * x;
    auto p_ref = p, m_ref = m, v_ref = v;
    optim_kernels::adam_update(p.data(), grad.data(), m.data(), v.data(), static_cast<float*>(nullptr), n, a);
    for (std::size_t i = 0; i < p.size(); ++i) {
      adam_reference(p_ref[i], grad[i], m_ref[i], v_ref[i], a);
      CHECK(same_float(p[i], p_ref[i]));
    }
  }
}

TEST_CASE("zero_grad's fill over a long span, split over the threads, writes every element and none outside") {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    // 100003 values: split over two threads, with a ragged last chunk; a guard on either side.
    const index_t n = 100003, guard = 16;
    std::vector<float> buffer(static_cast<std::size_t>(n + 2 * guard), 7.0f);
    kernels::cpu::elementwise_kernels::fill(buffer.data() + guard, 0.0f, n);
    index_t zeros = 0;
    for (index_t i = guard; i < guard + n; ++i) zeros += buffer[static_cast<std::size_t>(i)] == 0.0f;
    CHECK(zeros == n);
    for (index_t i = 0; i < guard; ++i) {
      CHECK(buffer[static_cast<std::size_t>(i)] == 7.0f);
      CHECK(buffer[static_cast<std::size_t>(guard + n + i)] == 7.0f);
    }
  }
  set_num_threads(saved);
}
