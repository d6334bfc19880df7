// Batch normalisation versus layer normalisation on one task (MNIST, a small MLP, Adam 1e-3, batch 64):
//   Flatten - Dense 128 - BatchNorm1d - ReLU - Dense 10     and     Flatten - Dense 128 - LayerNorm - ReLU - Dense 10
// prints both test accuracies and where each model keeps its state: BatchNorm's running statistics are buffers
// (saved in state_dict, never trained), LayerNorm has parameters only, as in PyTorch.
//
//   norms [--mode static|dynamic] [--epochs 1] [--data DIR] [--threads N] [--seed 42]
#include <cstdio>
#include <string>

#include "cnn_common.hpp"

using namespace kiln;

using static_bn = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128>, BatchNorm1d<>, ReLU, Dense<10>>;
using static_ln = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128>, LayerNorm<128>, ReLU, Dense<10>>;

nn::Sequential dynamic_bn(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::BatchNorm1d(128), nn::ReLU(), nn::Linear(128, 10));
}
nn::Sequential dynamic_ln(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Flatten(), nn::Linear(784, 128), nn::LayerNorm(128), nn::ReLU(), nn::Linear(128, 10));
}

namespace {

// The model's state by kind: trainable parameters, then buffers, with PyTorch's names and shapes.
template <class Net>
void print_static_state(const char* title) {
  std::printf("%s (static): parameters:", title);
  for (auto& p : Net::named_parameter_infos()) std::printf(" %s%s", p.name.c_str(), p.shape.str().c_str());
  std::printf("\n%s (static): buffers:   ", title);
  auto buffers = Net::named_buffer_infos();
  if (buffers.empty()) std::printf(" (none)");
  for (auto& b : buffers) std::printf(" %s%s", b.name.c_str(), b.shape.str().c_str());
  std::printf("\n");
}
void print_dynamic_state(const char* title, nn::Sequential& model) {
  std::printf("%s (dynamic): parameters:", title);
  for (auto& [name, v] : model.named_parameters()) std::printf(" %s%s", name.c_str(), v.shape().str().c_str());
  std::printf("\n%s (dynamic): buffers:   ", title);
  auto buffers = model.named_buffers();
  if (buffers.empty()) std::printf(" (none)");
  for (auto& [name, v] : buffers) std::printf(" %s%s", name.c_str(), v.shape().str().c_str());
  std::printf("\n%s (dynamic): state_dict:", title);
  for (auto& [name, t] : model.state_dict()) std::printf(" %s", name.c_str());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--seed"});
  std::string mode = flags.get("--mode", "static");
  int epochs = static_cast<int>(flags.get_int("--epochs", 1));
  int threads = static_cast<int>(flags.get_int("--threads", 1));
  auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("norms: expected --mode static|dynamic, found ", mode);
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  examples::cnn_outcome bn, ln;
  if (mode == "static") {
    static_bn bn_net(64, seed);
    static_ln ln_net(64, seed);
    bn = examples::fit_cnn(bn_net, mnist, epochs, seed);
    ln = examples::fit_cnn(ln_net, mnist, epochs, seed);
    // Running statistics after training: the first channels' mean and variance.
    auto state = bn_net.state_dict();
    for (auto& [name, t] : state)
      if (name == "2.running_mean" || name == "2.running_var")
        std::printf("%s[0:3] after training: %.4f %.4f %.4f\n", name.c_str(), t[0], t[1], t[2]);
  } else {
    auto bn_model = dynamic_bn(seed);
    auto ln_model = dynamic_ln(seed);
    bn = examples::fit_cnn(bn_model, mnist, epochs, seed);
    ln = examples::fit_cnn(ln_model, mnist, epochs, seed);
  }
  print_static_state<static_bn>("BatchNorm model");
  print_static_state<static_ln>("LayerNorm model");
  auto bn_model = dynamic_bn(seed);
  auto ln_model = dynamic_ln(seed);
  print_dynamic_state("BatchNorm model", bn_model);
  print_dynamic_state("LayerNorm model", ln_model);
  std::printf("BatchNorm model: test accuracy %.4f; LayerNorm model: test accuracy %.4f\n", bn.test_acc, ln.test_acc);
  examples::print_result("norms_batchnorm", mode, epochs, bn);
  examples::print_result("norms_layernorm", mode, epochs, ln);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "norms: %s\n", e.what());
  return 1;
}
