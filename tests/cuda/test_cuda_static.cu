// Static mode on the GPU policies: the same small models (an MLP, a CNN with Conv2D, BatchNorm, MaxPool and Dropout,
// an LSTM, a two-layer bidirectional GRU) trained from the same seed on policy::cpu and on policy::cuda /
// policy::cudnn must give the same losses, predictions and state_dicts, within the tolerances stated next to each
// check.
//
// Why tolerances at all: the GPU sums in another order (cuBLAS splits K across threads, reductions go by blocks) so
// every FP32 result may differ from the CPU's in its last bits (relative 1e-7 per operation, ~1e-6 after a long dot
// product). Adam turns these into slightly different updates, and the differences grow over the steps; 20 steps of
// Adam at lr 1e-3 keep them far below 1e-3 of the loss. Initial weights are drawn on the host for every policy and
// uploaded, so they are identical bit for bit; dropout masks come from the counter-based generator and are identical
// too (kernels/cuda/dropout.cuh).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "cuda_training_helpers.cuh"
#include "kiln/io/checkpoint.hpp"
#include "kiln/kiln.hpp"
#include "kiln/policy_cuda.cuh"
#include "kiln/train.hpp"

using namespace kiln;
using namespace kiln::cuda_test;

namespace {

template <class P>
using mlp = Sequential<P, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
template <class P>
using cnn = Sequential<P, Input<1, 12, 12>, Conv2D<4, 3>, BatchNorm2d<>, ReLU, MaxPool2D<2>, Dropout<0.25>, Flatten,
                       Dense<16, ReLU>, Dense<10>>;
// Each model is also named through a class with a member type, the form check_against_cpu takes: nvcc 13 writes an
// alias template (or a base-class list) whose arguments hold a class-type template argument (LSTM's rnn_options) into
// its host code with an undeclared name, which the host compiler rejects; a member type is written correctly.
template <class P>
struct mlp_model {
  using type = mlp<P>;
};
template <class P>
struct cnn_model {
  using type = cnn<P>;
};
template <class P>
struct lstm_model {
  using type = Sequential<P, Input<6, 5>, FinalState<LSTM<8>>, Dense<10>>;
};
template <class P>
struct gru_model {
  using type = Sequential<P, Input<6, 5>, FinalState<GRU<8, 2, true>>, Dense<10>>;
};

// Graph blocks (static/blocks.hpp): a strided convolutional residual block with a shortcut, then a Concat and an Add.
template <class P>
struct blocks_model {
  using block = Residual<Shortcut<Conv2D<4, 1, conv_options{.stride = 2}>, BatchNorm2d<>>,
                         Conv2D<4, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, ReLU,
                         Conv2D<4, 3, conv_options{.padding = 1}>>;
  using type = Sequential<P, Input<1, 12, 12>, block, ReLU, Flatten, Concat<1, Dense<8>, Chain<Dense<6, ReLU>>>,
                          Add<Dense<10>, Chain<Dense<10, Tanh>>>>;
};

// A small transformer (layers/transformer_encoder_layer.hpp, positional_embedding.hpp, tokens.hpp): tokens from a
// Dense per position, a class token, learned positions, a pre-norm GELU layer and a causal one (the CUDA attention
// kernel, the heads split and merged by copy_rows), the class token read out.
template <class P>
struct transformer_model {
  using type = Sequential<P, Input<6, 8>, TimeDistributed<Dense<16>>, ClassToken<>, LearnedPositionalEmbedding<7>,
                          TransformerEncoderLayer<2, 32, transformer_layer_options{
                                                             .feed_forward_activation = activation::gelu,
                                                             .norm_first = true}>,
                          CausalTransformerLayer<4, 32>, LayerNorm<16>, SelectToken<0>, Dense<10>>;
};

constexpr index_t batch = training_batch;

template <class Net>
std::vector<float> flat_state(const Net& net) {
  std::vector<float> out;
  for (const auto& [name, t] : net.state_dict()) out.insert(out.end(), t.data(), t.data() + t.numel());
  return out;
}

std::vector<float> as_vector(const Tensor<float>& t) { return {t.data(), t.data() + t.numel()}; }

// CPU and GPU versions of one model: same initial state, same losses over 20 steps, same predictions from the same
// weights, and a state_dict round trip.
template <template <class> class Model, class GPU>
void check_against_cpu(shape sample_shape, double loss_tolerance, const char* what) {
  CAPTURE(what);
  CAPTURE(GPU::name);
  const batch_data d = make_data(sample_shape, 4 * batch, 11);
  typename Model<policy::cpu>::type cpu_net(batch, 42);
  typename Model<GPU>::type gpu_net(batch, 42);

  // Initial weights are drawn on the host for every policy: identical.
  check_identical(flat_state(gpu_net), flat_state(cpu_net), std::string(what) + " initial state_dict");

  const auto cpu_losses = train_losses(cpu_net, d, 20);
  const auto gpu_losses = train_losses(gpu_net, d, 20);
  for (float l : gpu_losses) REQUIRE(std::isfinite(l));
  check_close(gpu_losses, cpu_losses, loss_tolerance, 1e-6, std::string(what) + " losses over 20 Adam steps");

  // The same weights on both: predictions agree to FP32 rounding of one forward pass (relative 1e-4; absolute 1e-5
  // for outputs near zero). predict runs in chunks of max_batch, so 3.5 batches also test the last partial chunk.
  gpu_net.load_state_dict(cpu_net.state_dict());
  check_identical(flat_state(gpu_net), flat_state(cpu_net), std::string(what) + " state_dict after load");
  const auto x = d.x.rows(0, 3 * batch + batch / 2);
  check_close(as_vector(gpu_net.predict(x)), as_vector(cpu_net.predict(x)), 1e-4, 1e-5,
              std::string(what) + " predict");

  // Round trip through a fresh GPU model.
  typename Model<GPU>::type copy(batch, 7);
  copy.load_state_dict(gpu_net.state_dict());
  check_identical(flat_state(copy), flat_state(gpu_net), std::string(what) + " state_dict round trip");
}

}  // namespace

