// Where a training step spends its time, in each mode: the ladder's top static rung (fused epilogues, flat
// parameters) and its dynamic rung (the caching allocator) on the ladder's workloads and batches, profiled part by
// part with kiln::step_profile (Sequential::train_step and nn::train_step): each layer's forward and backward, the
// loss, the optimizer's update, and in dynamic mode freeing the graph; then both modes' parts side by side.
//
//   step_profile [--threads N] [--workload mnist_mlp|wide_mlp|mnist_cnn|all] [--mode both|static|dynamic]
//                [--epochs 3] [--warm-batches] [--clip-norm C] [--data DIR]
//
// --warm-batches reads each batch once before its step, outside the profile, so that the step finds it in cache
// instead of memory: the first layer's forward then shows what reading the batch from memory cost.
// --clip-norm C: both modes' Adam clips the gradients' joint 2-norm to C, which the update's part then includes.
// The first pass over the batches warms up and is not counted; the profile is the mean over the others.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "../examples/common.hpp"
#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// The ladder's synthetic inputs for the wide MLP: standard normal values.
Tensor<float> random_tensor(shape s, random_generator& rng) {
  Tensor<float> t(s);
  for (auto& v : t.span()) v = rng.normal<float>();
  return t;
}

// Prints a profile and its RESULT lines.
void report(const char* name, const char* mode, const step_profile& profile, int threads, bool warm_batches) {
  std::printf("\n%s, %s mode, %d thread%s%s:\n", name, mode, threads, threads == 1 ? "" : "s",
              warm_batches ? ", each batch read before its step" : "");
  profile.print(std::cout);
  auto result = [&](const std::string& part, double seconds) {
    std::printf("RESULT bench=step_profile workload=%s mode=%s threads=%d warm_batches=%d part=\"%s\" us=%.3f\n",
                name, mode, threads, int(warm_batches), part.c_str(), profile.per_step_us(seconds));
  };
  result("staging", profile.staging_seconds);
  for (std::size_t i = 0; i < profile.layers.size(); ++i) {
    result("forward " + std::to_string(i) + " " + profile.layers[i], profile.forward_seconds[i]);
    result("backward " + std::to_string(i) + " " + profile.layers[i], profile.backward_seconds[i]);
  }
  result("loss", profile.loss_seconds);
  if (profile.graph_seconds > 0) result("graph", profile.graph_seconds);
  result("update", profile.update_seconds);
  result("total", profile.total_seconds());
}

