// The CPU's fused MLP step (kiln::fused_mlp_trainer on policy::cpu, kernels/cpu/fused_mlp.hpp): the same losses,
// parameters and gradients as Sequential::train_step with Adam, bit for bit, on one thread and on two split
// unevenly, with AMX on and off; gemm_part's parts of a product are gemm's elements, and the fused head backward's
// are the two products'; a profiled step times each thread's parts; bad input is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/static/fused_mlp.hpp"
#include "thread_settings.hpp"

using namespace kiln;

namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  random_generator rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * rng.normal<float>();
  return v;
}

// A few batches of random inputs and labels for Net.
template <class Net>
struct batches {
  index_t batch;
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::int64_t>> y;
  // mostly_background: four in five elements hold one value, the others in pairs of neighbours, as MNIST's blank
  // and inked pixels are, so that the hidden layer takes the sparse-input products (kernels/cpu/dense_sparse_input.hpp).
  batches(index_t rows, int count, bool mostly_background = false) : batch(rows) {
    for (int b = 0; b < count; ++b) {
      x.push_back(random_values(std::size_t(rows * Net::input_shape::size), 100 + std::uint64_t(b)));
      if (mostly_background)
        for (std::size_t i = 0; i < x.back().size(); ++i)
          if (i % 10 >= 2 || i == 0) x.back()[i] = -0.4242f;
      std::vector<std::int64_t> labels(std::size_t(rows), 0);
      for (std::size_t i = 0; i < labels.size(); ++i)
        labels[i] = std::int64_t((i * 7 + std::size_t(b)) % std::size_t(Net::output_shape::size));
      y.push_back(labels);
    }
  }
  tensor_view<const float> x_view(int b) const {
    return {x[std::size_t(b)].data(), Net::input_shape::batch_shape(batch)};
  }
  tensor_view<const std::int64_t> y_view(int b) const { return {y[std::size_t(b)].data(), shape{batch}}; }
};

// The losses of `steps` steps, then the parameters and the last step's gradients.
template <class Net>
std::vector<float> trained(const batches<Net>& data, int steps, bool fused, bool adamw = false) {
  Net net(data.batch, 3);
  std::vector<float> result;
  if (fused) {
    fused_mlp_trainer<Net> trainer = adamw ? fused_mlp_trainer<Net>(net, optim::adamw_options{.lr = 2e-3})
                                           : fused_mlp_trainer<Net>(net, optim::adam_options{.lr = 2e-3});
    for (int s = 0; s < steps; ++s) result.push_back(trainer.train_step(data.x_view(s % 3), data.y_view(s % 3)));
    CHECK(trainer.steps() == steps);
  } else if (adamw) {
    optim::AdamW opt(optim::adamw_options{.lr = 2e-3});
    for (int s = 0; s < steps; ++s)
      result.push_back(net.train_step(data.x_view(s % 3), data.y_view(s % 3), loss::cross_entropy{}, opt));
  } else {
    optim::Adam opt(optim::adam_options{.lr = 2e-3});
    for (int s = 0; s < steps; ++s)
      result.push_back(net.train_step(data.x_view(s % 3), data.y_view(s % 3), loss::cross_entropy{}, opt));
  }
  result.insert(result.end(), net.parameter_values().begin(), net.parameter_values().end());
  result.insert(result.end(), net.gradient_values().begin(), net.gradient_values().end());
  return result;
}

}  // namespace

