// Convolution, pooling, normalisation and dropout in both modes: finite-difference gradient checks in double (static
// through a Sequential, dynamic per op and module), static and dynamic agreement on a small CNN, buffers versus
// parameters in state_dict, static SyncBatchNorm in one process (BatchNorm's bits, alone or through one replica's
// sums), and dropout's statistics.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"
#include "same_training.hpp"

using namespace kiln;
using V = nn::basic_variable<double>;

namespace {

// ---- static mode ---------------------------------------------------------------------------------------------------

template <class Net>
Tensor<double> random_input(index_t batch, std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<double> x(Net::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<double>();
  return x;
}

// Checks every parameter gradient of a static model against central differences of the training-mode loss (batch
// statistics, as the backward assumes; loss_value would evaluate with the running statistics).
template <class Net>
void check_static_gradients(Net& net, const Tensor<double>& x, const Tensor<double>& target) {
  loss::mse loss;
  net.train();
  net.forward_backward(x, target, loss);
  std::vector<double> analytic(net.gradient_values().begin(), net.gradient_values().end());
  auto loss_at = [&] {
    auto y = net.forward(x);
    return loss.template forward_backward<policy::cpu>(y.data(), target.data(), static_cast<double*>(nullptr),
                                                       x.extent(0), Net::output_shape::size);
  };
  auto params = net.parameter_values();
  const double h = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    double saved = params[i];
    params[i] = saved + h;
    double up = loss_at();
    params[i] = saved - h;
    double down = loss_at();
    params[i] = saved;
    double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(numeric)));
  }
  CHECK(worst < 1e-6);
}

// replicas: the sums over the replicas the model's SyncBatchNorm layers take, or null for a model alone.
template <class Net>
void run_static_check(std::uint64_t seed, index_t batch = 3, replica_reducer* replicas = nullptr) {
  Net net(batch, seed);
  net.set_replicas(replicas);
  // Perturb the parameters away from the tidy initial values (BatchNorm's 1 and 0) so every term is exercised.
  random_generator rng(seed + 100);
  for (auto& p : net.parameter_values()) p += 0.1 * rng.normal<double>();
  auto x = random_input<Net>(batch, seed + 1);
  Tensor<double> target(Net::output_shape::batch_shape(batch));
  for (auto& v : target.span()) v = rng.normal<double>();
  check_static_gradients(net, x, target);
}

// The sums over the replicas of a model alone as data-parallel training would see it, one replica: every value is
// its own sum. It counts the sums asked for.
struct one_replica final : replica_reducer {
  int sums = 0;
  void sum(std::span<float>) override { ++sums; }
  void sum(std::span<double>) override { ++sums; }
};

// A convolutional net whose normalisation layers are Norm2d and Norm1d: three Norm2d (one in a Residual's body, one in
// its Shortcut) and one Norm1d.
template <class Norm2d, class Norm1d>
using normalized_net =
    Sequential<policy::cpu, Input<2, 6, 6>, Conv2D<4, 3, conv_options{.padding = 1}>, Norm2d, ReLU,
               Residual<Shortcut<Conv2D<6, 1, conv_options{.stride = 2}>, Norm2d>,
                        Conv2D<6, 3, conv_options{.stride = 2, .padding = 1}>, Norm2d, ReLU>,
               Flatten, Dense<8>, Norm1d, Tanh, Dense<3>>;

// Trains a and b (the same layers and seed) for `steps` SGD steps on one batch of `batch` samples: the same losses
// and gradients at every step, then the same state dict (names and values) and the same predictions, bit for bit.
template <class A, class B>
void require_same_bits(A& a, B& b, index_t batch, int steps) {
  random_generator rng(12);
  Tensor<float> x(A::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = 0.5f + rng.normal<float>();
  Tensor<std::int64_t> labels(shape{batch});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(A::output_shape::size));
  optim::SGD sgd_a({.lr = 0.1, .momentum = 0.9}), sgd_b({.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const float loss_a = a.train_step(x, labels, loss::cross_entropy{}, sgd_a);
    REQUIRE(loss_a == b.train_step(x, labels, loss::cross_entropy{}, sgd_b));
    REQUIRE(std::ranges::equal(a.gradient_values(), b.gradient_values()));
  }
  const auto dict_a = a.state_dict(), dict_b = b.state_dict();
  REQUIRE(dict_a.size() == dict_b.size());
  for (std::size_t i = 0; i < dict_a.size(); ++i) {
    CAPTURE(dict_a[i].first);
    CHECK(dict_a[i].first == dict_b[i].first);
    CHECK(std::ranges::equal(dict_a[i].second.span(), dict_b[i].second.span()));
  }
  CHECK(std::ranges::equal(a.predict(x).span(), b.predict(x).span()));
}

// ---- dynamic mode --------------------------------------------------------------------------------------------------

V random_leaf(const shape& s, std::uint64_t seed, double scale = 1.0, bool requires_grad = true) {
  random_generator rng(seed);
  Tensor<double> t(s);
  for (auto& v : t.span()) v = scale * rng.normal<double>();
  return V(t, requires_grad);
}

void check_gradients(const std::vector<V>& leaves, const std::function<V()>& f, double tolerance = 1e-6) {
  for (const auto& leaf : leaves) leaf.zero_grad();
  V loss = f();
  loss.backward();
  CHECK(nn::tape_size<double>() == 0);
  const double eps = 1e-6;
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    const V& leaf = leaves[l];
    REQUIRE(leaf.has_grad());
    auto value = leaf.value();
    auto grad = leaf.grad();
    double worst = 0;
    for (index_t i = 0; i < leaf.numel(); ++i) {
      double saved = value[i];
      double plus, minus;
      {
        nn::no_grad guard;
        value[i] = saved + eps;
        plus = f().item();
        value[i] = saved - eps;
        minus = f().item();
        value[i] = saved;
      }
      double numeric = (plus - minus) / (2 * eps);
      double scale = std::max({1.0, std::abs(numeric), std::abs(grad[i])});
      worst = std::max(worst, std::abs(grad[i] - numeric) / scale);
    }
    INFO("leaf ", l);
    CHECK(worst <= tolerance);
  }
}