// Trains the static `net` and the dynamic `model` (the same network, the same initial weights) over the batches
// `passes` times, the first uncounted, and prints both profiles. The modes alternate pass by pass, so that a shared
// machine's drift falls on both alike while each pass keeps its own model's parameters in cache.
template <class Net>
void profile_workload(const char* name, Net& net, nn::Sequential& model,
                      const std::vector<tensor_view<const float>>& xs,
                      const std::vector<tensor_view<const std::int64_t>>& ys, int passes, int threads,
                      bool warm_batches, const std::string& modes, double clip_norm) {
  const bool run_static = modes != "dynamic", run_dynamic = modes != "static";
  optim::Adam opt(optim::adam_options{.lr = 1e-3, .clip = {.norm = clip_norm}});
  optim::Adam dynamic_opt(model.parameters(), optim::adam_options{.lr = 1e-3, .clip = {.norm = clip_norm}});
  step_profile profile, dynamic_profile;
  volatile float sink = 0;
  auto warm = [&](std::size_t i) {
    if (!warm_batches) return;
    float sum = 0;  // one read per cache line
    for (std::size_t v = 0; v < xs[i].span().size(); v += 16) sum += xs[i].span()[v];
    sink = sum;
  };
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == 1) {
      profile.reset();
      dynamic_profile.reset();
    }
    if (run_static)
      for (std::size_t i = 0; i < xs.size(); ++i) {
        warm(i);
        net.train_step(xs[i], ys[i], loss::cross_entropy{}, opt, profile);
      }
    if (run_dynamic)
      for (std::size_t i = 0; i < xs.size(); ++i) {
        warm(i);
        nn::train_step(
            model, nn::Variable::borrowing(xs[i]),
            [&](const nn::Variable& out) { return nn::cross_entropy(out, ys[i].span()); }, dynamic_opt,
            dynamic_profile);
      }
  }
  (void)sink;
  if (run_static) report(name, "static", profile, threads, warm_batches);
  if (run_dynamic) report(name, "dynamic", dynamic_profile, threads, warm_batches);
  if (run_static && run_dynamic) {
    std::printf("\nstatic against dynamic mode:\n");
    print_comparison(std::cout, profile, "static", dynamic_profile, "dynamic");
  }
}

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--data", "--epochs", "--mode", "--warm-batches", "--workload", "--clip-norm"});
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const int passes = 1 + static_cast<int>(std::max<long long>(1, flags.get_int("--epochs", 3)));
  const std::string only = flags.get("--workload", "all");
  const bool warm = flags.has("--warm-batches");
  const std::string modes = flags.get("--mode", "both");
  const double clip_norm = flags.get_double("--clip-norm", 0.0);
  if (modes != "both" && modes != "static" && modes != "dynamic")
    throw kiln::error("expected --mode static, dynamic or both, found " + modes);
  set_num_threads(threads);
  std::printf("kiln step profile: %d thread%s; %s\n", threads, threads == 1 ? "" : "s",
              examples::products_description().c_str());
  if (clip_norm > 0)
    std::printf("Adam clips the gradients' joint 2-norm to %g (inside the update's part)\n", clip_norm);

  // The ladder's MNIST batches: one epoch in a seeded shuffled order, assembled before timing.
  std::vector<Tensor<float>> images;
  std::vector<Tensor<std::int64_t>> labels;
  if (only == "all" || only == "mnist_mlp" || only == "mnist_cnn") {
    auto dir = data::find_data_dir("mnist", flags.get("--data", ""));
    auto train =
        data::load_mnist(dir, data::split::train, {.scale = true, .mean = data::mnist_mean, .std = data::mnist_std});
    data::data_loader loader(train, {.batch_size = 64, .shuffle = true, .seed = 5});
    for (const auto& batch : loader.epoch(0)) {
      images.emplace_back(batch.x);
      labels.emplace_back(batch.y);
    }
  }
  std::vector<tensor_view<const std::int64_t>> ys;
  for (auto& y : labels) ys.push_back(y.view());

  if (only == "all" || only == "mnist_mlp") {
    std::vector<tensor_view<const float>> xs;
    for (auto& x : images) xs.push_back(x.view());
    Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>> net(64, 1);
    manual_seed(1);
    nn::Sequential model(nn::Flatten(), nn::Linear(784, 128), nn::ReLU(), nn::Linear(128, 10));
    profile_workload("mnist_mlp", net, model, xs, ys, passes, threads, warm, modes, clip_norm);
  }
  if (only == "all" || only == "wide_mlp") {
    random_generator rng(2024);
    std::vector<Tensor<float>> wide_x;
    std::vector<Tensor<std::int64_t>> wide_y;
    for (int i = 0; i < 8; ++i) {
      wide_x.push_back(random_tensor(shape{256, 784}, rng));
      wide_y.emplace_back(shape{256});
      for (auto& l : wide_y.back().span()) l = static_cast<std::int64_t>(rng.below(10));
    }
    std::vector<tensor_view<const float>> xs;
    std::vector<tensor_view<const std::int64_t>> wide_ys;
    for (int i = 0; i < 8; ++i) {
      xs.push_back(wide_x[std::size_t(i)].view());
      wide_ys.push_back(wide_y[std::size_t(i)].view());
    }
    Sequential<policy::cpu, Input<784>, Dense<1024, ReLU>, Dense<1024, ReLU>, Dense<10>> net(256, 1);
    manual_seed(1);
    nn::Sequential model(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 10));
    profile_workload("wide_mlp", net, model, xs, wide_ys, 1 + 4 * (passes - 1), threads, warm, modes, clip_norm);
  }
  if (only == "all" || only == "mnist_cnn") {
    // The ladder's CNN on the epoch's first 32 batches, as 1 x 28 x 28 images.
    const std::size_t count = std::min<std::size_t>(images.size(), 32);
    std::vector<Tensor<float>> cnn_images;
    std::vector<tensor_view<const float>> xs;
    for (std::size_t i = 0; i < count; ++i) {
      cnn_images.push_back(images[i]);
      cnn_images.back().reshape(shape{images[i].extent(0), 1, 28, 28});
    }
    for (auto& x : cnn_images) xs.push_back(x.view());
    std::vector<tensor_view<const std::int64_t>> cnn_ys(ys.begin(), ys.begin() + std::ptrdiff_t(count));
    Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3>, ReLU, Conv2D<64, 3>, ReLU, MaxPool2D<2>, Flatten,
               Dense<128, ReLU>, Dense<10>>
        net(64, 1);
    manual_seed(1);
    nn::Sequential model(nn::Conv2d(1, 32, 3), nn::ReLU(), nn::Conv2d(32, 64, 3), nn::ReLU(), nn::MaxPool2d(2),
                         nn::Flatten(), nn::Linear(9216, 128), nn::ReLU(), nn::Linear(128, 10));
    profile_workload("mnist_cnn", net, model, xs, cnn_ys, passes, threads, warm, modes, clip_norm);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "step_profile: %s\n", e.what());
  return 1;
}