TEST_CASE("static MLP on policy::cuda trains as on the CPU") {
  check_against_cpu<mlp_model, policy::cuda>(shape{28, 28}, 1e-3, "MLP");
}

// BatchNorm's statistics are sums over batch x 100 values per channel, in another order on the GPU (cuDNN's own
// kernels for policy::cudnn): a little more rounding than the MLP, hence 2e-3.
TEST_CASE_TEMPLATE("static CNN (Conv2D, BatchNorm, MaxPool, Dropout, Dense) trains as on the CPU", GPU, policy::cuda,
                   policy::cudnn) {
  check_against_cpu<cnn_model, GPU>(shape{1, 12, 12}, 2e-3, "CNN");
}

TEST_CASE_TEMPLATE("static graph blocks (Residual with a Shortcut, Concat, Add) train as on the CPU", GPU,
                   policy::cuda, policy::cudnn) {
  check_against_cpu<blocks_model, GPU>(shape{1, 12, 12}, 2e-3, "blocks");
}

TEST_CASE_TEMPLATE("static LSTM trains as on the CPU", GPU, policy::cuda, policy::cudnn) {
  check_against_cpu<lstm_model, GPU>(shape{6, 5}, 1e-3, "LSTM");
}

TEST_CASE("static transformer layers train on policy::cuda as on the CPU") {
  check_against_cpu<transformer_model, policy::cuda>(shape{6, 8}, 1e-3, "transformer");
}

// policy::cudnn runs both through cuDNN's RNN (kernels/cudnn/rnn.cuh), policy::cuda through kiln's steps.
TEST_CASE_TEMPLATE("static GRU (two layers, bidirectional) trains as on the CPU", GPU, policy::cuda, policy::cudnn) {
  check_against_cpu<gru_model, GPU>(shape{6, 5}, 1e-3, "GRU");
}

