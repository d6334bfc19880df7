// cuDNN's RNN under policy::cudnn (kernels/cudnn/rnn.cuh) against kiln's own step loop under policy::cuda: the same
// rnn_forward / rnn_backward calls on the same device data, over stacks of LSTM and GRU layers, one or two layers,
// one or two directions, batch first or not, with and without biases, initial states and state gradients. Every
// result is compared: the output, h_n, c_n, dx, dh0, dc0, and the parameter gradients, which both ADD to what the
// buffer held. Also: cuDNN really ran (its call counts), parameters at an unaligned address (cuDNN reads a copy),
// stacks whose parameters cuDNN lays out in its own order (copied in and added back piece by piece), dropout between
// layers while training (kiln's steps run, the same bits as policy::cuda), and a backward without its forward (a
// kiln::error); and the 2-D copies the recurrent layers use on the GPU (copy_rows, fill_rows, accumulate_rows).
//
// Tolerances: cuDNN and kiln's kernels compute the same formulas in other summation orders (cuDNN's GEMMs and fused
// cell kernels), each result a short chain of float operations from the inputs: relative 1e-4 with absolute 1e-5
// for values near zero in float (about 100 ulps, far below any formula error, which is of order 1), 1e-10 / 1e-12 in
// double.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/kiln.hpp"
#include "kiln/policy_cuda.cuh"

using namespace kiln;
using namespace kiln::cuda_test;

