// LSTM and GRU: gradients through time against central finite differences in double precision (the layer functions,
// static mode and dynamic mode; 1 and 2 layers, one and two directions, with and without initial states, batch first
// or not; the LSTM's parameter gradients both from its one stacked product and from separate products, as policies
// without the 2-D kernels form them), parameter gradients added to the buffer's values, parameter names and layout,
// adaptors, dropout, static and dynamic mode giving identical losses, and the same bits whether the batch is split
// over threads and W_hh packed once or not.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

template <class T = double>
std::vector<T> random_values(index_t n, random_generator& rng, T scale = T(1)) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = rng.uniform<T>(-scale, scale);
  return v;
}

double max_relative_error(double numeric, double analytic) {
  return std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric));
}

// policy::cpu without the 2-D kernels that assemble the LSTM's stacked gradient operand: the LSTM backward then forms
// its parameter gradients by separate products and column sums, as on the CUDA policies (and for the GRU).
struct cpu_separate_products : policy::cpu {
  static void accumulate_rows() = delete;
};

// The loss sum(output * r_out) + sum(h_n * r_h) + sum(c_n * r_c) through rnn_forward; its gradient through
// rnn_backward; every input, state and parameter checked by central differences.
template <class Cell, class P = policy::cpu>
void check_layer_gradients(const rnn_dims& d, index_t seq, index_t batch, bool with_state) {
  const std::string policy_name = P::name;
  CAPTURE(Cell::name);
  CAPTURE(policy_name);
  CAPTURE(d.num_layers);
  CAPTURE(d.bidirectional);
  CAPTURE(d.batch_first);
  CAPTURE(with_state);
  random_generator rng(7 + static_cast<std::uint64_t>(d.num_layers * 4 + d.bidirectional * 2 + with_state));
  const rnn_plan<Cell> plan(d, seq, batch);
  const index_t out_n = seq * batch * d.output_size(), state_n = d.num_layers * d.directions() * batch * d.hidden_size;
  auto params = random_values(rnn_param_count<Cell>(d), rng, 0.6);
  auto x = random_values(seq * batch * d.input_size, rng);
  auto h0 = random_values(state_n, rng), c0 = random_values(state_n, rng);
  auto r_out = random_values(out_n, rng), r_h = random_values(state_n, rng), r_c = random_values(state_n, rng);
  std::vector<double> saved(static_cast<std::size_t>(plan.saved_size)), temp(static_cast<std::size_t>(plan.temp_size));
  std::vector<double> out(static_cast<std::size_t>(out_n)), hn(static_cast<std::size_t>(state_n)),
      cn(static_cast<std::size_t>(state_n));
  const double* h0p = with_state ? h0.data() : nullptr;
  const double* c0p = with_state && Cell::has_cell_state ? c0.data() : nullptr;
  auto loss = [&] {
    rnn_forward<Cell, P>(d, seq, batch, params.data(), x.data(), h0p, c0p, out.data(), hn.data(),
                         Cell::has_cell_state ? cn.data() : nullptr, saved.data(), temp.data(), true, nullptr);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * r_out[i];
    for (std::size_t i = 0; i < hn.size(); ++i) l += hn[i] * r_h[i] + (Cell::has_cell_state ? cn[i] * r_c[i] : 0.0);
    return l;
  };
  loss();
  std::vector<double> dparams(params.size(), 0.0), dx(x.size()), dh0(h0.size()), dc0(c0.size());
  rnn_backward<Cell, P>(d, seq, batch, params.data(), x.data(), h0p, c0p, r_out.data(), r_h.data(),
                        Cell::has_cell_state ? r_c.data() : nullptr, dx.data(), with_state ? dh0.data() : nullptr,
                        with_state && Cell::has_cell_state ? dc0.data() : nullptr, dparams.data(), saved.data(),
                        temp.data(), true);
  auto check = [&](std::vector<double>& values, const std::vector<double>& analytic, const char* what) {
    CAPTURE(what);
    double worst = 0;
    const double h = 1e-6;
    for (std::size_t i = 0; i < values.size(); ++i) {
      double keep = values[i];
      values[i] = keep + h;
      double up = loss();
      values[i] = keep - h;
      double down = loss();
      values[i] = keep;
      worst = std::max(worst, max_relative_error((up - down) / (2 * h), analytic[i]));
    }
    CHECK(worst < 1e-7);
  };
  check(params, dparams, "parameters");
  check(x, dx, "input");
  if (with_state) {
    check(h0, dh0, "h0");
    if (Cell::has_cell_state) check(c0, dc0, "c0");
  }
}

