// Writes kiln models for the Python interop checks (tests/onnx_check.py, tests/torch_check.py): for each model
// <dir>/<name>.onnx or <name>.safetensors, with <name>.input.bin and <name>.output.bin (raw little-endian float32:
// an input batch and kiln's outputs for it).
//   io_export onnx|safetensors <dir>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/dynamic/nn.hpp"
#include "kiln/io/onnx.hpp"
#include "kiln/io/onnx_dynamic.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

void write_floats(const fs::path& path, const Tensor<float>& t) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!out) fail("io_export: cannot write ", path.string());
}
Tensor<float> random_input(shape s, std::uint64_t seed) {
  Tensor<float> x(s);
  random_generator rng(seed);
  for (float& v : x.span()) v = rng.normal<float>();
  return x;
}
template <class Net>
void static_case(const fs::path& dir, const std::string& name, Net& net, shape in, io::onnx_options options = {}) {
  auto x = random_input(in, 5);
  io::export_onnx(net, dir / (name + ".onnx"), options);
  write_floats(dir / (name + ".input.bin"), x);
  write_floats(dir / (name + ".output.bin"), net.predict(x));
  std::printf("wrote %s\n", name.c_str());
}
void dynamic_case(const fs::path& dir, const std::string& name, nn::Module& model, shape in, io::onnx_options options) {
  auto x = random_input(in, 6);
  io::export_onnx(model, dir / (name + ".onnx"), options);
  nn::no_grad guard;
  model.eval();
  write_floats(dir / (name + ".input.bin"), x);
  write_floats(dir / (name + ".output.bin"), model(nn::Variable(x)).tensor());
  std::printf("wrote %s\n", name.c_str());
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) fail("usage: io_export onnx|safetensors <dir>");
  std::string what = argv[1];
  fs::path dir = argv[2];
  fs::create_directories(dir);
  if (what == "onnx") {
    using every_activation = Sequential<policy::cpu, Input<3, 4>, Flatten, Dense<16, ReLU>, Dense<8, LeakyReLU<0.2>>,
                                        Dense<6, GELU>, Dense<5, Sigmoid>, Dense<4, Tanh>, Dense<3>, LogSoftmax<1>>;
    every_activation a(16, 1);
    static_case(dir, "static_activations_opset17", a, shape{7, 3, 4});
    static_case(dir, "static_activations_opset20", a, shape{7, 3, 4}, {.opset = 20});
    using separate = Sequential<policy::cpu, Input<10>, Dense<7, Identity, false>, GELU, Tanh, Dense<5>, Softmax<1>>;
    separate b(16, 2);
    static_case(dir, "static_softmax_nobias", b, shape{9, 10});

    manual_seed(3);
    auto mlp = nn::Sequential(nn::Flatten(), nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 8), nn::GELU(),
                              nn::Linear(8, 5), nn::Softmax(1));
    dynamic_case(dir, "dynamic_mlp", mlp, shape{6, 3, 4}, {.input_shape = {3, 4}});
    manual_seed(4);
    auto ranked = nn::Sequential(nn::Linear(4, 6), nn::Tanh(), nn::Flatten(2, -1), nn::Linear(6, 3), nn::LeakyReLU(0.1f),
                                 nn::Sequential(nn::Flatten(), nn::Linear(9, 4, false)), nn::Sigmoid(),
                                 nn::LogSoftmax(-1));
    dynamic_case(dir, "dynamic_rank3", ranked, shape{5, 3, 4}, {.opset = 20, .input_shape = {3, 4}});
    manual_seed(5);
    auto reshape = nn::Sequential(nn::Flatten(2, 3), nn::Linear(12, 5), nn::Identity(), nn::Softmax(2));
    dynamic_case(dir, "dynamic_reshape", reshape, shape{4, 2, 3, 4}, {.opset = 13, .input_shape = {2, 3, 4}});
  } else if (what == "safetensors") {
    using mlp = Sequential<policy::cpu, Input<3, 4>, Flatten, Dense<8, ReLU>, Dense<5>>;
    mlp net(8, 21);
    auto x = random_input(shape{6, 3, 4}, 9);
    io::save_weights(net, dir / "static_mlp.safetensors", {{"format", "pt"}});
    write_floats(dir / "static_mlp.input.bin", x);
    write_floats(dir / "static_mlp.output.bin", net.predict(x));
    manual_seed(22);
    auto model = nn::Sequential(nn::Flatten(), nn::Linear(12, 8), nn::ReLU(), nn::Linear(8, 5));
    io::save_weights(model, dir / "dynamic_mlp.safetensors", {{"format", "pt"}});
    nn::no_grad guard;
    write_floats(dir / "dynamic_mlp.input.bin", x);
    write_floats(dir / "dynamic_mlp.output.bin", model(nn::Variable(x)).tensor());
    std::printf("wrote static_mlp, dynamic_mlp\n");
  } else {
    fail("io_export: expected 'onnx' or 'safetensors', found '", what, "'");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "io_export: %s\n", e.what());
  return 1;
}