namespace {

struct rnn_case {
  rnn_dims dims;
  index_t seq = 5, batch = 3;
  bool with_initial_state = true;  // h0 (and c0)
  bool with_state_gradient = true;  // dh_n (and dc_n)
  bool with_dx = true;
  std::string name() const {
    std::string s = "layers " + std::to_string(dims.num_layers) + (dims.bidirectional ? ", bidirectional" : "") +
                    (dims.batch_first ? ", batch first" : "") + (dims.bias ? "" : ", no bias") +
                    (with_initial_state ? ", h0" : "") + (with_state_gradient ? ", dh_n" : "") +
                    (with_dx ? ", dx" : "");
    return s;
  }
};

// What one policy's forward and backward give for a case.
template <class T>
struct rnn_results {
  std::vector<T> output, h_n, c_n, dx, dh0, dc0, dparams;
};

template <class T>
T tolerance_rel() {
  return sizeof(T) == 4 ? T(1e-4) : T(1e-10);
}
template <class T>
T tolerance_abs() {
  return sizeof(T) == 4 ? T(1e-5) : T(1e-12);
}

// Runs rnn_forward then rnn_backward under Policy on device copies of the host data. params_offset shifts the
// parameters (and their gradient) that many elements into their buffers.
template <class Cell, class Policy, class T>
rnn_results<T> run_case(const rnn_case& c, const std::vector<T>& params, const std::vector<T>& x,
                        const std::vector<T>& h0, const std::vector<T>& c0, const std::vector<T>& dout,
                        const std::vector<T>& dh_n, const std::vector<T>& dc_n, const std::vector<T>& dparams_start,
                        index_t params_offset = 0, bool training = true) {
  const rnn_dims& d = c.dims;
  const rnn_plan<Cell> plan(d, c.seq, c.batch);
  const index_t states = d.num_layers * d.directions() * c.batch * d.hidden_size;
  auto padded = [&](const std::vector<T>& values) {  // params_offset zeros first
    std::vector<T> out(static_cast<std::size_t>(params_offset), T(0));
    out.insert(out.end(), values.begin(), values.end());
    return out;
  };
  auto g_params = to_device(padded(params));
  auto g_dparams = to_device(padded(dparams_start));
  auto g_x = to_device(x), g_h0 = to_device(h0), g_c0 = to_device(c0), g_dout = to_device(dout),
       g_dh_n = to_device(dh_n), g_dc_n = to_device(dc_n);
  kiln::cuda::device_buffer<T> saved(plan.saved_size), temp(plan.temp_size);
  kiln::cuda::device_buffer<T> output(c.seq * c.batch * d.output_size()), h_n(states), c_n(states),
      dx(c.seq * c.batch * d.input_size), dh0(states), dc0(states);
  random_generator rng(5, 1);
  const T* h0p = c.with_initial_state ? g_h0.data() : nullptr;
  const T* c0p = c.with_initial_state && Cell::has_cell_state ? g_c0.data() : nullptr;
  rnn_forward<Cell, Policy>(d, c.seq, c.batch, g_params.data() + params_offset, g_x.data(), h0p, c0p, output.data(),
                            h_n.data(), Cell::has_cell_state ? c_n.data() : nullptr, saved.data(), temp.data(),
                            training, &rng);
  rnn_backward<Cell, Policy>(d, c.seq, c.batch, g_params.data() + params_offset, g_x.data(), h0p, c0p,
                             g_dout.data(), c.with_state_gradient ? g_dh_n.data() : nullptr,
                             c.with_state_gradient && Cell::has_cell_state ? g_dc_n.data() : nullptr,
                             c.with_dx ? dx.data() : nullptr, dh0.data(),
                             Cell::has_cell_state ? dc0.data() : nullptr, g_dparams.data() + params_offset,
                             saved.data(), temp.data(), training);
  rnn_results<T> r;
  r.output = to_host(output);
  r.h_n = to_host(h_n);
  if (Cell::has_cell_state) {
    r.c_n = to_host(c_n);
    r.dc0 = to_host(dc0);
  }
  if (c.with_dx) r.dx = to_host(dx);
  r.dh0 = to_host(dh0);
  const auto all_dparams = to_host(g_dparams);
  r.dparams.assign(all_dparams.begin() + params_offset, all_dparams.end());
  return r;
}

template <class T>
void check_results(const rnn_results<T>& got, const rnn_results<T>& expected, const std::string& what, bool exact) {
  auto compare = [&](const std::vector<T>& g, const std::vector<T>& e, const char* name) {
    if (exact) check_identical(g, e, what + ": " + name);
    else check_close(g, e, tolerance_rel<T>(), tolerance_abs<T>(), what + ": " + name);
  };
  compare(got.output, expected.output, "output");
  compare(got.h_n, expected.h_n, "h_n");
  compare(got.c_n, expected.c_n, "c_n");
  compare(got.dx, expected.dx, "dx");
  compare(got.dh0, expected.dh0, "dh0");
  compare(got.dc0, expected.dc0, "dc0");
  compare(got.dparams, expected.dparams, "parameter gradients (added to the buffer's values)");
}

// Random data for a case, cuDNN's results against kiln's steps; checks that cuDNN ran (or did not, with dropout).
template <class Cell, class T>
void check_case(const rnn_case& c, std::uint64_t seed) {
  const rnn_dims& d = c.dims;
  const std::string label = std::string(Cell::name) + " (" + c.name() + ")";
  CAPTURE(label);
  const index_t states = d.num_layers * d.directions() * c.batch * d.hidden_size;
  const auto params = random_values<T>(rnn_param_count<Cell>(d), seed, T(-0.5), T(0.5));
  const auto x = random_values<T>(c.seq * c.batch * d.input_size, seed + 1);
  const auto h0 = random_values<T>(states, seed + 2), c0 = random_values<T>(states, seed + 3);
  const auto dout = random_values<T>(c.seq * c.batch * d.output_size(), seed + 4);
  const auto dh_n = random_values<T>(states, seed + 5), dc_n = random_values<T>(states, seed + 6);
  const auto dparams_start = random_values<T>(rnn_param_count<Cell>(d), seed + 7);

  const auto before = policy::cudnn::rnn_sequence_calls();
  const auto steps = run_case<Cell, policy::cuda>(c, params, x, h0, c0, dout, dh_n, dc_n, dparams_start);
  const auto whole = run_case<Cell, policy::cudnn>(c, params, x, h0, c0, dout, dh_n, dc_n, dparams_start);
  const auto after = policy::cudnn::rnn_sequence_calls();
  const bool draws_dropout = d.has_dropout(0);
  // Dropout while training: kiln's steps run under both policies, so the results are the same bits.
  CHECK_MESSAGE(after.forward - before.forward == (draws_dropout ? 0u : 1u), (label + ": cuDNN forward calls"));
  CHECK_MESSAGE(after.backward - before.backward == (draws_dropout ? 0u : 1u), (label + ": cuDNN backward calls"));
  check_results(whole, steps, label + ", cuDNN vs kiln's steps", draws_dropout);

  if (!draws_dropout) {
    // Parameters one element past an aligned address: cuDNN reads an aligned copy and adds its gradient back, so
    // the results are those of the aligned run.
    const auto shifted =
        run_case<Cell, policy::cudnn>(c, params, x, h0, c0, dout, dh_n, dc_n, dparams_start, /*params_offset=*/1);
    check_results(shifted, whole, label + ", unaligned parameters vs aligned", false);
    CHECK(policy::cudnn::rnn_sequence_calls().forward - after.forward == 1u);
  }
}

template <class Cell, class T>
void check_cell() {
  // rnn_dims: input, hidden, layers, bias, bidirectional, batch_first, dropout
  const std::vector<rnn_case> cases = {
      {rnn_dims{4, 6, 1, true, false, false, 0.0f}},
      {rnn_dims{4, 6, 1, true, false, true, 0.0f}, 7, 2, false, false, true},
      {rnn_dims{4, 6, 1, false, true, false, 0.0f}, 5, 3, true, true, false},
      {rnn_dims{3, 5, 2, true, false, true, 0.0f}, 4, 4, true, false, true},
      {rnn_dims{3, 5, 2, true, true, true, 0.0f}, 6, 3, true, true, true},
      {rnn_dims{5, 4, 3, true, true, false, 0.0f}, 3, 5, false, true, false},
      {rnn_dims{3, 5, 2, true, true, true, 0.3f}, 4, 3, true, true, true},  // dropout between layers: kiln's steps
      // the sequential-MNIST shape, with fewer units and samples
      {rnn_dims{28, 32, 1, true, false, true, 0.0f}, 28, 16, false, false, false},
  };
  std::uint64_t seed = 100;
  for (const auto& c : cases) check_case<Cell, T>(c, seed += 10);
}

}  // namespace