// sum(y * w) for fixed random w.
V weighted_sum(const V& y, std::uint64_t seed = 99) {
  V w = random_leaf(y.shape(), seed, 1.0, false);
  return nn::sum(nn::mul(y, w));
}

// The convolutions that the kernel-level Conv2D tests run on 16 x 16 planes: a padded 3x3 one, a strided grouped one
// and a pointwise one (whose GEMM writes dx in place).
struct conv_case {
  index_t channels, out_channels, kernel, stride, pad, groups;
  conv_geometry geometry() const {
    return make_conv_geometry(channels, 16, 16, out_channels, kernel, kernel, stride, stride, pad, pad, 1, 1, groups);
  }
};
constexpr conv_case conv_cases[] = {{8, 16, 3, 1, 1, 1}, {8, 12, 3, 2, 0, 2}, {6, 10, 1, 1, 0, 1}};

std::vector<float> normal_values(random_generator& rng, index_t count) {
  std::vector<float> values(static_cast<std::size_t>(count));
  for (auto& v : values) v = rng.normal<float>();
  return values;
}

}  // namespace

TEST_CASE("static gradients: Conv2D with stride, padding, same, dilation, groups, no bias") {
  using Net = Sequential<policy::cpu, InputOf<double, 2, 7, 6>, Conv2D<4, 3, conv_options{.stride = 2, .padding = 1}>,
                         Tanh, Conv2D<4, 2, conv_options{.dilation = 2, .groups = 2}>, Tanh,
                         Conv2D<2, 3, conv_options{.same = true, .bias = false}>, Tanh, Conv2D<3, 1>, Flatten,
                         Dense<2>>;
  run_static_check<Net>(1);
  using Even = Sequential<policy::cpu, InputOf<double, 3, 5, 5>, Conv2D<3, 2, conv_options{.same = true}>, Tanh,
                          Conv2D<6, 3, conv_options{.stride = 2, .padding = 1, .dilation = 2, .groups = 3}>, Flatten,
                          Dense<2>>;
  run_static_check<Even>(2);
}

TEST_CASE("static gradients: MaxPool2D, AvgPool2D (padding, ceil mode), GlobalAvgPool2D") {
  using Net = Sequential<policy::cpu, InputOf<double, 2, 7, 7>, Conv2D<3, 2>, MaxPool2D<2>, Tanh,
                         Conv2D<3, 1>, AvgPool2D<3, 2, 1, true>, Conv2D<4, 1>, MaxPool2D<3, 2, 1, true>,
                         Conv2D<4, 1>, AvgPool2D<2, 1, 1, false, false>, GlobalAvgPool2D, Dense<2>>;
  run_static_check<Net>(3);
}

TEST_CASE("static gradients: BatchNorm1d, BatchNorm2d (training), LayerNorm") {
  using Bn2 = Sequential<policy::cpu, InputOf<double, 2, 4, 4>, Conv2D<3, 3>, BatchNorm2d<>, Tanh, Flatten,
                         Dense<5>, BatchNorm1d<0.2>, Tanh, Dense<2>>;
  run_static_check<Bn2>(4, 4);
  using Bn1 = Sequential<policy::cpu, InputOf<double, 3>, Dense<4>, Tanh, BatchNorm1d<0.1, 1e-3, false>, Dense<2>>;
  run_static_check<Bn1>(5, 3);
  using Bn1L = Sequential<policy::cpu, InputOf<double, 3, 4>, BatchNorm1d<>, Tanh, Flatten, Dense<2>>;
  run_static_check<Bn1L>(7, 3);
  using Ln = Sequential<policy::cpu, InputOf<double, 2, 3, 4>, Conv2D<3, 1>, LayerNorm<3, 4>, Tanh, LayerNorm<>,
                        Conv2D<2, 1>, layer_norm_layer<1e-3, false, 4>, Flatten, Dense<3>, LayerNorm<3>>;
  run_static_check<Ln>(6, 2);
}

TEST_CASE("static gradients: SyncBatchNorm1d, SyncBatchNorm2d through the sums over the replicas") {
  // With one replica's sums the layers take their data-parallel path: the statistics from sums over the replicas,
  // the input gradient from the summed gradient sums. The first layer (no dx to write) still takes part in the sums.
  one_replica replicas;
  using Bn2 = Sequential<policy::cpu, InputOf<double, 2, 4, 4>, Conv2D<3, 3>, SyncBatchNorm2d<>, Tanh, Flatten,
                         Dense<5>, SyncBatchNorm1d<0.2>, Tanh, Dense<2>>;
  run_static_check<Bn2>(4, 4, &replicas);
  using Bn1L = Sequential<policy::cpu, InputOf<double, 3, 4>, SyncBatchNorm1d<0.1, 1e-3, false>, Tanh, Flatten,
                          Dense<2>>;
  run_static_check<Bn1L>(7, 3, &replicas);
  CHECK(replicas.sums > 0);
}

TEST_CASE("static shapes: inference and accepts") {
  using Net = Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3>, ReLU, Conv2D<64, 3>, ReLU, MaxPool2D<2>,
                         Dropout<0.25>, Flatten, Dense<128, ReLU>, Dense<10>>;
  static_assert(std::is_same_v<Net::output_shape, dims<10>>);
  static_assert(Net::parameter_count() == 32 * 9 + 32 + 64 * 32 * 9 + 64 + 9216 * 128 + 128 + 1290);
  static_assert(!Conv2D<8, 7>::accepts<dims<1, 4, 4>>);
  static_assert(!Conv2D<8, 3, conv_options{.groups = 2}>::accepts<dims<3, 8, 8>>);
  static_assert(Conv2D<8, 3, conv_options{.groups = 2}>::accepts<dims<4, 8, 8>>);
  static_assert(std::is_same_v<Conv2D<8, 4, conv_options{.same = true}>::bind<dims<2, 9, 9>>::output, dims<8, 9, 9>>);
  static_assert(std::is_same_v<MaxPool2D<2>::bind<dims<3, 5, 5>>::output, dims<3, 2, 2>>);
  static_assert(std::is_same_v<MaxPool2D<2, 2, 0, true>::bind<dims<3, 5, 5>>::output, dims<3, 3, 3>>);
  static_assert(std::is_same_v<GlobalAvgPool2D::bind<dims<3, 5, 5>>::output, dims<3>>);
  static_assert(!BatchNorm2d<>::accepts<dims<4>>);
  static_assert(!LayerNorm<5>::accepts<dims<3, 4>>);
  Net net(2, 0);
  CHECK(net.summary_rows()[0].name == "Conv2D(3x3)");
}

