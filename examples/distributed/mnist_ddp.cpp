// The MNIST MLP (Flatten -> Dense 128 ReLU -> Dense 10, Adam 1e-3) trained data-parallel over MPI: each rank trains on
// its shard of every epoch (distributed_sampler) with its share of each batch, and the gradients are averaged over the
// ranks before every step (static_data_parallel, or dynamic_data_parallel with --mode dynamic). Rank 0 prints.
//
//   mpirun -np 2 build/examples/distributed/mnist_ddp [--mode static|dynamic] [--epochs 5] [--batch-size 64]
//                                                     [--data DIR] [--threads 1] [--seed 42]
// --batch-size is the whole batch, split evenly across the ranks; --threads is per rank. As root, and with more ranks
// than cores, Open MPI also wants --allow-run-as-root and --oversubscribe.
#include <chrono>
#include <cstdio>
#include <span>
#include <string>

#include "../common.hpp"
#include "../mnist_common.hpp"
#include "kiln/distributed.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {

// Predictions of samples [first, first + count) of the test set: correct ones counted.
template <class Predict>
double count_correct(const data::tensor_dataset<float, std::int64_t>& test, index_t first, index_t count,
                     Predict&& predict) {
  if (count <= 0) return 0;
  Tensor<float> out = predict(test.features().rows(first, count));
  double correct = 0;
  for (index_t i = 0; i < count; ++i) {
    index_t best = 0;
    for (index_t c = 1; c < 10; ++c)
      if (out.at(i, c) > out.at(i, best)) best = c;
    correct += best == test.labels()[first + i];
  }
  return correct;
}

struct epoch_sums {
  double loss = 0, batches = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--batch-size", "--data", "--epochs", "--mode", "--seed"});
  const std::string mode = flags.get("--mode", "static");
  const int epochs = static_cast<int>(flags.get_int("--epochs", 5));
  const index_t global_batch = flags.get_int("--batch-size", 64);
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const auto seed = static_cast<std::uint64_t>(flags.get_int("--seed", 42));
  if (mode != "static" && mode != "dynamic") fail("--mode: expected static or dynamic, found '", mode, "'");

  distributed::process_group group;
  const int rank = group.rank(), world = group.size();
  if (global_batch < world || global_batch % world)
    fail("--batch-size: expected a multiple of the ", world, " ranks, found ", global_batch);
  const index_t local_batch = global_batch / world;
  set_num_threads(threads);
  auto mnist = examples::load_mnist_data(flags.get("--data", ""));
  if (rank == 0)
    std::printf("MNIST from %s: %lld training and %lld test images; %s mode, %d ranks of %d thread%s, batch %lld "
                "(%lld per rank)\n",
                mnist.dir.c_str(), static_cast<long long>(mnist.train.size()),
                static_cast<long long>(mnist.test.size()), mode.c_str(), world, threads, threads == 1 ? "" : "s",
                static_cast<long long>(global_batch), static_cast<long long>(local_batch));

  // This rank's shard of every epoch, batched in order (the sampler shuffles).
  distributed::shard_dataset shard(mnist.train,
                                   distributed::distributed_sampler(mnist.train.size(), rank, world, {.seed = seed}));
  data::data_loader loader(shard, {.batch_size = local_batch, .shuffle = false, .prefetch = 1});
  // Each rank evaluates its share of the test set; the correct predictions are summed.
  const index_t test_share = (mnist.test.size() + world - 1) / world;
  const index_t test_first = std::min(mnist.test.size(), rank * test_share);
  const index_t test_count = std::min(mnist.test.size() - test_first, test_share);

  // Trains one epoch with step(x, y) -> loss, then prints the epoch's loss and test accuracy (accuracy() counts this
  // rank's correct predictions) from rank 0.
  double step_seconds = 0, test_acc = 0;
  long long steps = 0;
  auto run_epoch = [&](int epoch, auto&& step, auto&& correct) {
    shard.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto start = std::chrono::steady_clock::now();
    epoch_sums sums;
    for (const auto& batch : loader.epoch(static_cast<std::uint64_t>(epoch))) {
      const auto t0 = std::chrono::steady_clock::now();
      sums.loss += step(batch.x, batch.y);
      step_seconds += examples::seconds_since(t0);
      sums.batches += 1;
      ++steps;
    }
    const double epoch_s = examples::seconds_since(start);
    double totals[3] = {sums.loss, sums.batches, correct()};
    group.all_reduce(std::span<double>(totals));
    test_acc = totals[2] / double(mnist.test.size());
    if (rank == 0)
      std::printf("epoch %d/%d: loss %.4f, test accuracy %.4f (%.1f s)\n", epoch + 1, epochs, totals[0] / totals[1],
                  test_acc, epoch_s);
  };

  const auto start = std::chrono::steady_clock::now();
  if (mode == "static") {
    examples::mnist_static_mlp net(local_batch, seed);
    distributed::static_data_parallel ddp(net, group);
    optim::Adam adam({.lr = 1e-3});
    for (int epoch = 0; epoch < epochs; ++epoch)
      run_epoch(
          epoch, [&](auto x, auto y) { return ddp.train_step(x, y, loss::cross_entropy{}, adam); },
          [&] {
            return count_correct(mnist.test, test_first, test_count, [&](auto x) { return net.predict(x); });
          });
  } else {
    auto model = examples::mnist_dynamic_mlp(seed);
    distributed::dynamic_data_parallel ddp(model, group);
    optim::Adam adam(model.parameters(), {.lr = 1e-3});
    for (int epoch = 0; epoch < epochs; ++epoch)
      run_epoch(
          epoch,
          [&](auto x, auto y) {
            adam.zero_grad();
            auto loss = nn::cross_entropy(model(nn::Variable::borrowing(x)), y.span());
            loss.backward();
            ddp.reduce_gradients();
            adam.step();
            return loss.item();
          },
          [&] {
            return count_correct(mnist.test, test_first, test_count, [&](auto x) {
              nn::no_grad guard;
              model.eval();
              Tensor<float> out = model(nn::Variable::borrowing(x)).tensor();
              model.train();
              return out;
            });
          });
  }
  const double train_s = examples::seconds_since(start);
  if (rank == 0)
    std::printf("RESULT example=mnist_ddp mode=%s ranks=%d threads=%d batch=%lld epochs=%d test_acc=%.4f train_s=%.3f "
                "step_us=%.2f\n",
                mode.c_str(), world, threads, static_cast<long long>(global_batch), epochs, test_acc, train_s,
                steps ? step_seconds * 1e6 / double(steps) : 0.0);
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "mnist_ddp: %s\n", e.what());
  return 1;
}