template <class Net>
Tensor<double> random_input(index_t batch, std::uint64_t seed) {
  random_generator rng(seed);
  Tensor<double> x(Net::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<double>();
  return x;
}

// As in test_static_gradients.cpp: every parameter of a static model against central differences of its loss.
template <class Net, class Loss, class Target>
void check_static_gradients(Net& net, const Tensor<double>& x, const Tensor<Target>& target, const Loss& loss) {
  net.forward_backward(x, target, loss);
  std::vector<double> analytic(net.gradient_values().begin(), net.gradient_values().end());
  auto params = net.parameter_values();
  const double h = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    double saved = params[i];
    params[i] = saved + h;
    double up = net.loss_value(x, target, loss);
    params[i] = saved - h;
    double down = net.loss_value(x, target, loss);
    params[i] = saved;
    worst = std::max(worst, max_relative_error((up - down) / (2 * h), analytic[i]));
  }
  CHECK(worst < 1e-7);
}

}  // namespace

TEST_CASE("LSTM and GRU layer functions: gradients through time match finite differences") {
  for (index_t layers : {1, 2})
    for (bool bidirectional : {false, true})
      for (bool batch_first : {false, true})
        for (bool with_state : {false, true}) {
          rnn_dims d{3, 4, layers, true, bidirectional, batch_first, 0.0f};
          check_layer_gradients<lstm_cell>(d, 4, 2, with_state);
          check_layer_gradients<lstm_cell, cpu_separate_products>(d, 4, 2, with_state);
          check_layer_gradients<gru_cell>(d, 4, 2, with_state);
        }
  // Without biases, and a one-step sequence.
  check_layer_gradients<lstm_cell>(rnn_dims{2, 3, 2, false, true, false, 0.0f}, 1, 3, true);
  check_layer_gradients<lstm_cell, cpu_separate_products>(rnn_dims{2, 3, 2, false, true, false, 0.0f}, 1, 3, true);
  check_layer_gradients<gru_cell>(rnn_dims{2, 3, 2, false, true, true, 0.0f}, 1, 3, true);
}

TEST_CASE("the LSTM's parameter gradients are added to what the gradient buffer holds") {
  // rnn_backward adds (dynamic mode accumulates .grad over backward passes): from a buffer holding v, the stacked
  // product's gradient g must come out as exactly v + g, for every parameter, in both directions and both layers.
  const rnn_dims d{.input_size = 5, .hidden_size = 6, .num_layers = 2, .bidirectional = true};
  const index_t seq = 3, batch = 4;
  const rnn_plan<lstm_cell> plan(d, seq, batch);
  random_generator rng(11);
  auto params = random_values(rnn_param_count<lstm_cell>(d), rng, 0.5f);
  auto x = random_values(seq * batch * d.input_size, rng, 1.0f);
  auto dout = random_values(seq * batch * d.output_size(), rng, 1.0f);
  auto held = random_values(rnn_param_count<lstm_cell>(d), rng, 1.0f);
  std::vector<float> saved(static_cast<std::size_t>(plan.saved_size)), temp(static_cast<std::size_t>(plan.temp_size));
  const float* no_input = nullptr;
  float* no_output = nullptr;
  auto gradients = [&](std::vector<float> dparams) {
    rnn_forward<lstm_cell, policy::cpu>(d, seq, batch, params.data(), x.data(), no_input, no_input, no_output,
                                        no_output, no_output, saved.data(), temp.data(), true, nullptr);
    rnn_backward<lstm_cell, policy::cpu>(d, seq, batch, params.data(), x.data(), no_input, no_input, dout.data(),
                                         no_input, no_input, no_output, no_output, no_output, dparams.data(),
                                         saved.data(), temp.data(), true);
    return dparams;
  };
  const auto fresh = gradients(std::vector<float>(held.size(), 0.0f));
  const auto added = gradients(held);
  int mismatches = 0;
  for (std::size_t i = 0; i < held.size(); ++i) mismatches += added[i] != held[i] + fresh[i];
  CHECK(mismatches == 0);
}