TEST_CASE("gemm_part's parts of a product are the elements gemm computes") {
  thread_settings_guard guard;
  set_num_threads(1);
  struct product {
    bool transpose_a, transpose_b;
    index_t m, n, k;
  };
  // The MNIST MLP's forward (run as its transpose on AMX tiles) and its weight gradient; a product with a bias and
  // ReLU; uneven sizes.
  for (bool amx : {true, false}) {
    kernels::cpu::set_amx_gemm(amx);
    for (const product p : {product{false, true, 64, 128, 784}, product{true, false, 128, 784, 64},
                            product{false, false, 70, 100, 90}}) {
      CAPTURE(amx);
      CAPTURE(p.m);
      const index_t lda = p.transpose_a ? p.m : p.k, ldb = p.transpose_b ? p.k : p.n;
      const auto a = random_values(std::size_t(p.m * p.k), 1), b = random_values(std::size_t(p.k * p.n), 2);
      const auto bias = random_values(std::size_t(p.n), 3);
      const kernels::cpu::epilogue<float> ep{bias.data(), activation::relu, 0.0f};
      REQUIRE(kernels::cpu::gemm_splits<float>(p.transpose_a, p.transpose_b, p.m, p.n, p.k));
      std::vector<float> whole(std::size_t(p.m * p.n)), parts(whole.size(), -1.0f);
      kernels::cpu::gemm<float>(p.transpose_a, p.transpose_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                                whole.data(), p.n, ep);
      // Four parts: rows cut at 32 (or 16), columns at 48.
      const index_t row_cut = p.m > 64 ? 32 : 16, col_cut = 48;
      for (auto [i0, i1] : {std::pair{index_t(0), row_cut}, std::pair{row_cut, p.m}})
        for (auto [j0, j1] : {std::pair{index_t(0), col_cut}, std::pair{col_cut, p.n}})
          kernels::cpu::gemm_part<float>(p.transpose_a, p.transpose_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(),
                                         ldb, parts.data(), p.n, i0, i1, j0, j1, ep);
      CHECK(bitwise_equal(parts, whole));
    }
  }
  // Parts must start on tiles, and small products (which gemm runs whole on other paths) cannot be split.
  std::vector<float> a(64 * 64), c(64 * 64);
  CHECK_THROWS_WITH_AS(
      kernels::cpu::gemm_part<float>(false, false, 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, c.data(), 64, 8, 64,
                                     0, 64),
      doctest::Contains("starting on multiples of 16"), error);
  CHECK_FALSE(kernels::cpu::gemm_splits<float>(false, false, 4, 4, 4));
  CHECK_THROWS_WITH_AS(kernels::cpu::gemm_part<float>(false, false, 4, 4, 4, 1.0f, a.data(), 4, a.data(), 4, c.data(),
                                                      4, 0, 4, 0, 4),
                       doctest::Contains("blocked or on AMX"), error);
}

TEST_CASE("the fused head backward gives the bits of gemm, the ReLU's backward and sum_rows on W2, dL/dhidden and b1") {
  thread_settings_guard guard;
  set_num_threads(1);
  struct shape {
    index_t batch, hidden, out;
  };
  // The MNIST MLP's; 13 outputs (a group of 10, then one of 3 that carries on dL/dhidden's chains), 100 hidden units
  // (a partial last vector) and 50 rows (not a multiple of the 4 taken at once); 3 outputs over 21 rows.
  for (const shape s : {shape{64, 128, 10}, shape{50, 100, 13}, shape{21, 80, 3}}) {
    CAPTURE(s.batch);
    CAPTURE(s.out);
    using kernels::cpu::head_backward_fusable;
    REQUIRE(head_backward_fusable(s.batch, s.hidden, s.out));
    const auto head = random_values(std::size_t(s.batch * s.out), 4);
    const auto w2 = random_values(std::size_t(s.out * s.hidden), 5);
    auto h = random_values(std::size_t(s.batch * s.hidden), 6);
    for (auto& v : h) v = std::max(v, 0.0f);  // a ReLU's output, zeros included
    std::vector<float> w2_grad(w2.size()), dh(h.size());
    kernels::cpu::gemm<float>(true, false, s.out, s.hidden, s.batch, 1.0f, head.data(), s.out, h.data(), s.hidden, 0.0f,
                              w2_grad.data(), s.hidden);
    kernels::cpu::gemm<float>(false, false, s.batch, s.hidden, s.out, 1.0f, head.data(), s.out, w2.data(), s.hidden,
                              0.0f, dh.data(), s.hidden);
    for (std::size_t i = 0; i < dh.size(); ++i)  // the ReLU's backward, as activation_backward takes it
      dh[i] = kernels::activate_backward(activation::relu, 0.0f, h[i], dh[i], 0.0f);
    std::vector<float> b1_grad(static_cast<std::size_t>(s.hidden));
    kernels::cpu::reduce_kernels::sum_rows(dh.data(), b1_grad.data(), s.batch, s.hidden, false);
    // In two parts of the hidden units, cut at 16, as two threads of the fused step take them. With 80 units the
    // last strip of sum_rows has one vector and sums in 4 chains: the second part's sums then run after the pass.
    std::vector<float> w2_grad_parts(w2.size(), -1.0f), dh_parts(h.size(), -1.0f), b1_grad_parts(b1_grad.size(), -1.0f);
    for (auto [u0, u1] : {std::pair{index_t(0), index_t(16)}, std::pair{index_t(16), s.hidden}})
      kernels::cpu::head_backward_part(head.data(), h.data(), w2.data(), w2_grad_parts.data(),
                                                         dh_parts.data(), b1_grad_parts.data(), s.batch, s.hidden,
                                                         s.out, u0, u1);
    CHECK(bitwise_equal(w2_grad_parts, w2_grad));
    CHECK(bitwise_equal(dh_parts, dh));
    CHECK(bitwise_equal(b1_grad_parts, b1_grad));
  }
  // Products that gemm runs on another path (here the direct loop of tiny products) keep the two calls.
  CHECK_FALSE(kernels::cpu::head_backward_fusable(2, 8, 2));
}

