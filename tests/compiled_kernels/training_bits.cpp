// Trains small models of every kernel family for a few steps and prints each step's loss and a digest of the final
// parameters, as exact bits. Built twice: once header-only and once against kiln::kernels (KILN_COMPILED_KERNELS);
// check_same_bits.cmake runs both and requires the same output. On two threads where the machine has them, so the
// threaded GEMM routes run too.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

std::uint64_t digest(std::span<const float> values) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bits
  for (float v : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

template <class Net, class Optimizer>
void train_static(const char* name, index_t batch, Optimizer optimizer, int steps) {
  Net net(batch, 7);
  random_generator rng(11);
  Tensor<float> x(Net::input_shape::batch_shape(batch));
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels(shape{batch});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(Net::output_shape::size));
  std::printf("%s:", name);
  for (int step = 0; step < steps; ++step)
    std::printf(" %a", static_cast<double>(net.train_step(x, labels, loss::cross_entropy{}, optimizer)));
  std::printf(" | parameters %016llx\n", static_cast<unsigned long long>(digest(net.parameter_values())));
}

}  // namespace

int main() {
  set_num_threads(2);
  // Dense layers on the GEMM's blocked, narrow and direct routes, Adam and SGD with momentum.
  train_static<Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<96, ReLU>, Dense<32, Tanh>, Dense<10>>>(
      "mlp", 64, optim::Adam({.lr = 1e-3}), 4);
  train_static<Sequential<policy::cpu, Input<40>, Dense<300, GELU>, Dense<5>>>("wide", 200,
                                                                              optim::SGD({.lr = 0.05, .momentum = 0.9}), 4);
  // Convolution, batch normalisation, pooling and dropout.
  train_static<Sequential<policy::cpu, Input<3, 12, 12>, Conv2D<8, 3, conv_options{.padding = 1}>, BatchNorm2d<>, ReLU,
                          MaxPool2D<2>, Conv2D<8, 3>, ReLU, AvgPool2D<2>, Dropout<0.2>, Flatten, Dense<4>>>(
      "cnn", 16, optim::AdamW({.lr = 1e-3}), 3);
  // Recurrent cells and layer normalisation.
  train_static<Sequential<policy::cpu, Input<6, 5>, LSTM<12, 1, true>, LayerNorm<24>, LastStep<GRU<8>>, Dense<3>>>(
      "rnn", 8, optim::RMSprop({.lr = 1e-3}), 3);

  // Dynamic mode: the same kernels through the tape.
  manual_seed(3);
  auto model = nn::Sequential(nn::Linear(20, 64), nn::ReLU(), nn::Linear(64, 64), nn::Sigmoid(), nn::Linear(64, 4));
  optim::Adagrad optimizer(model.parameters(), {.lr = 0.01});
  random_generator rng(5);
  Tensor<float> x(shape{32, 20});
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels(shape{32});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(4));
  nn::Variable input(x);
  std::printf("dynamic:");
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    auto loss = nn::cross_entropy(model(input), labels);
    loss.backward();
    optimizer.step();
    std::printf(" %a", static_cast<double>(loss.item()));
  }
  std::printf("\n");
  return 0;
}