TEST_CASE("static LSTM and GRU: gradients of every output adaptor match finite differences") {
  Tensor<double> target(shape{3, 2}, {0.5, -0.25, 1, 0, -1, 0.75});
  SUBCASE("LSTM, 2 layers, bidirectional, final state") {
    using Net = Sequential<policy::cpu, InputOf<double, 5, 3>, FinalState<LSTM<4, 2, true>>, Dense<2>>;
    Net net(3, 1);
    check_static_gradients(net, random_input<Net>(3, 2), target, loss::mse{});
  }
  SUBCASE("LSTM, 1 layer, last step") {
    using Net = Sequential<policy::cpu, InputOf<double, 5, 3>, LastStep<LSTM<4>>, Dense<2>>;
    Net net(3, 2);
    check_static_gradients(net, random_input<Net>(3, 3), target, loss::mse{});
  }
  SUBCASE("LSTM, 1 layer bidirectional, all steps, then a GRU") {
    using Net = Sequential<policy::cpu, InputOf<double, 5, 3>, LSTM<3, 1, true>, FinalState<GRU<4>>, Dense<2>>;
    Net net(3, 3);
    check_static_gradients(net, random_input<Net>(3, 4), target, loss::mse{});
  }
  SUBCASE("GRU, 2 layers, bidirectional, last step; and flattened all steps") {
    using Net = Sequential<policy::cpu, InputOf<double, 4, 3>, LastStep<GRU<3, 2, true>>, Dense<2>>;
    Net net(3, 4);
    check_static_gradients(net, random_input<Net>(3, 5), target, loss::mse{});
    using Net2 = Sequential<policy::cpu, InputOf<double, 4, 3>, GRU<3, 2>, Flatten, Dense<2>>;
    Net2 net2(3, 5);
    check_static_gradients(net2, random_input<Net2>(3, 6), target, loss::mse{});
  }
}

namespace {

// Dynamic mode in double: loss = sum(output * r1) + sum(h_n * r2) [+ sum(c_n * r3)], gradients of every parameter,
// the input and the initial states against central differences.
template <bool IsLSTM>
void check_dynamic_gradients(nn::rnn_options options, bool with_state) {
  using V = nn::basic_variable<double>;
  CAPTURE(IsLSTM);
  CAPTURE(options.num_layers);
  CAPTURE(options.bidirectional);
  CAPTURE(options.batch_first);
  CAPTURE(with_state);
  using Module = std::conditional_t<IsLSTM, nn::basic_lstm<double>, nn::basic_gru<double>>;
  manual_seed(3);
  Module rnn(3, 4, options);
  const index_t seq = 4, batch = 2, L = options.num_layers * (options.bidirectional ? 2 : 1);
  random_generator rng(11);
  auto tensor = [&](shape s) {
    Tensor<double> t(s);
    for (auto& v : t.span()) v = rng.uniform<double>(-1, 1);
    return t;
  };
  V x(tensor(options.batch_first ? shape{batch, seq, 3} : shape{seq, batch, 3}), true);
  V h0(tensor(shape{L, batch, 4}), true), c0(tensor(shape{L, batch, 4}), true);
  index_t W = 4 * (options.bidirectional ? 2 : 1);
  V r1(tensor(options.batch_first ? shape{batch, seq, W} : shape{seq, batch, W}));
  V r2(tensor(shape{L, batch, 4})), r3(tensor(shape{L, batch, 4}));
  auto loss = [&] {
    if constexpr (IsLSTM) {
      auto [out, state] = with_state ? rnn(x, {h0, c0}) : rnn(x);
      auto [hn, cn] = state;
      return nn::add(nn::add(nn::sum(nn::mul(out, r1)), nn::sum(nn::mul(hn, r2))), nn::sum(nn::mul(cn, r3)));
    } else {
      auto [out, hn] = with_state ? rnn(x, h0) : rnn(x);
      return nn::add(nn::sum(nn::mul(out, r1)), nn::sum(nn::mul(hn, r2)));
    }
  };
  rnn.zero_grad();
  auto l = loss();
  l.backward();
  auto check = [&](const V& v, const std::string& what) {
    CAPTURE(what);
    std::vector<double> analytic(v.grad().data(), v.grad().data() + v.numel());
    double worst = 0;
    const double h = 1e-6;
    nn::no_grad guard;
    for (index_t i = 0; i < v.numel(); ++i) {
      double keep = v.data()[i];
      v.data()[i] = keep + h;
      double up = loss().item();
      v.data()[i] = keep - h;
      double down = loss().item();
      v.data()[i] = keep;
      worst = std::max(worst, max_relative_error((up - down) / (2 * h), analytic[static_cast<std::size_t>(i)]));
    }
    CHECK(worst < 1e-7);
  };
  for (auto& [name, p] : rnn.named_parameters()) check(p, name);
  check(x, "input");
  if (with_state) {
    check(h0, "h0");
    if (IsLSTM) check(c0, "c0");
  }
}

}  // namespace