TEST_CASE_TEMPLATE("cuDNN's LSTM gives kiln's results", T, float, double) { check_cell<lstm_cell, T>(); }

TEST_CASE_TEMPLATE("cuDNN's GRU gives kiln's results", T, float, double) { check_cell<gru_cell, T>(); }

TEST_CASE("an LSTM in evaluation with dropout between layers runs on cuDNN (no masks are drawn)") {
  rnn_case c{rnn_dims{3, 5, 2, true, false, false, 0.5f}};
  const index_t states = 2 * c.batch * 5;
  const auto params = random_values<float>(rnn_param_count<lstm_cell>(c.dims), 3, -0.5f, 0.5f);
  const auto x = random_values<float>(c.seq * c.batch * 3, 4), h0 = random_values<float>(states, 5),
             c0 = random_values<float>(states, 6), dout = random_values<float>(c.seq * c.batch * 5, 7),
             dh_n = random_values<float>(states, 8), dc_n = random_values<float>(states, 9),
             dparams = random_values<float>(rnn_param_count<lstm_cell>(c.dims), 10);
  const auto before = policy::cudnn::rnn_sequence_calls();
  const auto steps = run_case<lstm_cell, policy::cuda>(c, params, x, h0, c0, dout, dh_n, dc_n, dparams, 0, false);
  const auto whole = run_case<lstm_cell, policy::cudnn>(c, params, x, h0, c0, dout, dh_n, dc_n, dparams, 0, false);
  CHECK(policy::cudnn::rnn_sequence_calls().forward - before.forward == 1u);
  check_results(whole, steps, "LSTM in evaluation, cuDNN vs kiln's steps", false);
}