TEST_CASE("dynamic gradients: conv2d") {
  V x = random_leaf({2, 4, 6, 5}, 1);
  struct conv_case {
    shape w;
    index_t stride;
    nn::conv_padding padding;
    index_t dilation, groups;
    bool bias;
  };
  for (const auto& c : {conv_case{{3, 4, 3, 3}, 1, 0, 1, 1, true}, conv_case{{4, 2, 3, 2}, 2, 1, 1, 2, true},
                        conv_case{{2, 4, 2, 2}, 1, "same", 2, 1, false}, conv_case{{4, 1, 3, 3}, 2, 2, 2, 4, true},
                        conv_case{{3, 4, 1, 1}, 1, 0, 1, 1, true}, conv_case{{3, 4, 4, 4}, 1, "same", 1, 1, true}}) {
    CAPTURE(c.w);
    V w = random_leaf(c.w, 2), b = random_leaf({c.w[0]}, 3);
    std::vector<V> leaves{x, w};
    if (c.bias) leaves.push_back(b);
    check_gradients(leaves, [&] {
      V y = nn::conv2d(x, w, c.bias ? b : V(), c.stride, c.padding, c.dilation, c.groups);
      return weighted_sum(nn::tanh(y));
    });
  }
  // x used twice: the second use accumulates into x's gradient.
  V w = random_leaf({4, 4, 3, 3}, 4);
  check_gradients({x, w}, [&] { return weighted_sum(nn::add(nn::conv2d(x, w, V(), 1, 1), x)); });
}

TEST_CASE("dynamic gradients: pooling") {
  V x = random_leaf({2, 3, 7, 6}, 5);
  check_gradients({x}, [&] { return weighted_sum(nn::max_pool2d(x, 2)); });
  check_gradients({x}, [&] { return weighted_sum(nn::max_pool2d(x, 3, 2, 1, true)); });
  check_gradients({x}, [&] { return weighted_sum(nn::avg_pool2d(x, 3, 2, 1, true)); });
  check_gradients({x}, [&] { return weighted_sum(nn::avg_pool2d(x, 2, 1, 1, false, false)); });
  check_gradients({x}, [&] { return weighted_sum(nn::global_avg_pool2d(x)); });
  check_gradients({x}, [&] { return weighted_sum(nn::adaptive_avg_pool2d(x, 1)); });
  check_gradients({x}, [&] { return weighted_sum(nn::add(nn::max_pool2d(x, 1), x)); });
}

TEST_CASE("dynamic gradients: batch_norm, layer_norm, dropout") {
  V x4 = random_leaf({3, 2, 3, 2}, 6), x2 = random_leaf({5, 3}, 7), x3 = random_leaf({2, 3, 4}, 8);
  V gamma = random_leaf({2}, 9, 0.5), beta = random_leaf({2}, 10);
  V rm = random_leaf({2}, 11, 0.1, false), rv(Tensor<double>(shape{2}, {0.5, 2.0}));
  for (bool training : {true, false}) {
    CAPTURE(training);
    check_gradients({x4, gamma, beta}, [&] {
      return weighted_sum(nn::tanh(nn::batch_norm(x4, rm, rv, gamma, beta, training, 0.1, 1e-5)));
    });
  }
  V g3 = random_leaf({3}, 12), b3 = random_leaf({3}, 13);
  check_gradients({x2, g3, b3}, [&] { return weighted_sum(nn::batch_norm(x2, V(), V(), g3, b3, true)); });
  check_gradients({x2}, [&] { return weighted_sum(nn::batch_norm(x2, V(), V(), V(), V(), true)); });
  V g34 = random_leaf({3, 4}, 14), b34 = random_leaf({3, 4}, 15);
  check_gradients({x3, g34, b34}, [&] { return weighted_sum(nn::tanh(nn::layer_norm(x3, {3, 4}, g34, b34))); });
  V g4 = random_leaf({4}, 16), b4 = random_leaf({4}, 17);
  check_gradients({x3, g4, b4}, [&] { return weighted_sum(nn::layer_norm(x3, {4}, g4, b4, 1e-3)); });
  check_gradients({x3}, [&] { return weighted_sum(nn::layer_norm(x3, {4})); });
  // The same mask for every evaluation: a fresh copy of one generator each time.
  random_generator rng(5);
  check_gradients({x3}, [&] {
    random_generator copy = rng;
    return weighted_sum(nn::dropout(x3, 0.4, true, copy));
  });
}

TEST_CASE("dynamic gradients: modules in a Sequential") {
  manual_seed(7);
  nn::basic_sequential<double> net(nn::basic_conv2d<double>(2, 4, 3, 1, 1), nn::basic_batch_norm2d<double>(4),
                                   nn::basic_tanh<double>(), nn::basic_max_pool2d<double>(2),
                                   nn::basic_conv2d<double>(4, 4, 3, 1, "same", 1, 2),
                                   nn::basic_avg_pool2d<double>(2, 1), nn::basic_layer_norm<double>(shape{4, 2, 2}),
                                   nn::basic_global_avg_pool2d<double>(), nn::basic_linear<double>(4, 3),
                                   nn::basic_batch_norm1d<double>(3));
  V x = random_leaf({3, 2, 6, 6}, 18);
  std::vector<V> leaves{x};
  for (auto& p : net.parameters()) leaves.push_back(p);
  CHECK(leaves.size() == 1 + 2 + 2 + 2 + 2 + 2 + 2);
  check_gradients(leaves, [&] { return weighted_sum(net(x)); });
}