TEST_CASE("sum_rows_part and softmax_cross_entropy_rows give the whole call's bits in parts") {
  // Column sums: widths whose last strip sums in 4, 2 or 1 chains, parts cut on multiples of 16.
  for (index_t cols : {10, 16, 40, 80, 100, 128, 200}) {
    CAPTURE(cols);
    const index_t rows = 37;
    const auto x = random_values(std::size_t(rows * cols), 5);
    std::vector<float> whole(static_cast<std::size_t>(cols)), parts(static_cast<std::size_t>(cols), -1.0f);
    kernels::cpu::reduce_kernels::sum_rows(x.data(), whole.data(), rows, cols, false);
    for (index_t c0 = 0; c0 < cols; c0 += 48)
      kernels::cpu::reduce_kernels::sum_rows_part(x.data(), parts.data(), rows, cols, c0, std::min(cols, c0 + 48),
                                                  false);
    CHECK(bitwise_equal(parts, whole));
  }
  // The loss by rows, its terms summed in order as the whole call sums them.
  const index_t rows = 64, classes = 10;
  const auto logits = random_values(std::size_t(rows * classes), 6, 3.0f);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int64_t((i * 3) % 10);
  std::vector<float> grad(logits.size()), grad_rows(logits.size()), row_losses(static_cast<std::size_t>(rows));
  const float loss = kernels::cpu::loss_kernels::softmax_cross_entropy(logits.data(), labels.data(), rows, classes,
                                                                       reduction::mean, grad.data());
  const float scale = 1.0f / float(rows);
  for (auto [begin, end] : {std::pair{index_t(0), index_t(21)}, std::pair{index_t(21), rows}})
    kernels::cpu::loss_kernels::softmax_cross_entropy_rows(logits.data(), labels.data(), begin, end, classes, scale,
                                                           grad_rows.data(), row_losses.data());
  double total = 0;
  for (float term : row_losses) total += term;
  const float loss_rows = float(total) * scale;
  CHECK(std::memcmp(&loss, &loss_rows, sizeof loss) == 0);
  CHECK(bitwise_equal(grad_rows, grad));
}

#if defined(_OPENMP)
TEST_CASE("the fused step takes Sequential::train_step's steps, bit for bit, on one thread and on two") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  // The policy with the sparse-input products: the mostly blank inputs take them, the others the GEMM.
  using Net = Sequential<policy::cpu_sparse_input, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
  for (bool amx : {true, false})
    for (bool mostly_background : {false, true}) {
      const batches<Net> data(64, 3, mostly_background);
      CAPTURE(amx);
      CAPTURE(mostly_background);
#if defined(__AVX512F__)
      kernels::cpu::sparse_input listing;  // the input the test means to be mostly background is listed as such
      CHECK(listing.scan(data.x[0].data(), 64, 784, 784) == mostly_background);
#endif
      kernels::cpu::set_amx_gemm(amx);
      set_num_threads(1);
      const auto reference = trained(data, 5, false);
      CHECK(bitwise_equal(trained(data, 5, true), reference));
      set_num_threads(2);
      CHECK(bitwise_equal(trained(data, 5, false), reference));
      // The hidden units split equally, 3:1 and 1:3 (in tiles of 16).
      for (const std::vector<double>& shares : {std::vector<double>{}, {3, 1}, {1, 3}}) {
        kernels::cpu::set_fixed_thread_shares(shares);
        CHECK(bitwise_equal(trained(data, 5, true), reference));
      }
      kernels::cpu::set_fixed_thread_shares({});
    }
}