TEST_CASE("nn::LSTM and nn::GRU: gradients through time match finite differences") {
  for (index_t layers : {1, 2})
    for (bool bidirectional : {false, true})
      for (bool with_state : {false, true}) {
        nn::rnn_options o{.num_layers = layers, .batch_first = layers == 2, .bidirectional = bidirectional};
        check_dynamic_gradients<true>(o, with_state);
        check_dynamic_gradients<false>(o, with_state);
      }
}

TEST_CASE("parameter names, shapes and order follow PyTorch in both modes") {
  manual_seed(1);
  nn::LSTM lstm(10, 20, {.num_layers = 2, .bidirectional = true});
  auto named = lstm.named_parameters();
  REQUIRE(named.size() == 16);
  CHECK(named[0].first == "weight_ih_l0");
  CHECK(named[0].second.shape() == shape{80, 10});
  CHECK(named[1].first == "weight_hh_l0");
  CHECK(named[1].second.shape() == shape{80, 20});
  CHECK(named[2].first == "bias_ih_l0");
  CHECK(named[3].first == "bias_hh_l0");
  CHECK(named[4].first == "weight_ih_l0_reverse");
  CHECK(named[8].first == "weight_ih_l1");
  CHECK(named[8].second.shape() == shape{80, 40});
  CHECK(named[15].first == "bias_hh_l1_reverse");
  nn::GRU gru(10, 20, {.bias = false});
  CHECK(gru.named_parameters().size() == 2);
  CHECK(gru.named_parameters()[0].second.shape() == shape{60, 10});

  using Net = Sequential<policy::cpu, Input<7, 10>, FinalState<LSTM<20, 2, true>>, Dense<3>>;
  auto infos = Net::named_parameter_infos();
  REQUIRE(infos.size() == 18);
  for (std::size_t i = 0; i < 16; ++i) {
    std::string expected = "0.";
    expected += named[i].first;
    CHECK(infos[i].name == expected);
    CHECK(infos[i].shape == named[i].second.shape());
  }
  CHECK(infos[16].name == "1.weight");
  // All weights and biases in U(-1/sqrt(H), 1/sqrt(H)).
  double bound = 1.0 / std::sqrt(20.0);
  for (auto& [name, p] : named)
    for (index_t i = 0; i < p.numel(); ++i) CHECK(std::abs(p.data()[i]) <= bound);
}

TEST_CASE("shapes of results, adaptors, and errors") {
  manual_seed(2);
  nn::LSTM lstm(5, 6, {.num_layers = 2, .batch_first = true, .bidirectional = true});
  nn::Variable x(shape{3, 7, 5});
  auto [out, state] = lstm(x);
  auto [hn, cn] = state;
  CHECK(out.shape() == shape{3, 7, 12});
  CHECK(hn.shape() == shape{4, 3, 6});
  CHECK(cn.shape() == shape{4, 3, 6});
  // FinalState is [forward h_n at t = T-1, reverse h_n at t = 0] of the last layer.
  auto final_state = nn::FinalState(lstm).forward(x);
  CHECK(final_state.shape() == shape{3, 12});
  for (index_t b = 0; b < 3; ++b)
    for (index_t j = 0; j < 6; ++j) {
      CHECK(final_state.data()[b * 12 + j] == out.data()[(b * 7 + 6) * 12 + j]);
      CHECK(final_state.data()[b * 12 + 6 + j] == out.data()[(b * 7 + 0) * 12 + 6 + j]);
      CHECK(final_state.data()[b * 12 + 6 + j] == hn.data()[(3 * 3 + b) * 6 + j]);
    }
  auto last = nn::LastStep(lstm).forward(x);
  CHECK(last.shape() == shape{3, 12});
  for (index_t b = 0; b < 3; ++b)
    for (index_t j = 0; j < 12; ++j) CHECK(last.data()[b * 12 + j] == out.data()[(b * 7 + 6) * 12 + j]);
  auto model = nn::Sequential(nn::FinalState(nn::GRU(5, 4)), nn::Linear(4, 2));
  CHECK(model(nn::Variable(shape{2, 7, 5})).shape() == shape{7, 2});  // not batch first: batch is dim 1
  auto names = model.named_parameters();
  CHECK(names[0].first == "0.weight_ih_l0");
  CHECK_THROWS_WITH_AS(lstm(nn::Variable(shape{3, 7, 4})), doctest::Contains("(batch, seq, 5)"), kiln::error);
  CHECK_THROWS_AS(lstm(x, {nn::Variable(shape{4, 3, 6}), nn::Variable(shape{2, 3, 6})}), kiln::error);
}