TEST_CASE("Conv2d takes one image unbatched, as PyTorch's, and says how to add a missing channel dimension") {
  manual_seed(3);
  nn::Conv2d conv(1, 4, 3, 1, 1);
  random_generator rng(4);
  Tensor<float> image({1, 5, 5});
  for (auto& v : image.span()) v = rng.normal<float>();
  Tensor<float> batched = image;
  batched.reshape(shape{1, 1, 5, 5});
  const auto one = conv(nn::Variable(image)).tensor();
  const auto many = conv(nn::Variable(batched)).tensor();
  REQUIRE(one.shape() == shape{4, 5, 5});
  for (index_t i = 0; i < one.numel(); ++i) REQUIRE(one.data()[i] == many.data()[i]);
  // Its gradient flows as the batched one's.
  nn::Variable x(image, true);
  nn::sum(conv(x)).backward();
  CHECK(x.grad().shape() == shape{1, 5, 5});
  Tensor<float> mnist_like({8, 5, 5});
  CHECK_THROWS_WITH_AS(conv(nn::Variable(mnist_like)), doctest::Contains("add their channel dimension: unsqueeze(x, 1)"),
                       kiln::error);
}

TEST_CASE("static and dynamic mode: same weights and identical losses for a small CNN") {
  using Net = Sequential<policy::cpu, Input<1, 8, 8>, Conv2D<4, 3, conv_options{.padding = 1}>, ReLU, MaxPool2D<2>,
                         Conv2D<6, 3, conv_options{.groups = 2, .bias = false}>, BatchNorm2d<>, ReLU, AvgPool2D<2>,
                         Flatten, Dense<5>, LayerNorm<5>, Dropout<0.0>, Dense<3>>;
  Net net(8, 31);
  manual_seed(31);
  nn::Sequential model(nn::Conv2d(1, 4, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2), nn::Conv2d(4, 6, 3, 1, 0, 1, 2, false),
                       nn::BatchNorm2d(6), nn::ReLU(), nn::AvgPool2d(2), nn::Flatten(), nn::Linear(6, 5),
                       nn::LayerNorm(5), nn::Dropout(0.0), nn::Linear(5, 3));
  auto static_dict = net.state_dict();
  auto dynamic_dict = model.state_dict();
  REQUIRE(static_dict.size() == dynamic_dict.size());
  for (std::size_t i = 0; i < static_dict.size(); ++i) {
    CHECK(static_dict[i].first == dynamic_dict[i].first);
    REQUIRE(static_dict[i].second.shape() == dynamic_dict[i].second.shape());
    for (index_t j = 0; j < static_dict[i].second.numel(); ++j)
      CHECK(static_dict[i].second[j] == dynamic_dict[i].second[j]);
  }
  random_generator rng(4);
  Tensor<float> x(shape{8, 1, 8, 8});
  Tensor<std::int64_t> y(shape{8});
  for (auto& v : x.span()) v = rng.normal<float>();
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(3));
  // One optimizer slot per tensor in both modes. (The optimizer's update of an element can differ by an ulp between
  // one flat slot and per-tensor slots, the compiler's vector body and scalar tail falling differently.)
  net.set_options({.flat_parameters = false});
  optim::Adam static_opt({.lr = 1e-2});
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-2});
  nn::Variable input(x);
  for (int step = 0; step < 4; ++step) {
    float s = net.train_step(x, y, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(input), y);
    l.backward();
    dynamic_opt.step();
    CHECK(s == l.item());
  }
  // Not just the losses: every parameter and buffer, bit for bit. (Equal losses hid parameters an ulp apart when the
  // compiler contracted a * b + c into an FMA in one mode's inlined copy of a kernel and not in the other's.)
  {
    const auto trained_static = net.state_dict();
    const auto trained_dynamic = model.state_dict();
    for (std::size_t i = 0; i < trained_static.size(); ++i) {
      CAPTURE(trained_static[i].first);
      int differing = 0;
      for (index_t j = 0; j < trained_static[i].second.numel(); ++j)
        differing += std::memcmp(&trained_static[i].second[j], &trained_dynamic[i].second[j], sizeof(float)) != 0;
      CHECK(differing == 0);
    }
  }
  // Fresh models: three training forwards update the running statistics identically, and evaluation with them
  // gives the same loss.
  Net fresh(8, 31);
  manual_seed(31);
  nn::Sequential again(nn::Conv2d(1, 4, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2), nn::Conv2d(4, 6, 3, 1, 0, 1, 2, false),
                       nn::BatchNorm2d(6), nn::ReLU(), nn::AvgPool2d(2), nn::Flatten(), nn::Linear(6, 5),
                       nn::LayerNorm(5), nn::Dropout(0.0), nn::Linear(5, 3));
  for (int step = 0; step < 3; ++step) {
    fresh.forward(x);
    again(input);
  }
  static_dict = fresh.state_dict();
  dynamic_dict = again.state_dict();
  for (std::size_t i = 0; i < static_dict.size(); ++i)
    for (index_t j = 0; j < static_dict[i].second.numel(); ++j)
      CHECK(static_dict[i].second[j] == dynamic_dict[i].second[j]);
  fresh.eval();
  again.eval();
  float s = fresh.loss_value(x, y, loss::cross_entropy{});
  nn::no_grad guard;
  CHECK(s == nn::cross_entropy(again(input), y).item());
}