// A one-layer, one-direction LSTM with bias over `seq` steps of `batch` samples, as cuDNN's kernels are handed it.
static kernels::rnn_sequence one_layer_lstm(index_t input_size, index_t hidden_size, index_t seq, index_t batch) {
  kernels::rnn_sequence s;
  s.kind = kernels::rnn_sequence::cell::lstm;
  s.input_size = input_size;
  s.hidden_size = hidden_size;
  s.seq = seq;
  s.batch = batch;
  return s;
}

TEST_CASE("where cuDNN keeps a stack's parameters") {
  // Reported, not asserted beyond usability: the layout is cuDNN's to choose (and may depend on the weight space's
  // address), and both ways of handing it the parameters, in place or copied piece by piece, are covered above.
  auto report = [](kernels::rnn_sequence s, const std::string& what) {
    const std::size_t bytes = policy::cudnn::rnn_sequence_weight_bytes<float>(s);
    REQUIRE_MESSAGE(bytes > 0, what);
    kiln::cuda::device_buffer<unsigned char> space(static_cast<index_t>(bytes) + 8192);
    std::ostringstream counts;
    for (index_t offset : {0, 256, 512, 1024, 2048, 4096}) {
      const index_t pieces = policy::cudnn::rnn_sequence_weight_pieces<float>(s, space.data() + offset);
      CHECK_MESSAGE(pieces >= 1, what);
      counts << ' ' << pieces;
    }
    MESSAGE(what << ": " << s.parameter_count() * 4 << " bytes of parameters, a weight space of " << bytes
                 << " bytes; contiguous pieces at offsets 0, 256, 512, 1024, 2048, 4096 from a fresh allocation:"
                 << counts.str());
  };
  kernels::rnn_sequence s = one_layer_lstm(4, 6, 5, 3);
  report(s, "LSTM(4, 6)");
  s.input_size = 28;
  s.hidden_size = 128;
  s.seq = 28;
  s.batch = 64;
  report(s, "LSTM(28, 128)");
  s.kind = kernels::rnn_sequence::cell::gru;
  report(s, "GRU(28, 128)");
  s.kind = kernels::rnn_sequence::cell::lstm;
  s.num_layers = 2;
  s.bidirectional = true;
  report(s, "LSTM(28, 128, layers 2, bidirectional)");
}

// dynamic mode's retain_graph: a backward from a copy of the saved values (rnn_copy_saved), then another from the
// original, both as one backward after the forward.
template <class Policy>
std::vector<std::vector<float>> two_backwards(const rnn_dims& d, index_t seq, index_t batch) {
  const rnn_plan<lstm_cell> plan(d, seq, batch);
  const index_t states = d.num_layers * d.directions() * batch * d.hidden_size, count = rnn_param_count<lstm_cell>(d);
  const auto params = to_device(random_values<float>(count, 1, -0.5f, 0.5f));
  const auto x = to_device(random_values<float>(seq * batch * d.input_size, 2));
  const auto dout = to_device(random_values<float>(seq * batch * d.output_size(), 3));
  const auto dh_n = to_device(random_values<float>(states, 4));
  kiln::cuda::device_buffer<float> saved(plan.saved_size), kept(plan.saved_size), temp(plan.temp_size),
      output(seq * batch * d.output_size()), dx(seq * batch * d.input_size), dparams(count);
  const float* none = nullptr;
  float* no_result = nullptr;
  rnn_forward<lstm_cell, Policy>(d, seq, batch, params.data(), x.data(), none, none, output.data(), no_result,
                                 no_result, saved.data(), temp.data(), true, nullptr);
  std::vector<std::vector<float>> results;
  for (float* from : {kept.data(), saved.data()}) {
    if (from == kept.data()) rnn_copy_saved<lstm_cell, Policy>(plan, static_cast<const float*>(saved.data()), from);
    Policy::fill(dparams.data(), 0.0f, count);
    rnn_backward<lstm_cell, Policy>(d, seq, batch, params.data(), x.data(), none, none, dout.data(), dh_n.data(), none,
                                    dx.data(), no_result, no_result, dparams.data(), from, temp.data(), true);
    results.push_back(to_host(dx));
    results.push_back(to_host(dparams));
  }
  return results;
}