TEST_CASE("dropout between layers: only in training, reproducible, and differentiable") {
  manual_seed(4);
  nn::GRU gru(3, 5, {.num_layers = 3, .batch_first = true, .dropout = 0.5f});
  nn::Variable x(shape{2, 4, 3});
  random_generator rng(1);
  for (index_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.normal<float>();
  gru.eval();
  auto [a, ha] = gru(x);
  auto [b, hb] = gru(x);
  for (index_t i = 0; i < a.numel(); ++i) CHECK(a.data()[i] == b.data()[i]);
  gru.train();
  auto [c, hc] = gru(x);
  bool differs = false;
  for (index_t i = 0; i < a.numel(); ++i) differs = differs || a.data()[i] != c.data()[i];
  CHECK(differs);
  nn::sum(c).backward();
  CHECK(std::isfinite(gru.named_parameters()[0].second.grad().data()[0]));

  // Static mode trains with dropout too.
  using Net = Sequential<policy::cpu, Input<4, 3>, FinalState<LSTM<5, 2, false, rnn_options{.dropout = 0.3f}>>,
                         Dense<2>>;
  Net net(2, 1);
  Tensor<float> xs(shape{2, 4, 3}, 0.5f), ys(shape{2, 2}, 0.1f);
  optim::Adam opt({.lr = 1e-2});
  float first = net.train_step(xs, ys, loss::mse{}, opt);
  float later = first;
  for (int i = 0; i < 30; ++i) later = net.train_step(xs, ys, loss::mse{}, opt);
  CHECK(later < first);
}

TEST_CASE("static and dynamic mode give identical losses on a small sequence model, with and without clipping") {
  // With a Dropout between the recurrent layers and dropout between the GRU's stacked layers: each draws from a
  // generator of its own, the same in both modes. Clipping by the joint norm sums the same tensors in both modes.
  const std::uint64_t seed = 5;
  using Net = Sequential<policy::cpu, Input<6, 4>, LSTM<5, 1, true>, Dropout<0.25>,
                         FinalState<GRU<4, 2, true, rnn_options{.dropout = 0.4f}>>, Dense<3>>;
  for (const double clip : {0.0, 0.2}) {
    CAPTURE(clip);
    Net net(8, seed);
    manual_seed(seed);
    auto model = nn::Sequential(nn::AllSteps(nn::LSTM(4, 5, {.batch_first = true, .bidirectional = true})),
                                nn::Dropout(0.25f),
                                nn::FinalState(nn::GRU(10, 4, {.num_layers = 2, .batch_first = true, .dropout = 0.4f,
                                                                .bidirectional = true})),
                                nn::Linear(8, 3));
    REQUIRE(net.runtime_generators().size() == 2);
    REQUIRE(model.runtime_generators().size() == 2);
    auto sd = net.state_dict();
    auto dyn = model.state_dict();
    REQUIRE(sd.size() == dyn.size());
    for (std::size_t i = 0; i < sd.size(); ++i) {
      CHECK(sd[i].first == dyn[i].first);
      for (index_t k = 0; k < sd[i].second.numel(); ++k) REQUIRE(sd[i].second[k] == dyn[i].second[k]);
    }
    random_generator rng(6);
    Tensor<float> x(shape{8, 6, 4});
    for (auto& v : x.span()) v = rng.normal<float>();
    Tensor<std::int64_t> labels(shape{8});
    for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(3));
    optim::Adam static_opt({.lr = 1e-2, .clip = {.norm = clip}});
    optim::Adam dynamic_opt(model.parameters(), {.lr = 1e-2, .clip = {.norm = clip}});
    nn::Variable input(x);
    for (int step = 0; step < 12; ++step) {
      float a = net.train_step(x, labels, loss::cross_entropy{}, static_opt);
      dynamic_opt.zero_grad();
      auto l = nn::cross_entropy(model(input), labels);
      l.backward();
      dynamic_opt.step();
      CAPTURE(step);
      REQUIRE(a == l.item());
      if (clip > 0) {
        REQUIRE(static_opt.last_grad_norm() == dynamic_opt.last_grad_norm());
        if (step == 0) CHECK(static_opt.last_grad_norm() > clip);  // the clip engages
      }
    }
  }
}