TEST_CASE("a profiled fused step times each thread's parts and takes the same step") {
  thread_settings_guard guard;
  using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
  const batches<Net> data(64, 3);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    Net plain_net(64, 3), profiled_net(64, 3);
    fused_mlp_trainer<Net> plain(plain_net), profiled(profiled_net);
    for (int s = 0; s < 3; ++s) {
      kernels::cpu::fused_mlp_parts parts;
      const float plain_loss = plain.train_step(data.x_view(s), data.y_view(s));
      const float profiled_loss = profiled.train_step(data.x_view(s), data.y_view(s), parts);
      CHECK(std::memcmp(&plain_loss, &profiled_loss, sizeof plain_loss) == 0);
      REQUIRE(parts.threads == kernels::cpu::fused_mlp_threads(64, 784, 128, 10));
      for (int t = 0; t < parts.threads; ++t) {
        CAPTURE(t);
        const auto& seconds = parts.seconds[std::size_t(t)];
        CHECK(std::all_of(seconds.begin(), seconds.end(), [](double x) { return x >= 0; }));
        // The forward product alone is tens of microseconds.
        CHECK(seconds[kernels::cpu::fused_mlp_parts::forward] > 1e-6);
        CHECK(seconds[kernels::cpu::fused_mlp_parts::w1_gradient] > 1e-6);
      }
    }
    const auto values = [](const Net& net) {
      return std::vector<float>(net.parameter_values().begin(), net.parameter_values().end());
    };
    CHECK(bitwise_equal(values(plain_net), values(profiled_net)));
    // The profile is the call's: the next step without one leaves it as it was.
    kernels::cpu::fused_mlp_parts parts;
    profiled.train_step(data.x_view(0), data.y_view(0), parts);
    const auto before = parts.seconds;
    profiled.train_step(data.x_view(1), data.y_view(1));
    CHECK(parts.seconds == before);
  }
}

TEST_CASE("the fused step with AdamW, an uneven batch and hidden layers of partial tiles") {
  thread_settings_guard guard;
  kernels::cpu::set_thread_balancing(true);
  // 100 hidden units: 7 tiles, the last of 4 units, the bias gradient's last strip 36 columns; a batch of 50 rows.
  using Net = Sequential<policy::cpu, Input<300>, Dense<100, ReLU>, Dense<10>>;
  const batches<Net> data(50, 3);
  set_num_threads(1);
  const auto reference = trained(data, 4, false, true);
  CHECK(bitwise_equal(trained(data, 4, true, true), reference));
  set_num_threads(2);
  kernels::cpu::set_fixed_thread_shares({2, 5});
  CHECK(bitwise_equal(trained(data, 4, true, true), reference));
  // 80 hidden units: the bias gradient's last strip is one vector, summed in four chains; 3 outputs.
  using Narrow = Sequential<policy::cpu, Input<200>, Dense<80, ReLU>, Dense<3>>;
  const batches<Narrow> narrow_data(48, 3);
  set_num_threads(1);
  const auto narrow_reference = trained(narrow_data, 3, false);
  set_num_threads(2);
  for (const std::vector<double>& shares : {std::vector<double>{1, 1}, {1, 4}, {4, 1}}) {
    kernels::cpu::set_fixed_thread_shares(shares);
    CHECK(bitwise_equal(trained(narrow_data, 3, true), narrow_reference));
  }
}

TEST_CASE("the fused step with bfloat16 products takes cpu_bf16's steps") {
  thread_settings_guard guard;
  using Net = Sequential<policy::cpu_bf16, Input<784>, Dense<128, ReLU>, Dense<10>>;
  const batches<Net> data(64, 3);
  set_num_threads(2);
  const auto reference = trained(data, 3, false);
  CHECK(bitwise_equal(trained(data, 3, true), reference));
}
#endif