TEST_CASE("BatchNorm keeps running statistics as buffers, apart from its parameters") {
  using Net = Sequential<policy::cpu, Input<1, 4, 4>, Conv2D<3, 3>, BatchNorm2d<>, Flatten, Dense<2>>;
  Net net(2, 1);
  std::vector<std::string> names;
  for (auto& [name, tensor] : net.state_dict()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                          "1.running_var", "1.num_batches_tracked", "3.weight", "3.bias"});
  std::vector<std::string> params;
  for (auto& p : Net::named_parameter_infos()) params.push_back(p.name);
  CHECK(params == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"});
  CHECK(net.state_dict()[5].second[0] == 1.0f);  // running_var starts at 1

  nn::Sequential model(nn::Conv2d(1, 3, 3), nn::BatchNorm2d(3), nn::Flatten(), nn::Linear(12, 2));
  std::vector<std::string> dynamic_names, buffer_names, parameter_names;
  for (auto& [name, tensor] : model.state_dict()) dynamic_names.push_back(name);
  for (auto& [name, v] : model.named_buffers()) buffer_names.push_back(name);
  for (auto& [name, v] : model.named_parameters()) parameter_names.push_back(name);
  CHECK(dynamic_names == names);
  CHECK(buffer_names == std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"});
  CHECK(parameter_names == params);
  // Training steps count batches; evaluation leaves the buffers alone.
  nn::Variable x(Tensor<float>(shape{2, 1, 4, 4}, 0.5f));
  model(x);
  model(x);
  CHECK(model.named_buffers()[2].second.item() == 2.0f);
  model.eval();
  model(x);
  CHECK(model.named_buffers()[2].second.item() == 2.0f);
}

TEST_CASE("SyncBatchNorm without replicas is BatchNorm: the same names, the same bits") {
  // A model alone (not data-parallel) runs BatchNorm's kernels, in the Sequential and inside blocks.
  normalized_net<BatchNorm2d<>, BatchNorm1d<0.2>> batch_norm(6, 3);
  normalized_net<SyncBatchNorm2d<>, SyncBatchNorm1d<0.2>> synced(6, 3);
  CHECK(synced.replicas() == nullptr);
  require_same_bits(batch_norm, synced, 6, 5);
  CHECK(synced.summary_rows()[1].name == "SyncBatchNorm2d");
}

TEST_CASE("SyncBatchNorm through one replica's sums: BatchNorm's bits, every layer summing in every training pass") {
  // The data-parallel path with one replica sums nothing, and computes what BatchNorm computes by the same code. The
  // layers inside the Residual and its Shortcut reach the sums too: two in each forward and one in each backward, for
  // each of the four layers; evaluation sums nothing.
  normalized_net<BatchNorm2d<>, BatchNorm1d<0.2>> batch_norm(6, 3);
  normalized_net<SyncBatchNorm2d<>, SyncBatchNorm1d<0.2>> synced(6, 3);
  one_replica replicas;
  synced.set_replicas(&replicas);
  require_same_bits(batch_norm, synced, 6, 5);
  CHECK(replicas.sums == 5 * 4 * 3);
  // The replicas stay with the object they were lent to: a copy or a move is a model alone, and a model assigned to
  // keeps its own.
  auto copy = synced;
  CHECK(copy.replicas() == nullptr);
  const auto moved = std::move(copy);
  CHECK(moved.replicas() == nullptr);
  synced = moved;
  CHECK(synced.replicas() == &replicas);
}

TEST_CASE("Dropout: two layers draw masks of their own, the same in both modes") {
  // Two modules built after one manual_seed: independent masks (about a quarter of the elements dropped by both),
  // not the same mask twice.
  const index_t n = 100000;
  Tensor<float> ones(shape{n}, 1.0f);
  manual_seed(11);
  nn::Dropout first(0.5f), second(0.5f);
  nn::Variable x(ones);
  auto a = first(x);
  auto b = second(x);
  index_t both = 0, differ = 0;
  for (index_t i = 0; i < n; ++i) {
    both += a.value()[i] == 0.0f && b.value()[i] == 0.0f;
    differ += (a.value()[i] == 0.0f) != (b.value()[i] == 0.0f);
  }
  CHECK(std::abs(double(both) / n - 0.25) < 0.01);
  CHECK(std::abs(double(differ) / n - 0.5) < 0.01);

  // A model with two dropout layers (and a stacked LSTM's dropout would be a third kind of drawer, see
  // test_recurrent): static and dynamic mode draw the same masks and give identical losses.
  const std::uint64_t seed = 9;
  using Net = Sequential<policy::cpu, Input<20>, Dropout<0.2>, Dense<32, ReLU>, Dropout<0.5>, Dense<4>>;
  Net net(16, seed);
  manual_seed(seed);
  nn::Sequential model(nn::Dropout(0.2f), nn::Linear(20, 32), nn::ReLU(), nn::Dropout(0.5f), nn::Linear(32, 4));
  random_generator rng(10);
  Tensor<float> input(shape{16, 20});
  for (auto& v : input.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels(shape{16});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(4));
  optim::Adam static_opt({.lr = 1e-2});
  optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-2});
  nn::Variable v(input);
  for (int step = 0; step < 8; ++step) {
    float s = net.train_step(input, labels, loss::cross_entropy{}, static_opt);
    dynamic_opt.zero_grad();
    auto l = nn::cross_entropy(model(v), labels);
    l.backward();
    dynamic_opt.step();
    CAPTURE(step);
    REQUIRE(s == l.item());
  }
  // Each layer owns one generator, in layer order, on the streams of the seed.
  REQUIRE(net.runtime_generators().size() == 2);
  auto generators = model.runtime_generators();
  REQUIRE(generators.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(net.runtime_generators()[k].state().stream == runtime_stream_base + k);
    CHECK(generators[k]->state().stream == runtime_stream_base + k);
    CHECK(generators[k]->state().position == net.runtime_generators()[k].state().position);
  }
}

