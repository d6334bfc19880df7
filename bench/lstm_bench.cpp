// LSTM forward + backward time per batch and per sequence, through the layer functions both modes call
// (rnn_forward / rnn_backward), static mode's layer, and dynamic mode's nn::LSTM; at PyTorch's sequential-MNIST shape
// by default (batch 64, seq 28, input 28, hidden 128), one direction and two. bench/lstm_bench_torch.py runs the same
// shapes in PyTorch and prints the same RESULT lines.
//
//   lstm_bench [--threads N] [--batch 64] [--seq 28] [--input 28] [--hidden 128] [--layers 1] [--iters 20]
#include <chrono>
#include <cstdio>
#include <vector>

#include "../examples/common.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {

template <class Body>
double time_ms(int iters, Body&& body) {
  body();  // warm-up
  body();
  auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) body();
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count() / iters;
}

void report(const char* impl, bool bidirectional, index_t batch, index_t seq, index_t input, index_t hidden,
            index_t layers, int threads, double fwd_ms, double fwdbwd_ms) {
  std::printf("RESULT bench=lstm impl=%s bidirectional=%d batch=%lld seq=%lld input=%lld hidden=%lld layers=%lld "
              "threads=%d fwd_ms=%.3f fwd_bwd_ms=%.3f us_per_seq=%.2f\n",
              impl, bidirectional ? 1 : 0, static_cast<long long>(batch), static_cast<long long>(seq),
              static_cast<long long>(input), static_cast<long long>(hidden), static_cast<long long>(layers), threads,
              fwd_ms, fwdbwd_ms, fwdbwd_ms * 1000.0 / double(batch));
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--batch", "--hidden", "--input", "--iters", "--layers", "--seq"});
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  index_t batch = flags.get_int("--batch", 64), seq = flags.get_int("--seq", 28), input = flags.get_int("--input", 28),
          hidden = flags.get_int("--hidden", 128), layers = flags.get_int("--layers", 1);
  int iters = static_cast<int>(flags.get_int("--iters", 20));
  set_num_threads(threads);
  using P = policy::cpu;
  for (bool bidirectional : {false, true}) {
    rnn_dims d{input, hidden, layers, true, bidirectional, true, 0.0f};
    rnn_plan<lstm_cell> plan(d, seq, batch);
    random_generator rng(1);
    std::vector<float> params(static_cast<std::size_t>(rnn_param_count<lstm_cell>(d))), grads(params.size());
    rnn_init<float>(params, hidden, rng);
    std::vector<float> x(static_cast<std::size_t>(batch * seq * input)), out(static_cast<std::size_t>(seq * batch * d.output_size()));
    for (auto& v : x) v = rng.normal<float>();
    std::vector<float> dout(out.size(), 0.01f), dx(x.size());
    std::vector<float> saved(static_cast<std::size_t>(plan.saved_size)), temp(static_cast<std::size_t>(plan.temp_size));
    auto forward = [&] {
      rnn_forward<lstm_cell, P>(d, seq, batch, params.data(), x.data(), static_cast<const float*>(nullptr),
                                static_cast<const float*>(nullptr), out.data(), static_cast<float*>(nullptr),
                                static_cast<float*>(nullptr), saved.data(), temp.data(), true, nullptr);
    };
    double fwd = time_ms(iters, forward);
    double both = time_ms(iters, [&] {
      forward();
      rnn_backward<lstm_cell, P>(d, seq, batch, params.data(), x.data(), static_cast<const float*>(nullptr),
                                 static_cast<const float*>(nullptr), dout.data(), static_cast<const float*>(nullptr),
                                 static_cast<const float*>(nullptr), dx.data(), static_cast<float*>(nullptr),
                                 static_cast<float*>(nullptr), grads.data(), saved.data(), temp.data(), true);
    });
    report("kiln_layer", bidirectional, batch, seq, input, hidden, layers, threads, fwd, both);

    // Dynamic mode: nn::LSTM with the tape, its output's gradient seeded through sum(output * dout).
    manual_seed(1);
    nn::LSTM lstm(input, hidden, {.num_layers = layers, .batch_first = true, .bidirectional = bidirectional});
    nn::Variable xv(Tensor<float>(shape{batch, seq, input}, std::span<const float>(x)), true);
    nn::Variable dv(Tensor<float>(shape{batch, seq, d.output_size()}, 0.01f));
    double dyn_fwd = time_ms(iters, [&] {
      nn::no_grad guard;
      auto r = lstm.forward(xv);
    });
    double dyn_both = time_ms(iters, [&] {
      lstm.zero_grad();
      nn::sum(nn::mul(lstm.forward(xv), dv)).backward();
    });
    report("kiln_dynamic", bidirectional, batch, seq, input, hidden, layers, threads, dyn_fwd, dyn_both);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "lstm_bench: %s\n", e.what());
  return 1;
}