TEST_CASE("a learning-rate scheduler drives the fused step's Adam as it drives an optimizer") {
  thread_settings_guard guard;
  set_num_threads(2);
  using Net = Sequential<policy::cpu, Input<784>, Dense<128, ReLU>, Dense<10>>;
  const batches<Net> data(64, 3);
  Net plain(64, 3), fused(64, 3);
  optim::Adam opt(optim::adam_options{.lr = 2e-3});
  fused_mlp_trainer<Net> trainer(fused, optim::adam_options{.lr = 2e-3});
  optim::StepLR plain_schedule(opt, {.step_size = 1, .gamma = 0.5});
  optim::StepLR fused_schedule(trainer, {.step_size = 1, .gamma = 0.5});
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int b = 0; b < 3; ++b) {
      const float plain_loss = plain.train_step(data.x_view(b), data.y_view(b), loss::cross_entropy{}, opt);
      const float fused_loss = trainer.train_step(data.x_view(b), data.y_view(b));
      CHECK(std::memcmp(&plain_loss, &fused_loss, sizeof plain_loss) == 0);
    }
    plain_schedule.step();
    fused_schedule.step();
    CHECK(trainer.lr() == opt.lr());
  }
  CHECK(trainer.lr() == doctest::Approx(2e-3 / 8));
  CHECK(std::memcmp(plain.parameter_values().data(), fused.parameter_values().data(),
                    plain.parameter_values().size() * sizeof(float)) == 0);
  CHECK_THROWS_WITH_AS(trainer.set_lr(-1), doctest::Contains("expected lr >= 0"), error);
}

TEST_CASE("the fused step refuses what it cannot train, before changing anything") {
  using Net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<32, ReLU>, Dense<10>>;
  Net net(8, 1);
  CHECK_THROWS_WITH_AS(fused_mlp_trainer<Net>(net, optim::adam_options{.amsgrad = true}),
                       doctest::Contains("expected Adam without amsgrad"), error);
  CHECK_THROWS_WITH_AS(fused_mlp_trainer<Net>(net, optim::adam_options{.clip = {.norm = 1.0}}),
                       doctest::Contains("clipping"), error);
  CHECK_THROWS_WITH_AS(fused_mlp_trainer<Net>(net, optim::adam_options{.lr = -1}),
                       doctest::Contains("expected lr, eps and weight decay >= 0"), error);
  fused_mlp_trainer<Net> trainer(net);
  const std::vector<float> before(net.parameter_values().begin(), net.parameter_values().end());
  std::vector<float> x(8 * 784, 0.5f);
  std::vector<std::int64_t> labels(8, 3);
  // More samples than the model was built for, and a batch of the wrong sample shape.
  std::vector<float> big(9 * 784, 0.5f);
  CHECK_THROWS_WITH_AS(trainer.train_step({big.data(), shape{9, 28, 28}}, {labels.data(), shape{8}}),
                       doctest::Contains("expected a batch of 1 to 8 samples of 784 values"), error);
  CHECK_THROWS_WITH_AS(trainer.train_step({x.data(), shape{8, 784}}, {labels.data(), shape{8}}),
                       doctest::Contains("found shape"), error);
  CHECK_THROWS_WITH_AS(trainer.train_step({x.data(), shape{8, 28, 28}}, {labels.data(), shape{7}}),
                       doctest::Contains("expected 8 labels"), error);
  labels[5] = 10;
  CHECK_THROWS_WITH_AS(trainer.train_step({x.data(), shape{8, 28, 28}}, {labels.data(), shape{8}}),
                       doctest::Contains("row 5"), error);
  labels[5] = 3;
  net.freeze(1);
  CHECK_THROWS_WITH_AS(trainer.train_step({x.data(), shape{8, 28, 28}}, {labels.data(), shape{8}}),
                       doctest::Contains("found layer 1 frozen"), error);
  CHECK(trainer.steps() == 0);
  CHECK(std::memcmp(before.data(), net.parameter_values().data(), before.size() * sizeof(float)) == 0);
  net.unfreeze(1);
  CHECK(std::isfinite(trainer.train_step({x.data(), shape{8, 28, 28}}, {labels.data(), shape{8}})));
  CHECK(trainer.steps() == 1);
}