TEST_CASE("batches resident on the device train exactly as staged host batches") {
  const batch_data d = make_data(shape{28, 28}, 4 * batch, 5);
  const auto x_device = to_device(as_vector(d.x));
  const auto y_device = to_device(std::vector<std::int64_t>(d.y.data(), d.y.data() + d.y.numel()));
  mlp<policy::cuda> staged(batch, 3), resident(batch, 3);
  optim::basic_adam<float, policy::cuda> adam_staged({.lr = 1e-3}), adam_resident({.lr = 1e-3});
  std::vector<float> staged_losses, resident_losses;
  for (int s = 0; s < 8; ++s) {
    const index_t first = (s % 4) * batch;
    staged_losses.push_back(
        staged.train_step(d.x.rows(first, batch), d.y.rows(first, batch), loss::cross_entropy{}, adam_staged));
    tensor_view<const float> xb(x_device.data() + first * 784, shape{batch, 28, 28});
    tensor_view<const std::int64_t> yb(y_device.data() + first, shape{batch});
    resident_losses.push_back(resident.train_step(kiln::resident, xb, yb, loss::cross_entropy{}, adam_resident));
  }
  // Same kernels on the same numbers: the same bits.
  check_identical(resident_losses, staged_losses, "resident vs staged losses");
  tensor_view<const float> all(x_device.data(), shape{4 * batch, 28, 28});
  check_identical(as_vector(resident.predict(kiln::resident, all)), as_vector(staged.predict(d.x)),
                  "resident vs staged predict");
  // forward returns device memory; last_output_on_host reads it back.
  resident.eval();
  resident.forward(kiln::resident, all.rows(0, batch));
  const auto host_out = resident.last_output_on_host();
  const auto expected = staged.predict(d.x.rows(0, batch));
  check_identical(std::vector<float>(host_out.data(), host_out.data() + host_out.numel()), as_vector(expected),
                  "last_output_on_host");
}

// A whole training step captured into a CUDA graph and replayed: the loss stays on the device
// (enqueue_train_step) and Adam keeps its step count there (capturable), so every replay is a correct next step.
// Compared with eager steps on the same batches: the only difference is where Adam's bias corrections are computed
// (device pow versus host pow, both in double, then rounded to float), so the losses agree to 1e-5.
TEST_CASE("a static training step captured into a CUDA graph replays as eager steps") {
  const batch_data d = make_data(shape{28, 28}, 4 * batch, 9);
  const auto x_device = to_device(as_vector(d.x));
  const auto y_device = to_device(std::vector<std::int64_t>(d.y.data(), d.y.data() + d.y.numel()));
  auto batch_x = [&](index_t s) { return x_device.data() + (s % 4) * batch * 784; };
  auto batch_y = [&](index_t s) { return y_device.data() + (s % 4) * batch; };

  mlp<policy::cuda> eager(batch, 5), graphed(batch, 5);
  optim::basic_adam<float, policy::cuda> adam_eager({.lr = 1e-3});
  optim::basic_adam<float, policy::cuda> adam_graphed({.lr = 1e-3, .capturable = true});
  const int steps = 10;
  std::vector<float> eager_losses;
  for (int s = 0; s < steps; ++s)
    eager_losses.push_back(eager.train_step(kiln::resident, tensor_view<const float>(batch_x(s), shape{batch, 28, 28}),
                                            tensor_view<const std::int64_t>(batch_y(s), shape{batch}),
                                            loss::cross_entropy{}, adam_eager));

  // The graph reads its batch from fixed buffers; each step first copies the next batch there.
  kiln::cuda::device_buffer<float> x_fixed(batch * 784), loss_device(1);
  kiln::cuda::device_buffer<std::int64_t> y_fixed(batch);
  const cudaStream_t stream = kiln::cuda::current_stream();
  auto load_batch = [&](int s) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(x_fixed.data(), batch_x(s), batch * 784 * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
    KILN_CUDA_CHECK(cudaMemcpyAsync(y_fixed.data(), batch_y(s), batch * sizeof(std::int64_t),
                                    cudaMemcpyDeviceToDevice, stream));
  };
  auto step = [&] {
    graphed.enqueue_train_step(kiln::resident, tensor_view<const float>(x_fixed.data(), shape{batch, 28, 28}),
                               tensor_view<const std::int64_t>(y_fixed.data(), shape{batch}), loss::cross_entropy{},
                               adam_graphed, loss_device.data());
  };
  auto read_loss = [&] {
    float value = 0;
    policy::cuda::download(loss_device.data(), &value, 1);
    return value;
  };
  std::vector<float> graphed_losses;
  load_batch(0);
  step();  // the first step outside the capture: it allocates Adam's state
  graphed_losses.push_back(read_loss());
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int s = 1; s < steps; ++s) {
    load_batch(s);
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    graphed_losses.push_back(read_loss());
  }
  KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  check_close(graphed_losses, eager_losses, 1e-5, 1e-7, "graph replay vs eager losses");
  // The host learns the device's step count when it reads the state.
  CHECK(adam_graphed.state().at(0).step == steps);
}