TEST_CASE("Dropout: identity in evaluation, the expected fraction dropped in training") {
  const index_t n = 100000;
  Tensor<float> ones(shape{n}, 1.0f);
  nn::Dropout drop(0.3f);
  nn::Variable x(ones);
  auto y = drop(x);
  index_t zeros = 0;
  for (index_t i = 0; i < n; ++i) {
    float v = y.value()[i];
    CHECK((v == 0.0f || std::abs(v - 1.0f / 0.7f) < 1e-6f));
    zeros += v == 0.0f;
  }
  CHECK(std::abs(double(zeros) / n - 0.3) < 0.01);
  drop.eval();
  auto z = drop(x);
  for (index_t i = 0; i < n; ++i) CHECK(z.value()[i] == 1.0f);

  using Net = Sequential<policy::cpu, Input<1000>, Dropout<0.5>, Dense<1>>;
  Net net(10, 3);
  Tensor<float> input(shape{10, 1000}, 2.0f);
  net.train();
  auto out = net.forward(input);
  (void)out;
  net.eval();
  auto a = net.forward(input);
  float eval_value = a.data()[0];
  auto b = net.predict(input);
  CHECK(b[0] == eval_value);
  // In training the first layer's output holds zeros and 4s in about equal numbers.
  net.train();
  Tensor<float> labels(shape{10, 1}, 0.0f);
  net.forward_backward(input, labels, loss::mse{});
  // Same seed, same masks: two models agree step for step.
  Net again(10, 3);
  CHECK(again.forward_backward(input, labels, loss::mse{}) == Net(10, 3).forward_backward(input, labels, loss::mse{}));
}

TEST_CASE("MaxPool 2x2 stride 2: the straight-line path gives the generic window's results, ties and NaN included") {
  // Values from {-0, 0, 1, 2} make most windows tie; a few NaN must win their window and take its gradient.
  // 7 and 35: the last row and column lie outside every window; 35 and 40 make rows of more than 16 windows (the
  // AVX-512 path takes 16 at a time, the rest masked).
  for (const index_t height : {6, 7, 35, 40}) {
    CAPTURE(height);
    const conv_geometry g = make_pool_geometry(3, height, height, 2, 2, 2, 2, 0, 0, false);
    REQUIRE(kernels::cpu::pooling_kernels::is_plain_2x2(g));
    const index_t planes = 2 * g.channels, in_plane = g.height * g.width;
    random_generator rng(17);
    std::vector<float> x(static_cast<std::size_t>(planes * in_plane)), dy(static_cast<std::size_t>(planes * g.out_plane()));
    for (auto& v : x) {  // -0 beside +0 in a window: the first of the two is the maximum
      const auto pick = rng.below(4);
      v = pick == 3 ? -0.0f : static_cast<float>(pick);
    }
    for (std::size_t i = 5; i < x.size(); i += 23) x[i] = std::nanf("");
    for (auto& v : dy) v = rng.normal<float>();
    std::vector<float> y(dy.size()), dx(x.size(), 0.5f);
    kernels::cpu::pooling_kernels::max_pool_forward(x.data(), y.data(), planes, g);
    kernels::cpu::pooling_kernels::max_pool_backward(x.data(), y.data(), dy.data(), dx.data(), planes, g, true);
    std::vector<float> dx_expected(x.size(), 0.5f), dx_expected_fresh(x.size(), 0.0f);
    int nan_outputs = 0;
    for (index_t p = 0; p < planes; ++p)
      for (index_t oh = 0; oh < g.out_height; ++oh)
        for (index_t ow = 0; ow < g.out_width; ++ow) {
          const index_t o = p * g.out_plane() + oh * g.out_width + ow;
          const float expected = kernels::max_pool_window(x.data() + p * in_plane, oh, ow, g,
                                                          -std::numeric_limits<float>::infinity());
          CHECK((std::bit_cast<std::uint32_t>(y[o]) == std::bit_cast<std::uint32_t>(expected) ||
                 (std::isnan(y[o]) && std::isnan(expected))));
          nan_outputs += std::isnan(expected);
          const index_t at = kernels::max_pool_argmax(x.data() + p * in_plane, expected, oh, ow, g);
          dx_expected[static_cast<std::size_t>(p * in_plane + at)] += dy[static_cast<std::size_t>(o)];
          dx_expected_fresh[static_cast<std::size_t>(p * in_plane + at)] += dy[static_cast<std::size_t>(o)];
        }
    CHECK(nan_outputs > 0);
    CHECK(dx == dx_expected);
    // Overwriting: every pixel is written, those no window takes (and the uncovered last row and column) with zero.
    std::vector<float> dx_fresh(x.size(), 7.0f);
    kernels::cpu::pooling_kernels::max_pool_backward(x.data(), y.data(), dy.data(), dx_fresh.data(), planes, g, false);
    CHECK(dx_fresh == dx_expected_fresh);
  }
}

