// Data-parallel training over MPI when the ranks disagree, run as two ranks (tests/distributed/CMakeLists.txt): a model
// whose size or shapes differ across the ranks, and a rank that stops early, each give a clear kiln::error instead of
// a hang. The early stop is the last test case: the rank left waiting cannot use its group afterwards.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "kiln/distributed.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace dist = kiln::distributed;

namespace {

using namespace std::chrono_literals;
constexpr auto short_timeout = 1500ms;

template <index_t Hidden>
using hidden_net = Sequential<policy::cpu, Input<8>, Dense<Hidden, ReLU>, Dense<3>>;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Making a static trainer for this rank's model: the error it gives, or "" when it gives none.
template <class Net>
std::string static_trainer_error(dist::process_group& group) {
  Net net(4, 1);
  try {
    dist::static_data_parallel ddp(net, group);
  } catch (const kiln::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a static model whose size differs across the ranks: a clear error on every rank") {
  dist::process_group group;
  const auto start = std::chrono::steady_clock::now();
  const std::string error =
      group.rank() == 0 ? static_trainer_error<hidden_net<16>>(group) : static_trainer_error<hidden_net<17>>(group);
  // 8 * 16 + 16 + 16 * 3 + 3 = 195 values and 8 * 17 + 17 + 17 * 3 + 3 = 207, each layer padded to 16 floats.
  CHECK(error == "process_group: expected every rank to have the same number of parameter values (the model's flat "
                 "buffer, with padding), found rank 0 has 208, rank 1 has 224 (seen from rank " +
                     std::to_string(group.rank()) + " of 2)");
  // The check is a collective every rank joins, so the error comes at once, not after the timeout (60 s here).
  CHECK(seconds_since(start) < 10.0);
  CHECK(!group.failed());  // and the group goes on
  group.barrier();
}

TEST_CASE("a static model whose shapes differ across the ranks, with the same size: a clear error on every rank") {
  dist::process_group group;
  // 8 * 16 + 16 + 16 * 3 + 3 values either way, in layers of other shapes.
  using first = Sequential<policy::cpu, Input<8>, Dense<16, ReLU>, Dense<3>>;
  using second = Sequential<policy::cpu, Input<16>, Dense<8, ReLU>, Dense<3, ReLU>, Dense<3>>;
  const std::string error =
      group.rank() == 0 ? static_trainer_error<first>(group) : static_trainer_error<second>(group);
  CHECK(error.find("expected every rank to have the same") != std::string::npos);
  CHECK(error.find("rank 0 has") != std::string::npos);
  CHECK(error.find("rank 1 has") != std::string::npos);
}

TEST_CASE("a dynamic model whose shapes differ across the ranks: a clear error on every rank") {
  dist::process_group group;
  // Linear(6, 8) and Linear(7, 7) hold 56 values each, in tensors of other shapes.
  auto model = group.rank() == 0 ? nn::Sequential(nn::Linear(6, 8)) : nn::Sequential(nn::Linear(7, 7));
  CHECK_THROWS_WITH_AS(dist::dynamic_data_parallel(model, group),
                       doctest::Contains("expected every rank to have the same fingerprint of the parameter names and "
                                         "shapes, found rank 0 has"),
                       kiln::error);
  auto wider = group.rank() == 0 ? nn::Sequential(nn::Linear(6, 8)) : nn::Sequential(nn::Linear(6, 9));
  const std::string wider_error = "process_group: expected every rank to have the same number of parameter values "
                                  "that require grad, found rank 0 has 56, rank 1 has 63 (seen from rank " +
                                  std::to_string(group.rank()) + " of 2)";
  CHECK_THROWS_WITH_AS(dist::dynamic_data_parallel(wider, group), wider_error.c_str(), kiln::error);
}

TEST_CASE("a rank that stops early: a clear error on the other within the timeout") {
  set_num_threads(1);
  dist::process_group group({.timeout = short_timeout});
  hidden_net<16> net(4, 1);
  dist::static_data_parallel ddp(net, group);
  optim::SGD sgd({.lr = 0.1});
  Tensor<float> x(shape{4, 8}, 0.5f);
  Tensor<std::int64_t> y(shape{4}, 1);
  // Rank 1 runs out of batches after two steps and leaves; rank 0 goes on to a third, whose one bucket (the whole
  // flat buffer of 208 values: 144 and 51, each layer padded to 16) never completes.
  for (int step = 0; step < 2; ++step) ddp.train_step(x.view(), y.view(), loss::cross_entropy{}, sgd);
  if (group.rank() == 1) return;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(ddp.train_step(x.view(), y.view(), loss::cross_entropy{}, sgd),
                       doctest::Contains("gradient bucket of 208 values (832 bytes) did not complete within the "
                                         "timeout of 1.5 s on rank 0 of 2: a peer exited early"),
                       kiln::error);
  const double waited = seconds_since(start);
  CHECK(waited >= 1.5);
  CHECK(waited < 5.0);
  CHECK(group.failed());
  CHECK_THROWS_WITH_AS(group.barrier(),
                       doctest::Contains("cannot run barrier on rank 0: an earlier operation failed (gradient bucket "
                                         "of 208 values (832 bytes) timed out)"),
                       kiln::error);
}
