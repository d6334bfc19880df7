// Writes kiln models for the Python interop checks (tests/onnx_check.py, tests/torch_check.py): for each model
// <dir>/<name>.onnx or <name>.safetensors, with <name>.input.bin and <name>.output.bin (raw little-endian float32:
// an input batch and kiln's outputs for it, in evaluation mode); beside each ONNX model its state_dict as
// <name>.safetensors, whose names the ONNX initializers must carry. Models with batch norm or layer norm are trained a
// few steps first, so that their running statistics and affine parameters are not the initial ones; recurrent models
// keep their random initialisation or are trained likewise; attention and transformer models, whose outputs are
// sequences, get noise on every parameter instead. A time-major model's input is (seq, batch, features).
//   io_export onnx|safetensors <dir>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
Tensor<std::int64_t> random_labels(index_t n, index_t classes, std::uint64_t seed) {
  Tensor<std::int64_t> y(shape{n});
  random_generator rng(seed);
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(classes)));
  return y;
}
// Five Adam steps of cross-entropy on one random batch (its first dimension the batch, at most the net's max_batch).
template <class Net>
void train_static(Net& net, shape in, index_t classes) {
  auto x = random_input(in, 7);
  auto y = random_labels(in[0], classes, 8);
  optim::Adam opt({.lr = 1e-2});
  for (int step = 0; step < 5; ++step) net.train_step(x, y, loss::cross_entropy{}, opt);
}
void train_dynamic(nn::Module& model, shape in, index_t classes) {
  nn::Variable x(random_input(in, 9));
  auto y = random_labels(in[0], classes, 10);
  optim::Adam opt(model.parameters(), {.lr = 1e-2});
  model.train();
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    nn::cross_entropy(model(x), y).backward();
    opt.step();
  }
}
template <class Net>
void static_case(const fs::path& dir, const std::string& name, Net& net, const Tensor<float>& x,
                 io::onnx_options options = {}) {
  io::export_onnx(net, dir / (name + ".onnx"), options);
  io::save_weights(net, dir / (name + ".safetensors"));
  write_floats(dir / (name + ".input.bin"), x);
  write_floats(dir / (name + ".output.bin"), net.predict(x));
  std::printf("wrote %s\n", name.c_str());
}
template <class Net>
void static_case(const fs::path& dir, const std::string& name, Net& net, shape in, io::onnx_options options = {}) {
  static_case(dir, name, net, random_input(in, 5), std::move(options));
}
// Adds N(0, scale^2) noise to every parameter, so that what starts at zero or one (the attention's in_proj_bias and
// out_proj.bias, a LayerNorm's weight and bias) does not in the graph either.
void perturb_parameters(nn::Module& model, std::uint64_t seed, float scale = 0.1f) {
  random_generator rng(seed);
  std::vector<std::pair<std::string, Tensor<float>>> dict;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor<float> t = p.tensor();
    for (float& v : t.span()) v += scale * rng.normal<float>();
    dict.emplace_back(name, std::move(t));
  }
  model.load_state_dict(dict, false);
}
// The same for a static model's parameters.
template <class Net>
void perturb_static(Net& net, std::uint64_t seed, float scale = 0.1f) {
  random_generator rng(seed);
  auto dict = net.state_dict();
  for (auto& [name, t] : dict)
    for (float& v : t.span()) v += scale * rng.normal<float>();
  net.load_state_dict(dict);
}
// Token ids in [0, vocabulary) as floats, the input of a model starting with an nn::Embedding.
Tensor<float> random_ids(shape s, index_t vocabulary, std::uint64_t seed) {
  Tensor<float> x(s);
  random_generator rng(seed);
  for (float& v : x.span()) v = static_cast<float>(rng.below(static_cast<std::uint64_t>(vocabulary)));
  return x;
}
void dynamic_case(const fs::path& dir, const std::string& name, nn::Module& model, const Tensor<float>& x,
                  io::onnx_options options) {
  io::export_onnx(model, dir / (name + ".onnx"), options);
  io::save_weights(model, dir / (name + ".safetensors"));
  nn::no_grad guard;
  model.eval();
  write_floats(dir / (name + ".input.bin"), x);
  write_floats(dir / (name + ".output.bin"), model(nn::Variable(x)).tensor());
  std::printf("wrote %s\n", name.c_str());
}
void dynamic_case(const fs::path& dir, const std::string& name, nn::Module& model, shape in, io::onnx_options options) {
  dynamic_case(dir, name, model, random_input(in, 6), std::move(options));
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

    // CNNs. Shapes per sample: 3x12x11 -> conv 6x10x9 -> pool 6x5x4 -> conv (stride 2, padding 1) 8x3x2 -> average
    // pool (stride 1, padding 1, the padding counted) 8x4x3 -> 96 -> 10 -> 4. The ReLU after the first Conv2D runs
    // in its epilogue (static mode's fused activations).
    using cnn = Sequential<policy::cpu, Input<3, 12, 11>, Conv2D<6, 3>, ReLU, MaxPool2D<2>,
                           Conv2D<8, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, LeakyReLU<0.1>,
                           AvgPool2D<2, 1, 1>, Dropout<0.3>, Flatten, Dense<10, ReLU>, Dense<4>>;
    cnn c(8, 3);
    train_static(c, shape{8, 3, 12, 11}, 4);
    static_case(dir, "static_cnn", c, shape{5, 3, 12, 11});
    manual_seed(6);
    auto dyn_cnn = nn::Sequential(nn::Conv2d(3, 6, 3), nn::ReLU(), nn::MaxPool2d(2), nn::Conv2d(6, 8, 3, 2, 1),
                                  nn::BatchNorm2d(8), nn::LeakyReLU(0.1f), nn::AvgPool2d(2, 1, 1), nn::Dropout(0.3f),
                                  nn::Flatten(), nn::Linear(96, 10), nn::ReLU(), nn::Linear(10, 4));
    train_dynamic(dyn_cnn, shape{8, 3, 12, 11}, 4);
    dynamic_case(dir, "dynamic_cnn", dyn_cnn, shape{5, 3, 12, 11}, {.input_shape = {3, 12, 11}});

    // The other options: "same" padding with an even kernel (the odd pixel after the end), no bias, batch norm without
    // affine, dilation and groups, ceil mode (last windows that reach past the end), count_include_pad off, and a
    // global average pool: 4x9x10 -> 8x9x10 -> 8x9x10 -> 8x4x5 -> 8x3x3 -> 8 -> 3.
    constexpr conv_options same_even{.same = true, .bias = false}, dilated{.padding = 2, .dilation = 2, .groups = 4};
    using options_net =
        Sequential<policy::cpu, Input<4, 9, 10>, Conv2D<8, 2, same_even>, BatchNorm2d<0.1, 1e-3, false>, Tanh,
                   Conv2D<8, 3, dilated>, MaxPool2D<3, 2, 0, true>, AvgPool2D<3, 2, 1, true, false>, GlobalAvgPool2D,
                   Dense<3>>;
    options_net o(8, 4);
    train_static(o, shape{8, 4, 9, 10}, 3);
    static_case(dir, "static_cnn_options_opset13", o, shape{3, 4, 9, 10}, {.opset = 13});
    manual_seed(7);
    auto dyn_options = nn::Sequential(nn::Conv2d(4, 8, 2, 1, "same", 1, 1, false),
                                      nn::BatchNorm2d(8, 1e-3f, 0.1f, false), nn::Tanh(),
                                      nn::Conv2d(8, 8, 3, 1, 2, 2, 4), nn::MaxPool2d(3, 2, 0, true),
                                      nn::AvgPool2d(3, 2, 1, true, false), nn::AdaptiveAvgPool2d(1), nn::Flatten(),
                                      nn::Linear(8, 3));
    train_dynamic(dyn_options, shape{8, 4, 9, 10}, 3);
    dynamic_case(dir, "dynamic_cnn_options_opset13", dyn_options, shape{3, 4, 9, 10},
                 {.opset = 13, .input_shape = {4, 9, 10}});

    // Ceil-mode pooling at its edges: an average counting its padding whose last window reaches past the padded input
    // (3x7x8 -> 3x4x5, written with a Pad node), then windows dropped for starting in the end padding (4x5 -> 2x2).
    using pools = Sequential<policy::cpu, Input<3, 7, 8>, AvgPool2D<3, 2, 1, true>, MaxPool2D<2, 3, 1, true>, Flatten,
                             Dense<5>>;
    pools p(8, 5);
    static_case(dir, "static_pools_ceil", p, shape{4, 3, 7, 8});
    manual_seed(8);
    auto dyn_pools = nn::Sequential(nn::AvgPool2d(3, 2, 1, true), nn::MaxPool2d(2, 3, 1, true), nn::Flatten(),
                                    nn::Linear(12, 5));
    dynamic_case(dir, "dynamic_pools_ceil", dyn_pools, shape{4, 3, 7, 8}, {.input_shape = {3, 7, 8}});

    // Fashion-MNIST's CNN as examples/fashion_cnn builds it.
    constexpr conv_options same_no_bias{.same = true, .bias = false};
    using fashion = Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3, same_no_bias>, BatchNorm2d<>, ReLU,
                               MaxPool2D<2>, Conv2D<64, 3, same_no_bias>, BatchNorm2d<>, ReLU, MaxPool2D<2>,
                               Dropout<0.25>, Flatten, Dense<128, ReLU>, Dropout<0.25>, Dense<10>>;
    fashion f(8, 42);
    train_static(f, shape{8, 1, 28, 28}, 10);
    static_case(dir, "static_fashion_cnn", f, shape{3, 1, 28, 28});
    manual_seed(42);
    auto dyn_fashion = nn::Sequential(nn::Conv2d(1, 32, 3, 1, "same", 1, 1, false), nn::BatchNorm2d(32), nn::ReLU(),
                                      nn::MaxPool2d(2), nn::Conv2d(32, 64, 3, 1, "same", 1, 1, false),
                                      nn::BatchNorm2d(64), nn::ReLU(), nn::MaxPool2d(2), nn::Dropout(0.25f),
                                      nn::Flatten(), nn::Linear(3136, 128), nn::ReLU(), nn::Dropout(0.25f),
                                      nn::Linear(128, 10));
    train_dynamic(dyn_fashion, shape{8, 1, 28, 28}, 10);
    dynamic_case(dir, "dynamic_fashion_cnn", dyn_fashion, shape{3, 1, 28, 28}, {.input_shape = {1, 28, 28}});

    // Normalisation: BatchNorm1d over (C, L) and over (C), LayerNorm over one trailing dim, two, and all; opset 17
    // writes LayerNormalization, opset 13 its decomposition.
    using norms = Sequential<policy::cpu, Input<4, 6>, BatchNorm1d<>, LayerNorm<6>, layer_norm_layer<1e-3, false, 4, 6>,
                             Flatten, Dense<8, GELU>, BatchNorm1d<0.2, 1e-4, false>, Dense<3>, LayerNorm<>>;
    norms n(8, 6);
    train_static(n, shape{8, 4, 6}, 3);
    static_case(dir, "static_norms_opset17", n, shape{5, 4, 6});
    static_case(dir, "static_norms_opset13", n, shape{5, 4, 6}, {.opset = 13});
    manual_seed(9);
    auto dyn_norms = nn::Sequential(nn::BatchNorm1d(4), nn::LayerNorm(6), nn::LayerNorm(shape{4, 6}, 1e-3f, false),
                                    nn::Flatten(), nn::Linear(24, 8), nn::GELU(),
                                    nn::BatchNorm1d(8, 1e-4f, 0.2f, false), nn::Linear(8, 3), nn::LayerNorm(3));
    train_dynamic(dyn_norms, shape{8, 4, 6}, 3);
    dynamic_case(dir, "dynamic_norms_opset17", dyn_norms, shape{5, 4, 6}, {.input_shape = {4, 6}});
    dynamic_case(dir, "dynamic_norms_opset13", dyn_norms, shape{5, 4, 6}, {.opset = 13, .input_shape = {4, 6}});

    // Recurrent models. examples/timeseries_lstm: a window of 12 months -> LSTM(32), one layer or two -> last step ->
    // Dense(1).
    using timeseries = Sequential<policy::cpu, Input<12, 1>, LastStep<LSTM<32>>, Dense<1>>;
    timeseries ts(8, 11);
    static_case(dir, "static_timeseries_lstm", ts, shape{5, 12, 1});
    using timeseries2 = Sequential<policy::cpu, Input<12, 1>, LastStep<LSTM<32, 2>>, Dense<1>>;
    timeseries2 ts2(8, 12);
    static_case(dir, "static_timeseries_lstm2_opset13", ts2, shape{5, 12, 1}, {.opset = 13});
    manual_seed(10);
    auto dyn_ts = nn::Sequential(nn::LastStep(nn::LSTM(1, 32, {.batch_first = true})), nn::Linear(32, 1));
    dynamic_case(dir, "dynamic_timeseries_lstm", dyn_ts, shape{5, 12, 1}, {.input_shape = {12, 1}});
    manual_seed(11);
    auto dyn_ts2 = nn::Sequential(nn::LastStep(nn::LSTM(1, 32, {.num_layers = 2, .batch_first = true})),
                                  nn::Linear(32, 1));
    dynamic_case(dir, "dynamic_timeseries_lstm2_opset13", dyn_ts2, shape{5, 12, 1},
                 {.opset = 13, .input_shape = {12, 1}});

    // examples/sequence_classify: MNIST rows as a sequence, a bidirectional LSTM(128)'s final state -> Dense(10).
    using classify = Sequential<policy::cpu, Input<28, 28>, FinalState<LSTM<128, 1, true>>, Dense<10>>;
    classify sc(8, 13);
    train_static(sc, shape{8, 28, 28}, 10);
    static_case(dir, "static_sequence_classify", sc, shape{3, 28, 28});
    manual_seed(12);
    auto dyn_sc = nn::Sequential(nn::FinalState(nn::LSTM(28, 128, {.batch_first = true, .bidirectional = true})),
                                 nn::Linear(256, 10));
    train_dynamic(dyn_sc, shape{8, 28, 28}, 10);
    dynamic_case(dir, "dynamic_sequence_classify", dyn_sc, shape{3, 28, 28}, {.input_shape = {28, 28}});

    // Stacked and bidirectional: two bidirectional LSTM layers without bias (dropout between them, off at inference)
    // hand every step through a Tanh (dynamic mode: a Linear over each step first) to a two-layer bidirectional GRU's
    // last step. Then GRUs of one layer and one direction, and each output view: every step (also as the model's
    // output), the last step, the final state.
    using stacked = Sequential<policy::cpu, Input<7, 5>, LSTM<6, 2, true, rnn_options{.bias = false, .dropout = 0.3f}>,
                               Tanh, LastStep<GRU<5, 2, true>>, Dense<3>>;
    stacked st(8, 14);
    train_static(st, shape{8, 7, 5}, 3);
    static_case(dir, "static_rnn_stacked", st, shape{4, 7, 5});
    using grus = Sequential<policy::cpu, Input<6, 4>, GRU<5>, FinalState<GRU<3, 2, true>>, Dense<2>>;
    grus g(8, 15);
    static_case(dir, "static_gru_opset13", g, shape{4, 6, 4}, {.opset = 13});
    using final_one = Sequential<policy::cpu, Input<6, 4>, FinalState<GRU<3>>, Dense<6>>;
    final_one fo(8, 16);
    static_case(dir, "static_gru_final_state_one_layer", fo, shape{4, 6, 4});
    using all_steps = Sequential<policy::cpu, Input<5, 3>, AllSteps<GRU<4, 2, true>>, LSTM<2, 1, true>>;
    all_steps as(8, 17);
    static_case(dir, "static_rnn_all_steps_opset20", as, shape{4, 5, 3}, {.opset = 20});
    manual_seed(13);
    auto dyn_stacked = nn::Sequential(
        nn::LSTM(5, 6, {.num_layers = 2, .bias = false, .batch_first = true, .dropout = 0.3f, .bidirectional = true}),
        nn::Linear(12, 4), nn::Tanh(),
        nn::LastStep(nn::GRU(4, 5, {.num_layers = 2, .batch_first = true, .bidirectional = true})),
        nn::Linear(10, 3));
    train_dynamic(dyn_stacked, shape{8, 7, 5}, 3);
    dynamic_case(dir, "dynamic_rnn_stacked", dyn_stacked, shape{4, 7, 5}, {.input_shape = {7, 5}});
    manual_seed(14);
    auto dyn_grus = nn::Sequential(nn::AllSteps(nn::GRU(4, 5, {.batch_first = true})),
                                   nn::FinalState(nn::GRU(5, 3, {.num_layers = 2, .batch_first = true,
                                                                 .bidirectional = true})),
                                   nn::Linear(6, 2));
    dynamic_case(dir, "dynamic_gru_opset13", dyn_grus, shape{4, 6, 4}, {.opset = 13, .input_shape = {6, 4}});

    // Time-major (no batch_first): the input is (seq, batch, features), the graph's [7, N, 5]. Every step stays
    // time-major through a Linear, a LayerNorm and a second time-major recurrent layer, whose last step (batch, 3)
    // has the batch first again; a GRU without bias into an LSTM's final state; and a model handing on the
    // time-major sequence itself, the graph's output [6, N, 4].
    manual_seed(15);
    auto time_major = nn::Sequential(nn::LSTM(5, 4, {.num_layers = 2, .bidirectional = true}), nn::Linear(8, 6),
                                     nn::ReLU(), nn::LayerNorm(6), nn::LastStep(nn::GRU(6, 3)), nn::Softmax(1));
    dynamic_case(dir, "dynamic_rnn_time_major", time_major, shape{7, 4, 5}, {.input_shape = {7, -1, 5}});
    manual_seed(16);
    auto time_major_final = nn::Sequential(nn::GRU(3, 2, {.num_layers = 2, .bias = false, .bidirectional = true}),
                                           nn::FinalState(nn::LSTM(4, 3, {.bidirectional = true})), nn::Linear(6, 4));
    dynamic_case(dir, "dynamic_rnn_time_major_final_state_opset13", time_major_final, shape{6, 4, 3},
                 {.opset = 13, .input_shape = {6, -1, 3}});
    manual_seed(17);
    auto time_major_out = nn::Sequential(nn::AllSteps(nn::LSTM(3, 2, {.bidirectional = true})), nn::Linear(4, 4),
                                         nn::LogSoftmax(-1));
    dynamic_case(dir, "dynamic_rnn_time_major_sequence_out", time_major_out, shape{6, 4, 3},
                 {.input_shape = {6, -1, 3}});
    // A time-major (seq, batch, 3, 4) input flattened after the batch into (seq, batch, 12) (a Reshape keeping the
    // batch second).
    manual_seed(18);
    auto time_major_flatten = nn::Sequential(nn::Flatten(2, 3), nn::LastStep(nn::GRU(12, 3, {.num_layers = 2})),
                                             nn::Linear(3, 2));
    dynamic_case(dir, "dynamic_rnn_time_major_flatten", time_major_flatten, shape{5, 4, 3, 4},
                 {.input_shape = {5, -1, 3, 4}});

    // Blocks (static/blocks.hpp, dynamic/modules/blocks.hpp). A residual MLP, y = x + f(x) inside a model: 12 -> 16
    // -> 16 -> 5.
    using residual_mlp = Sequential<policy::cpu, Input<3, 4>, Flatten, Dense<16, ReLU>,
                                    Residual<Dense<16, ReLU>, Dense<16>>, ReLU, Dense<5>>;
    residual_mlp rm(8, 31);
    train_static(rm, shape{8, 3, 4}, 5);
    static_case(dir, "static_block_residual_mlp", rm, shape{6, 3, 4});
    manual_seed(31);
    auto dyn_rm = nn::Sequential(nn::Flatten(), nn::Linear(12, 16), nn::ReLU(),
                                 nn::Residual(nn::Sequential(nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 16))),
                                 nn::ReLU(), nn::Linear(16, 5));
    train_dynamic(dyn_rm, shape{8, 3, 4}, 5);
    dynamic_case(dir, "dynamic_block_residual_mlp", dyn_rm, shape{6, 3, 4}, {.input_shape = {3, 4}});

    // With a Dense shortcut for a change of width (12 -> 8; a GELU, decomposed below opset 20, in the body), then a
    // Residual nested in a Chain (dynamic mode: an nn::Sequential; its shortcut a bare Linear, "0.shortcut.weight").
    using shortcut_mlp = Sequential<policy::cpu, Input<12>, Residual<Shortcut<Dense<8>>, Dense<8, GELU>, Dense<8>>,
                                    Tanh, Chain<Residual<Dense<8, ReLU>, Dense<8>>, ReLU>, Dense<3>, LogSoftmax<1>>;
    shortcut_mlp sm(8, 32);
    train_static(sm, shape{8, 12}, 3);
    static_case(dir, "static_block_residual_mlp_shortcut", sm, shape{6, 12});
    static_case(dir, "static_block_residual_mlp_shortcut_opset20", sm, shape{6, 12}, {.opset = 20});
    manual_seed(32);
    auto dyn_sm = nn::Sequential(
        nn::Residual(nn::Sequential(nn::Linear(12, 8), nn::GELU(), nn::Linear(8, 8)), nn::Linear(12, 8)), nn::Tanh(),
        nn::Sequential(nn::Residual(nn::Sequential(nn::Linear(8, 8), nn::ReLU(), nn::Linear(8, 8))), nn::ReLU()),
        nn::Linear(8, 3), nn::LogSoftmax(1));
    train_dynamic(dyn_sm, shape{8, 12}, 3);
    dynamic_case(dir, "dynamic_block_residual_mlp_shortcut", dyn_sm, shape{6, 12}, {.input_shape = {12}});

    // ResNet's downsampling block: 8x8x8 -> 16x4x4 through Conv2D (stride 2) + BatchNorm2d + ReLU + Conv2D +
    // BatchNorm2d, added to a strided 1x1 Conv2D + BatchNorm2d shortcut; trained first, so that the running statistics
    // the graph reads (evaluation mode) are not the initial ones.
    constexpr conv_options pad1{.padding = 1}, down{.stride = 2, .padding = 1}, stride2{.stride = 2};
    using resnet = Sequential<policy::cpu, Input<3, 8, 8>, Conv2D<8, 3, pad1>, BatchNorm2d<>, ReLU,
                              Residual<Shortcut<Conv2D<16, 1, stride2>, BatchNorm2d<>>, Conv2D<16, 3, down>,
                                       BatchNorm2d<>, ReLU, Conv2D<16, 3, pad1>, BatchNorm2d<>>,
                              ReLU, GlobalAvgPool2D, Dense<4>>;
    resnet rn(8, 33);
    train_static(rn, shape{8, 3, 8, 8}, 4);
    static_case(dir, "static_block_resnet", rn, shape{5, 3, 8, 8});
    // Static SyncBatchNorm1d / 2d, trained alone (BatchNorm's kernels): BatchNorm's BatchNormalization nodes.
    using synced = Sequential<policy::cpu, Input<3, 8, 8>, Conv2D<6, 3, pad1>, SyncBatchNorm2d<>, ReLU, Conv2D<6, 3>,
                              SyncBatchNorm2d<0.2, 1e-3, false>, Flatten, Dense<8>, SyncBatchNorm1d<>, Dense<3>>;
    synced sb(8, 35);
    train_static(sb, shape{8, 3, 8, 8}, 3);
    static_case(dir, "static_sync_batch_norm", sb, shape{5, 3, 8, 8});
    manual_seed(33);
    auto dyn_rn = nn::Sequential(
        nn::Conv2d(3, 8, 3, 1, 1), nn::BatchNorm2d(8), nn::ReLU(),
        nn::Residual(nn::Sequential(nn::Conv2d(8, 16, 3, 2, 1), nn::BatchNorm2d(16), nn::ReLU(),
                                    nn::Conv2d(16, 16, 3, 1, 1), nn::BatchNorm2d(16)),
                     nn::Sequential(nn::Conv2d(8, 16, 1, 2), nn::BatchNorm2d(16))),
        nn::ReLU(), nn::GlobalAvgPool2d(), nn::Linear(16, 4));
    train_dynamic(dyn_rn, shape{8, 3, 8, 8}, 4);
    dynamic_case(dir, "dynamic_block_resnet", dyn_rn, shape{5, 3, 8, 8}, {.input_shape = {3, 8, 8}});

    // Joins: a Concat along the channels (4 + 2 of them) of a Chain holding a Residual and a 1x1 Conv2D; an Add of a
    // Residual, a Chain with a BatchNorm2d and a ReLU (three terms, summed in order); then, flat, a Concat along the
    // features (dynamic mode: dim -1) of a Dense and a Chain. 3x8x8 -> 6x8x8 -> 6x8x8 -> 6x4x4 -> 96 -> 4 + 2 -> 3.
    using joins = Sequential<policy::cpu, Input<3, 8, 8>,
                             Concat<1, Chain<Conv2D<4, 3, pad1>, ReLU, Residual<Conv2D<4, 3, pad1>, BatchNorm2d<>>>,
                                    Conv2D<2, 1>>,
                             Add<Residual<Conv2D<6, 3, pad1>, Tanh>, Chain<Conv2D<6, 1>, BatchNorm2d<>>, ReLU>,
                             MaxPool2D<2>, Flatten, Concat<1, Dense<4>, Chain<Dense<3, ReLU>, Dense<2>>>, Dense<3>>;
    joins j(8, 34);
    train_static(j, shape{8, 3, 8, 8}, 3);
    static_case(dir, "static_block_concat_add", j, shape{5, 3, 8, 8});
    static_case(dir, "static_block_concat_add_opset13", j, shape{5, 3, 8, 8}, {.opset = 13});
    manual_seed(34);
    auto dyn_j = nn::Sequential(
        nn::Concat(1,
                   nn::Sequential(nn::Conv2d(3, 4, 3, 1, 1), nn::ReLU(),
                                  nn::Residual(nn::Sequential(nn::Conv2d(4, 4, 3, 1, 1), nn::BatchNorm2d(4)))),
                   nn::Conv2d(3, 2, 1)),
        nn::Add(nn::Residual(nn::Sequential(nn::Conv2d(6, 6, 3, 1, 1), nn::Tanh())),
                nn::Sequential(nn::Conv2d(6, 6, 1), nn::BatchNorm2d(6)), nn::ReLU()),
        nn::MaxPool2d(2), nn::Flatten(),
        nn::Concat(-1, nn::Linear(96, 4), nn::Sequential(nn::Linear(96, 3), nn::ReLU(), nn::Linear(3, 2))),
        nn::Linear(6, 3));
    train_dynamic(dyn_j, shape{8, 3, 8, 8}, 3);
    dynamic_case(dir, "dynamic_block_concat_add", dyn_j, shape{5, 3, 8, 8}, {.input_shape = {3, 8, 8}});

    // Attention and transformers (dynamic/modules/attention.hpp, transformer.hpp, positional.hpp, embedding.hpp).
    // Self-attention in a Sequential (query = key = value), batch first, 4 heads of 2 features, between Linears.
    manual_seed(41);
    auto dyn_attention = nn::Sequential(nn::Linear(5, 8), nn::MultiheadAttention(8, 4, {.batch_first = true}),
                                        nn::Tanh(), nn::Linear(8, 3));
    perturb_parameters(dyn_attention, 41);
    dynamic_case(dir, "dynamic_attention_batch_first", dyn_attention, shape{4, 6, 5}, {.input_shape = {6, 5}});
    // Time-major (seq, batch, features) and without bias, 2 heads.
    manual_seed(42);
    auto dyn_attention_tm = nn::Sequential(nn::MultiheadAttention(6, 2, {.bias = false}), nn::LayerNorm(6));
    perturb_parameters(dyn_attention_tm, 42);
    dynamic_case(dir, "dynamic_attention_time_major", dyn_attention_tm, shape{7, 3, 6}, {.input_shape = {7, -1, 6}});

    // TransformerEncoderLayer, post-norm with relu (PyTorch's defaults), batch first, after the first 6 rows of a
    // 16-row sinusoidal positional encoding.
    manual_seed(43);
    auto post_norm = nn::Sequential(nn::Linear(4, 8), nn::SinusoidalPositionalEncoding(8, 16, {.batch_first = true}),
                                    nn::TransformerEncoderLayer(8, 2, {.dim_feedforward = 16, .batch_first = true}),
                                    nn::Linear(8, 3));
    perturb_parameters(post_norm, 43);
    dynamic_case(dir, "dynamic_transformer_post_norm_relu", post_norm, shape{4, 6, 4}, {.input_shape = {6, 4}});
    // Pre-norm with gelu and no bias, time-major, after a learned positional embedding (6 of its 10 rows): at opset
    // 17 (LayerNormalization, Gelu's Erf form), 13 (LayerNorm decomposed) and 20 (a Gelu node).
    manual_seed(44);
    auto pre_norm = nn::Sequential(
        nn::LearnedPositionalEmbedding(10, 8),
        nn::TransformerEncoderLayer(8, 4, {.dim_feedforward = 12, .activation = nn::transformer_activation::gelu,
                                           .norm_first = true, .bias = false}));
    perturb_parameters(pre_norm, 44);
    dynamic_case(dir, "dynamic_transformer_pre_norm_gelu", pre_norm, shape{6, 3, 8}, {.input_shape = {6, -1, 8}});
    dynamic_case(dir, "dynamic_transformer_pre_norm_gelu_opset13", pre_norm, shape{6, 3, 8},
                 {.opset = 13, .input_shape = {6, -1, 8}});
    dynamic_case(dir, "dynamic_transformer_pre_norm_gelu_opset20", pre_norm, shape{6, 3, 8},
                 {.opset = 20, .input_shape = {6, -1, 8}});

    // A TransformerEncoder of two CausalTransformerLayers (the causal mask) and a final norm, batch first.
    manual_seed(45);
    auto causal_layer = [] { return nn::CausalTransformerLayer(8, 2, {.dim_feedforward = 16, .batch_first = true}); };
    auto causal = nn::Sequential(nn::TransformerEncoder(causal_layer, 2, std::make_shared<nn::LayerNorm>(8)),
                                 nn::Linear(8, 4));
    perturb_parameters(causal, 45);
    dynamic_case(dir, "dynamic_transformer_causal_encoder", causal, shape{3, 7, 8}, {.input_shape = {7, 8}});
    // A time-major one without the final norm, its layers post-norm.
    manual_seed(46);
    auto causal_tm = nn::Sequential(nn::TransformerEncoder(
        [] { return nn::CausalTransformerLayer(6, 3, {.dim_feedforward = 8}); }, 2));
    perturb_parameters(causal_tm, 46);
    dynamic_case(dir, "dynamic_transformer_causal_time_major", causal_tm, shape{5, 2, 6}, {.input_shape = {5, -1, 6}});

    // A tiny GPT end to end: token ids (as floats) through an Embedding, learned positions, two pre-norm gelu
    // CausalTransformerLayers, a LayerNorm and the head, logits [N, 10, 16].
    manual_seed(47);
    const nn::TransformerEncoderLayerOptions block{.dim_feedforward = 32,
                                                   .activation = nn::transformer_activation::gelu,
                                                   .batch_first = true, .norm_first = true};
    auto gpt = nn::Sequential(nn::Embedding(16, 8), nn::LearnedPositionalEmbedding(12, 8, {.batch_first = true}),
                              nn::CausalTransformerLayer(8, 2, block), nn::CausalTransformerLayer(8, 2, block),
                              nn::LayerNorm(8), nn::Linear(8, 16));
    perturb_parameters(gpt, 47);
    dynamic_case(dir, "dynamic_tiny_gpt", gpt, random_ids(shape{5, 10}, 16, 47), {.input_shape = {10}});

    // ViT-style: 4 patches of 16 pixels each, embedded by a Linear, learned positions, a TransformerEncoder of
    // pre-norm gelu layers with a final norm, then the patches' features flattened into a classifier.
    manual_seed(48);
    auto vit = nn::Sequential(
        nn::Linear(16, 8), nn::LearnedPositionalEmbedding(4, 8, {.batch_first = true}),
        nn::TransformerEncoder(
            [&] { return nn::TransformerEncoderLayer(8, 2, block); }, 2, std::make_shared<nn::LayerNorm>(8)),
        nn::Flatten(), nn::Linear(32, 3));
    perturb_parameters(vit, 48);
    dynamic_case(dir, "dynamic_transformer_vit", vit, shape{4, 4, 16}, {.input_shape = {4, 16}});

    // Static mode's transformers (examples/tiny_gpt_net.hpp's and vit_net.hpp's models, smaller): a GPT from ids to
    // logits [N, 10, 16] with causal pre-norm layers, and a post-norm relu ViT from images through patches, a class
    // token, sinusoidal positions and token 0 to the classes.
    constexpr transformer_layer_options causal_block{.feed_forward_activation = activation::gelu, .norm_first = true,
                                                     .causal = true};
    using static_gpt = Sequential<policy::cpu, Input<10>, Embedding<16, 8>, LearnedPositionalEmbedding<12>,
                                  TransformerEncoderLayer<2, 32, causal_block>,
                                  TransformerEncoderLayer<2, 32, causal_block>, LayerNorm<8>,
                                  TimeDistributed<Dense<16>>>;
    static_gpt sgpt(5, 49);
    perturb_static(sgpt, 49);
    static_case(dir, "static_tiny_gpt", sgpt, random_ids(shape{5, 10}, 16, 49));
    using static_vit = Sequential<policy::cpu, Input<1, 8, 8>, Patches<4>, TimeDistributed<Dense<8, GELU>>,
                                  ClassToken<>, SinusoidalPositionalEncoding<5>, TransformerEncoderLayer<2, 16>,
                                  MultiheadSelfAttention<4, true>, LayerNorm<8>, SelectToken<0>, Dense<3>>;
    static_vit svit(4, 50);
    perturb_static(svit, 50);
    static_case(dir, "static_transformer_vit", svit, shape{4, 1, 8, 8});
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