TEST_CASE("Conv2D forward and backward give the same bits on one thread and two (batch slices)") {
  // Batch 20 with 16 x 16 planes: enough work per sample for policy::cpu to give each of two threads 10 samples, and
  // three groups of the weight gradient's partial sums (8, 8 and 4 samples), two on one thread and one on the other;
  // its backward runs overwriting and accumulating.
  for (const conv_case cc : conv_cases) {
    CAPTURE(cc.kernel);
    CAPTURE(cc.groups);
    const conv_geometry g = cc.geometry();
    const index_t batch = 20;
    random_generator rng(23);
    const auto x = normal_values(rng, batch * g.in_size()), weight = normal_values(rng, g.out_channels * g.group_k()),
               bias = normal_values(rng, g.out_channels), dy = normal_values(rng, batch * g.out_size());
    auto run = [&](int threads) {
      const int saved = num_threads();
      set_num_threads(threads);
      std::vector<float> y(static_cast<std::size_t>(batch * g.out_size())),
          col(static_cast<std::size_t>(batch * g.col_size())), dx(x.size()), dweight(weight.size()),
          dbias(bias.size());
      policy::cpu::conv2d_forward<policy::cpu>(x.data(), weight.data(), bias.data(), y.data(), col.data(), batch, g);
      policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), dx.data(), dweight.data(),
                                                dbias.data(), col.data(), batch, g, false);
      std::vector<float> dweight_sum = weight, dbias_sum = bias;
      float* no_dx = nullptr;
      policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), no_dx, dweight_sum.data(),
                                                dbias_sum.data(), col.data(), batch, g, true);
      set_num_threads(saved);
      std::vector<float> all = y;
      for (const auto* v : {&dx, &dweight, &dbias, &dweight_sum, &dbias_sum})
        all.insert(all.end(), v->begin(), v->end());
      return all;
    };
    const auto one = run(1), two = run(2);
    REQUIRE(one.size() == two.size());
    CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("Pooling and activations over a convolution's output give the same bits on one thread and two") {
  // 128 planes of 24 x 24: enough elements for policy::cpu to cut the planes (and the activation's elements) into
  // one slice per thread. The backward runs both overwriting and accumulating; dx starts from a guard value.
  const conv_geometry max_g = make_pool_geometry(128, 24, 24, 2, 2, 2, 2, 0, 0, false);  // the 2x2 straight-line path
  const conv_geometry window_g = make_pool_geometry(128, 24, 24, 3, 3, 2, 2, 1, 1, true);  // the generic windows
  const index_t planes = max_g.channels, in_plane = max_g.height * max_g.width;
  random_generator rng(29);
  std::vector<float> x(static_cast<std::size_t>(planes * in_plane));
  for (auto& v : x) v = rng.normal<float>();
  auto run = [&](int threads) {
    const int saved = num_threads();
    set_num_threads(threads);
    std::vector<float> all;
    for (const conv_geometry* g : {&max_g, &window_g}) {
      const auto out = static_cast<std::size_t>(planes * g->out_plane());
      std::vector<float> y(out), avg(out), dy(out);
      for (std::size_t i = 0; i < out; ++i) dy[i] = float(i % 7) - 3.0f;
      policy::cpu::max_pool_forward(x.data(), y.data(), planes, *g);
      policy::cpu::avg_pool_forward(x.data(), avg.data(), planes, *g, false);
      for (bool accumulate : {false, true}) {
        std::vector<float> dx_max(x.size(), 0.25f), dx_avg(x.size(), 0.25f);
        policy::cpu::max_pool_backward(x.data(), y.data(), dy.data(), dx_max.data(), planes, *g, accumulate);
        policy::cpu::avg_pool_backward(dy.data(), dx_avg.data(), planes, *g, false, accumulate);
        all.insert(all.end(), dx_max.begin(), dx_max.end());
        all.insert(all.end(), dx_avg.begin(), dx_avg.end());
      }
      all.insert(all.end(), y.begin(), y.end());
      all.insert(all.end(), avg.begin(), avg.end());
    }
    for (const activation a : {activation::relu, activation::gelu}) {
      std::vector<float> y(x.size()), dx(x.size(), 0.25f);
      policy::cpu::activation_forward(a, x.data(), y.data(), index_t(x.size()), 0.01f);
      policy::cpu::activation_backward(a, x.data(), y.data(), x.data(), dx.data(), index_t(x.size()), 0.01f, true);
      all.insert(all.end(), y.begin(), y.end());
      all.insert(all.end(), dx.begin(), dx.end());
    }
    set_num_threads(saved);
    return all;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one.size() == two.size());
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  // The forward results are real pooling: spot-check one window of each kind against the generic window.
  const float expected = kernels::max_pool_window(x.data(), 3, 4, max_g, -std::numeric_limits<float>::infinity());
  std::vector<float> y(static_cast<std::size_t>(planes * max_g.out_plane()));
  policy::cpu::max_pool_forward(x.data(), y.data(), planes, max_g);
  CHECK(y[static_cast<std::size_t>(3 * max_g.out_width + 4)] == expected);
}

TEST_CASE("MaxPool's backward with the activation before it taken in gives the two passes' bits") {
  // The plain 2x2 path (6x6 and 7x7, whose last row and column no window covers) and the generic windows (3x3 at
  // stride 2, padded, overlapping), with every activation, on one thread and two: the fused kernel against
  // max_pool_backward then activation_backward. The pooled values are an activation's outputs (some ties, some at or
  // below zero); act_input is the activation's input, given or not.
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    const int saved = num_threads();
    set_num_threads(threads);
    for (const conv_geometry& g :
         {make_pool_geometry(64, 6, 6, 2, 2, 2, 2, 0, 0, false), make_pool_geometry(64, 7, 7, 2, 2, 2, 2, 0, 0, false),
          make_pool_geometry(64, 9, 9, 3, 3, 2, 2, 1, 1, false)}) {
      CAPTURE(g.height);
      CAPTURE(g.kernel_h);
      const index_t planes = 3 * g.channels, in_plane = g.height * g.width;
      random_generator rng(31);
      std::vector<float> input(static_cast<std::size_t>(planes * in_plane)), dy(static_cast<std::size_t>(planes * g.out_plane()));
      for (auto& v : input) v = static_cast<float>(rng.below(5)) - 2.0f + (rng.below(2) ? 0.5f : 0.0f);
      for (auto& v : dy) v = rng.normal<float>();
      for (const activation a : {activation::relu, activation::leaky_relu, activation::sigmoid, activation::tanh,
                                 activation::gelu}) {
        CAPTURE(static_cast<int>(a));
        std::vector<float> x(input.size()), y(dy.size());
        policy::cpu::activation_forward(a, input.data(), x.data(), index_t(x.size()), 0.1f);
        policy::cpu::max_pool_forward(x.data(), y.data(), planes, g);
        std::vector<float> pooled(x.size(), 3.0f), expected(x.size(), 5.0f), fused(x.size(), 7.0f);
        policy::cpu::max_pool_backward(x.data(), y.data(), dy.data(), pooled.data(), planes, g, false);
        policy::cpu::activation_backward(a, input.data(), x.data(), pooled.data(), expected.data(), index_t(x.size()),
                                         0.1f);
        policy::cpu::max_pool_activated_backward(x.data(), y.data(), dy.data(), fused.data(), planes, g, a,
                                                 input.data(), 0.1f);
        CHECK(std::memcmp(fused.data(), expected.data(), fused.size() * sizeof(float)) == 0);
        // A real gradient: some pixels take one, most get zero.
        CHECK(std::count(expected.begin(), expected.end(), 0.0f) > index_t(expected.size()) / 2);
        CHECK(std::count(expected.begin(), expected.end(), 0.0f) < index_t(expected.size()));
      }
    }
    set_num_threads(saved);
  }
}