namespace {

// policy::cpu without its two recurrent shortcuts: W_hh packed again by every step's GEMM, and the batch never split
// (the GEMMs split columns over the threads instead).
struct cpu_step_by_step : policy::cpu {
  template <class T>
  static const T* prepack_b(bool, index_t, index_t, const T*, index_t) {
    return nullptr;
  }
  template <class Body>
  static void for_batch_slices(index_t batch, index_t, Body&& body) {
    body(index_t{0}, batch);
  }
};

// Every result of rnn_forward and rnn_backward (outputs, final states, input, state and parameter gradients), in one
// vector, for float inputs with initial states.
template <class Cell, class Policy>
std::vector<float> run_layer(const rnn_dims& d, index_t seq, index_t batch) {
  random_generator rng(31);
  const rnn_plan<Cell> plan(d, seq, batch);
  const index_t out_n = seq * batch * d.output_size(), state_n = d.num_layers * d.directions() * batch * d.hidden_size;
  auto params = random_values(rnn_param_count<Cell>(d), rng, 0.3f),
       x = random_values(seq * batch * d.input_size, rng, 1.0f), h0 = random_values(state_n, rng, 1.0f),
       c0 = random_values(state_n, rng, 1.0f),
       dout = random_values(out_n, rng, 1.0f), dh_n = random_values(state_n, rng, 1.0f),
       dc_n = random_values(state_n, rng, 1.0f);
  std::vector<float> saved(static_cast<std::size_t>(plan.saved_size)), temp(static_cast<std::size_t>(plan.temp_size));
  std::vector<float> out(static_cast<std::size_t>(out_n)), hn(h0.size()), cn(h0.size()), dx(x.size()), dh0(h0.size()),
      dc0(h0.size()), dparams(params.size(), 0.0f);
  const float* c0p = Cell::has_cell_state ? c0.data() : nullptr;
  rnn_forward<Cell, Policy>(d, seq, batch, params.data(), x.data(), h0.data(), c0p, out.data(), hn.data(),
                            Cell::has_cell_state ? cn.data() : nullptr, saved.data(), temp.data(), false, nullptr);
  rnn_backward<Cell, Policy>(d, seq, batch, params.data(), x.data(), h0.data(), c0p, dout.data(), dh_n.data(),
                             Cell::has_cell_state ? dc_n.data() : nullptr, dx.data(), dh0.data(),
                             Cell::has_cell_state ? dc0.data() : nullptr, dparams.data(), saved.data(), temp.data(),
                             false);
  std::vector<float> all;
  for (const auto* v : {&out, &hn, &cn, &dx, &dh0, &dc0, &dparams}) all.insert(all.end(), v->begin(), v->end());
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("LSTM and GRU give the same bits with the batch split over threads and W_hh packed once") {
  // Hidden 96: 4 * 96 * 96 multiply-adds per row and step, enough for policy::cpu to give each of two threads a
  // slice of the 20 rows.
  const rnn_dims d{.input_size = 12, .hidden_size = 96, .num_layers = 2, .bidirectional = true};
  const int saved_threads = num_threads();
  set_num_threads(1);
  const auto lstm_one = run_layer<lstm_cell, policy::cpu>(d, 5, 20);
  const auto gru_one = run_layer<gru_cell, policy::cpu>(d, 5, 20);
  set_num_threads(2);
  CHECK(same_bits(lstm_one, run_layer<lstm_cell, policy::cpu>(d, 5, 20)));
  CHECK(same_bits(lstm_one, run_layer<lstm_cell, cpu_step_by_step>(d, 5, 20)));
  CHECK(same_bits(gru_one, run_layer<gru_cell, policy::cpu>(d, 5, 20)));
  CHECK(same_bits(gru_one, run_layer<gru_cell, cpu_step_by_step>(d, 5, 20)));
  set_num_threads(saved_threads);
}