TEST_CASE("two backwards from one forward (retain_graph): each from its own copy of what the forward saved") {
  const rnn_dims d{3, 5, 2, true, true, false, 0.0f};
  const auto steps = two_backwards<policy::cuda>(d, 4, 3);
  const auto whole = two_backwards<policy::cudnn>(d, 4, 3);
  const char* names[] = {"dx, first backward", "parameter gradients, first backward", "dx, second backward",
                         "parameter gradients, second backward"};
  for (std::size_t i = 0; i < 4; ++i) {
    check_close(whole[i], steps[i], 1e-4, 1e-5, std::string("cuDNN vs kiln's steps: ") + names[i]);
    check_close(whole[i], whole[i % 2], 1e-6, 1e-7, std::string("cuDNN, second backward vs first: ") + names[i]);
  }
}

TEST_CASE("copy_rows, fill_rows and accumulate_rows on the GPU change a strided block as the CPU's do") {
  // Rows of 5 inside rows of 11 and 13, and 300 columns (more than one block of threads) inside 301.
  for (const index_t cols : {index_t(5), index_t(300)}) {
    const index_t ld_x = cols == 5 ? 11 : 301, ld_y = cols == 5 ? 13 : 302, rows = 7;
    const auto x = random_values<float>(rows * ld_x, 23), y = random_values<float>(rows * ld_y, 24);
    auto gx = to_device(x);
    std::vector<float> cpu = y;
    auto gy = to_device(y);
    policy::cpu::copy_rows(rows, cols, x.data() + 1, ld_x, cpu.data() + 1, ld_y);
    policy::cuda::copy_rows(rows, cols, gx.data() + 1, ld_x, gy.data() + 1, ld_y);
    check_identical(to_host(gy), cpu, "copy_rows, " + std::to_string(cols) + " columns");
    policy::cpu::accumulate_rows(rows, cols, x.data(), ld_x, cpu.data() + 1, ld_y);
    policy::cuda::accumulate_rows(rows, cols, gx.data(), ld_x, gy.data() + 1, ld_y);
    check_identical(to_host(gy), cpu, "accumulate_rows, " + std::to_string(cols) + " columns");
    policy::cpu::fill_rows(rows, cols, 0.5f, cpu.data(), ld_y);
    policy::cuda::fill_rows(rows, cols, 0.5f, gy.data(), ld_y);
    check_identical(to_host(gy), cpu, "fill_rows, " + std::to_string(cols) + " columns");
  }
}

TEST_CASE("cuDNN's RNN backward without its forward is a kiln::error") {
  const kernels::rnn_sequence s = one_layer_lstm(3, 4, 2, 2);
  kiln::cuda::device_buffer<float> params(s.parameter_count()), dparams(s.parameter_count()), x(2 * 2 * 3),
      y(2 * 2 * 4), dy(2 * 2 * 4), never_forwarded(1);
  const float* no_state = nullptr;
  float* no_result = nullptr;
  CHECK_THROWS_WITH_AS(policy::cudnn::rnn_sequence_backward(s, params.data(), x.data(), no_state, no_state, y.data(),
                                                           dy.data(), no_state, no_state, no_result, no_result,
                                                           no_result, dparams.data(), never_forwarded.data()),
                       doctest::Contains("run the layer's forward before its backward"), kiln::error);
}