TEST_CASE("static MaxPool2D takes in the activation's backward: gradients, and training bit-identical to unfused") {
  // With fused epilogues a MaxPool2D runs the backward of the activation layer before it (a GELU, which no Conv2D
  // takes over, included); gradients still match finite differences, and training gives the unfused model's bits.
  using Net = Sequential<policy::cpu, InputOf<double, 2, 8, 8>, Conv2D<3, 3>, ReLU, MaxPool2D<2>, Conv2D<4, 2>, GELU,
                         MaxPool2D<2, 1>, Flatten, Dense<3>>;
  for (bool fuse : {true, false}) {
    CAPTURE(fuse);
    Net net(3, 23, {.fuse_epilogues = fuse});
    check_static_gradients(net, random_input<Net>(3, 8), Tensor<double>(shape{3, 3}, 0.25));
  }
  using Cnn = Sequential<policy::cpu, Input<2, 12, 12>, Conv2D<6, 3>, Tanh, MaxPool2D<3, 2, 1>, Conv2D<4, 3>, ReLU,
                         MaxPool2D<2>, Flatten, Dense<3>>;
  Cnn fused(8, 5, {.fuse_epilogues = true}), unfused(8, 5, {.fuse_epilogues = false});
  optim::Adam opt_fused({.lr = 1e-2}), opt_unfused({.lr = 1e-2});
  require_same_training(fused, opt_fused, unfused, opt_unfused, 8, 13, 10);
}

TEST_CASE("Conv2D's backward with the activation before it taken in gives the two passes' bits") {
  // Every activation, on one thread and two: conv2d_backward taking in the activation's backward against
  // conv2d_backward then activation_backward. x is the activation's output, act_input its input; without dx the
  // weight and bias gradients are still computed, with the same bits.
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    const int saved = num_threads();
    set_num_threads(threads);
    for (const conv_case cc : conv_cases) {
      CAPTURE(cc.kernel);
      CAPTURE(cc.groups);
      const conv_geometry g = cc.geometry();
      const index_t batch = 20;
      random_generator rng(37);
      const auto input = normal_values(rng, batch * g.in_size()),
                 weight = normal_values(rng, g.out_channels * g.group_k()),
                 dy = normal_values(rng, batch * g.out_size());
      for (const activation a : {activation::relu, activation::leaky_relu, activation::sigmoid, activation::tanh,
                                 activation::gelu}) {
        CAPTURE(static_cast<int>(a));
        std::vector<float> x(input.size()), col(static_cast<std::size_t>(batch * g.col_size())),
            y(static_cast<std::size_t>(batch * g.out_size()));
        policy::cpu::activation_forward(a, input.data(), x.data(), index_t(x.size()), 0.1f);
        const float* no_bias = nullptr;
        policy::cpu::conv2d_forward<policy::cpu>(x.data(), weight.data(), no_bias, y.data(), col.data(), batch, g);
        std::vector<float> conv_dx(x.size(), 3.0f), expected(x.size(), 5.0f), fused(x.size(), 7.0f);
        std::vector<float> dweight(weight.size()), dbias(static_cast<std::size_t>(g.out_channels));
        std::vector<float> fused_dweight(weight.size()), fused_dbias(dbias.size()), bare_dweight(weight.size()),
            bare_dbias(dbias.size());
        policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), conv_dx.data(), dweight.data(),
                                                  dbias.data(), col.data(), batch, g, false);
        policy::cpu::activation_backward(a, input.data(), x.data(), conv_dx.data(), expected.data(),
                                         index_t(x.size()), 0.1f);
        policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), fused.data(),
                                                  fused_dweight.data(), fused_dbias.data(), col.data(), batch, g,
                                                  false, a, input.data(), 0.1f);
        float* no_dx = nullptr;
        policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), no_dx, bare_dweight.data(),
                                                  bare_dbias.data(), col.data(), batch, g, false, a, input.data(),
                                                  0.1f);
        CHECK(std::memcmp(fused.data(), expected.data(), fused.size() * sizeof(float)) == 0);
        for (const auto* v : {&fused_dweight, &bare_dweight})
          CHECK(std::memcmp(v->data(), dweight.data(), dweight.size() * sizeof(float)) == 0);
        for (const auto* v : {&fused_dbias, &bare_dbias})
          CHECK(std::memcmp(v->data(), dbias.data(), dbias.size() * sizeof(float)) == 0);
        // The activation's backward did change the gradient.
        CHECK(std::memcmp(fused.data(), conv_dx.data(), fused.size() * sizeof(float)) != 0);
      }
    }
    set_num_threads(saved);
  }
}

TEST_CASE("static Conv2D takes in the activation's backward: gradients, and training bit-identical to unfused") {
  // With fused epilogues a Conv2D runs the backward of the activation layer before it: a ReLU that the first
  // convolution applies in its forward, a GELU that it cannot, and a Tanh as the first layer, whose input gradient
  // nobody wants (the convolution then computes its parameter gradients alone). Gradients match finite differences;
  // training gives the unfused model's bits.
  using Net = Sequential<policy::cpu, InputOf<double, 2, 8, 8>, Tanh, Conv2D<3, 3>, ReLU, Conv2D<4, 2>, GELU,
                         Conv2D<2, 1>, MaxPool2D<2>, Flatten, Dense<3>>;
  for (bool fuse : {true, false}) {
    CAPTURE(fuse);
    Net net(3, 29, {.fuse_epilogues = fuse});
    check_static_gradients(net, random_input<Net>(3, 9), Tensor<double>(shape{3, 3}, 0.25));
  }
  using Cnn = Sequential<policy::cpu, Input<2, 12, 12>, Conv2D<6, 3>, ReLU, Conv2D<8, 3, conv_options{.padding = 1}>,
                         LeakyReLU<>, MaxPool2D<2>, Flatten, Dense<3>>;
  Cnn fused(8, 7, {.fuse_epilogues = true}), unfused(8, 7, {.fuse_epilogues = false});
  optim::Adam opt_fused({.lr = 1e-2}), opt_unfused({.lr = 1e-2});
  require_same_training(fused, opt_fused, unfused, opt_unfused, 8, 17, 10);
}