TEST_CASE("kiln::Model fits a GPU static model for one epoch as on the CPU") {
  const batch_data d = make_data(shape{28, 28}, 8 * batch, 13);
  mlp<policy::cpu> cpu_net(batch, 21);
  mlp<policy::cuda> gpu_net(batch, 21);
  Model cpu_model(cpu_net);
  Model gpu_model(gpu_net);
  cpu_model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
  gpu_model.compile(optim::basic_adam<float, policy::cuda>({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
  fit_options<std::int64_t> options{.epochs = 1, .batch_size = batch, .verbose = 0, .seed = 4};
  options.validation_data = labelled_data<std::int64_t>{d.x.rows(0, 2 * batch), d.y.rows(0, 2 * batch)};
  const auto cpu_history = cpu_model.fit(d.x, d.y, options);
  const auto gpu_history = gpu_model.fit(d.x, d.y, options);
  REQUIRE(gpu_history.size() == 1);
  for (const char* key : {"loss", "val_loss"})
    check_close(gpu_history.series(key), cpu_history.series(key), 1e-3, 1e-6, key);
  // Accuracy counts argmaxes: a near tie could flip one sample in 256 (64 for validation).
  CHECK(std::abs(gpu_history.series("accuracy")[0] - cpu_history.series("accuracy")[0]) <= 1.0 / 256 + 1e-12);
  CHECK(std::abs(gpu_history.series("val_accuracy")[0] - cpu_history.series("val_accuracy")[0]) <= 1.0 / 64 + 1e-12);
  check_close(as_vector(gpu_model.predict(d.x.rows(0, batch))), as_vector(gpu_net.predict(d.x.rows(0, batch))), 0, 0,
              "Model::predict");
}

namespace {
// The optimizers the GPU checkpoint test resumes, each with options that give it all of its kinds of state.
struct adam_case {
  using type = optim::basic_adam<float, policy::cuda>;
  static type make() { return type({.lr = 1e-3}); }
};
struct rmsprop_case {
  using type = optim::basic_rmsprop<float, policy::cuda>;
  static type make() { return type({.lr = 1e-3, .momentum = 0.9, .centered = true}); }
};
struct adagrad_case {
  using type = optim::basic_adagrad<float, policy::cuda>;
  static type make() { return type({.lr = 1e-2, .lr_decay = 0.01, .initial_accumulator_value = 0.1}); }
};
}  // namespace

TEST_CASE_TEMPLATE("a checkpoint of a GPU model and its optimizer resumes exactly", Case, adam_case, rmsprop_case,
                   adagrad_case) {
  using optimizer = typename Case::type;
  const batch_data d = make_data(shape{28, 28}, 4 * batch, 17);
  const auto path = std::filesystem::temp_directory_path() / "kiln_cuda_static_checkpoint.safetensors";
  auto run = [&](mlp<policy::cuda>& net, optimizer& opt, int from, int to) {
    std::vector<float> losses;
    for (int s = from; s < to; ++s) {
      const index_t first = (s % 4) * batch;
      losses.push_back(net.train_step(d.x.rows(first, batch), d.y.rows(first, batch), loss::cross_entropy{}, opt));
    }
    return losses;
  };
  mlp<policy::cuda> net(batch, 8);
  optimizer opt = Case::make();
  run(net, opt, 0, 3);
  io::save_checkpoint(path, net, opt, {.epoch = 0, .step = 3});
  const auto uninterrupted = run(net, opt, 3, 6);

  mlp<policy::cuda> resumed(batch, 99);
  optimizer resumed_opt = Case::make();
  const auto state = io::load_checkpoint(path, resumed, resumed_opt);
  CHECK(state.step == 3);
  CHECK(resumed_opt.state().at(0).step == 3);
  // Same weights, optimizer state and kernels: the same bits.
  check_identical(run(resumed, resumed_opt, 3, 6), uninterrupted, "losses after resuming");
  std::filesystem::remove(path);
}
