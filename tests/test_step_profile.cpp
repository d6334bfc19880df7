// kiln::step_profile: a profiled training step is the same step, and its time lands in the right parts, in static mode
// (Sequential::train_step) and in dynamic mode (nn::train_step).
#include <doctest/doctest.h>

#include <cstring>
#include <sstream>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

namespace {
using Net = Sequential<policy::cpu, Input<6, 6>, Flatten, Dense<16, ReLU>, Dense<4>>;

struct batch {
  Tensor<float> x{shape{8, 6, 6}};
  Tensor<std::int64_t> y{shape{8}};
  explicit batch(std::uint64_t seed) {
    random_generator rng(seed);
    for (auto& v : x.span()) v = rng.normal<float>();
    for (auto& l : y.span()) l = static_cast<std::int64_t>(rng.below(4));
  }
};
}  // namespace

TEST_CASE("a profiled step trains exactly as an unprofiled one") {
  Net plain(8, 3), profiled(8, 3);
  optim::Adam plain_opt({.lr = 1e-2}), profiled_opt({.lr = 1e-2});
  step_profile profile;
  for (std::uint64_t s = 0; s < 5; ++s) {
    batch b(s);
    const float expected = plain.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, plain_opt);
    const float found = profiled.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, profiled_opt, profile);
    CHECK(std::memcmp(&expected, &found, sizeof(float)) == 0);
  }
  auto a = plain.parameter_values(), b = profiled.parameter_values();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("a step profile names the model's layers and times each part") {
  Net net(8, 3);
  optim::Adam opt({.lr = 1e-2});
  step_profile profile;
  for (std::uint64_t s = 0; s < 4; ++s) {
    batch b(s);
    net.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, opt, profile);
  }
  CHECK(profile.steps == 4);
  auto rows = Net::summary_rows();
  REQUIRE(profile.layers.size() == rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) CHECK(profile.layers[i] == rows[i].name);
  REQUIRE(profile.forward_seconds.size() == rows.size());
  REQUIRE(profile.backward_seconds.size() == rows.size());
  // The Dense layers compute something forward and backward, and Adam updates: each took some time.
  for (std::size_t i = 1; i < rows.size(); ++i) {
    CHECK(profile.forward_seconds[i] > 0);
    CHECK(profile.backward_seconds[i] > 0);
  }
  CHECK(profile.loss_seconds > 0);
  CHECK(profile.update_seconds > 0);
  double sum = profile.staging_seconds + profile.loss_seconds + profile.update_seconds;
  for (std::size_t i = 0; i < rows.size(); ++i) sum += profile.forward_seconds[i] + profile.backward_seconds[i];
  CHECK(profile.total_seconds() == doctest::Approx(sum));
  CHECK(profile.per_step_us(profile.update_seconds) == doctest::Approx(profile.update_seconds * 1e6 / 4));

  std::ostringstream table;
  profile.print(table);
  CHECK(table.str().find("forward  " + rows[1].name) != std::string::npos);
  CHECK(table.str().find("backward " + rows[2].name) != std::string::npos);
  CHECK(table.str().find("optimizer update") != std::string::npos);

  profile.reset();
  CHECK(profile.steps == 0);
  CHECK(profile.total_seconds() == 0);
  CHECK(profile.layers.size() == rows.size());
}

TEST_CASE("a step profile of another model is refused, and a failed step stops the timing") {
  Net net(8, 3);
  Sequential<policy::cpu, Input<6, 6>, Flatten, Dense<4>> other(8, 3);
  optim::Adam opt({.lr = 1e-2}), other_opt({.lr = 1e-2});
  step_profile profile;
  batch b(1);
  net.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, opt, profile);
  CHECK_THROWS_WITH_AS(other.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, other_opt, profile),
                       doctest::Contains("step_profile of this model's 2 layers"), kiln::error);
  CHECK(profile.steps == 1);

  // A label out of range fails inside the profiled step; the model must not keep timing into the profile after.
  Tensor<std::int64_t> bad(shape{8}, std::int64_t{7});
  CHECK_THROWS_AS(net.train_step(b.x.view(), bad.view(), loss::cross_entropy{}, opt, profile), kiln::error);
  const step_profile before = profile;
  net.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, opt);
  CHECK(profile.steps == before.steps);
  CHECK(profile.update_seconds == before.update_seconds);
  CHECK(profile.forward_seconds == before.forward_seconds);
}

namespace {
// The dynamic twin of Net (the same initial weights as Net(8, 3)).
nn::Sequential dynamic_net() {
  kiln::manual_seed(3);
  return nn::Sequential(nn::Flatten(), nn::Linear(36, 16), nn::ReLU(), nn::Linear(16, 4));
}
}  // namespace

TEST_CASE("a profiled dynamic step trains exactly as the usual loop, and as the static model") {
  auto plain = dynamic_net(), profiled = dynamic_net();
  Net static_net(8, 3);
  optim::Adam plain_opt(plain.parameters(), {.lr = 1e-2}), profiled_opt(profiled.parameters(), {.lr = 1e-2});
  optim::Adam static_opt({.lr = 1e-2});
  step_profile profile;
  for (std::uint64_t s = 0; s < 5; ++s) {
    batch b(s);
    plain_opt.zero_grad();
    nn::Variable loss = nn::cross_entropy(plain(nn::Variable(b.x)), b.y);
    loss.backward();
    plain_opt.step();
    const float expected = loss.item();
    const float found = nn::train_step(
        profiled, nn::Variable(b.x), [&](const nn::Variable& out) { return nn::cross_entropy(out, b.y); },
        profiled_opt, profile);
    const float static_loss = static_net.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, static_opt);
    CHECK(std::memcmp(&expected, &found, sizeof(float)) == 0);
    CHECK(std::memcmp(&static_loss, &found, sizeof(float)) == 0);
  }
  auto a = plain.parameters(), b = profiled.parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].tensor(), y = b[i].tensor();
    CHECK(std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.numel()) * sizeof(float)) == 0);
  }
  CHECK(nn::tape_size() == 0);
}

TEST_CASE("a dynamic step profile names the children and times each part, the graph's release included") {
  auto net = dynamic_net();
  optim::Adam opt(net.parameters(), {.lr = 1e-2});
  step_profile profile;
  for (std::uint64_t s = 0; s < 4; ++s) {
    batch b(s);
    nn::train_step(net, nn::Variable(b.x), [&](const nn::Variable& out) { return nn::cross_entropy(out, b.y); }, opt,
                   profile);
  }
  CHECK(profile.steps == 4);
  REQUIRE(profile.layers.size() == 4);
  CHECK(profile.layers[1] == "Linear(in_features=36, out_features=16)");
  CHECK(profile.layers[2] == "ReLU()");
  // Every child computes; all but Flatten, whose input needs no gradient, record something to back-propagate. The
  // loss, the graph and Adam take time too.
  for (std::size_t i = 0; i < 4; ++i) CHECK(profile.forward_seconds[i] > 0);
  CHECK(profile.backward_seconds[0] == 0);
  for (std::size_t i = 1; i < 4; ++i) CHECK(profile.backward_seconds[i] > 0);
  CHECK(profile.loss_seconds > 0);
  CHECK(profile.graph_seconds > 0);
  CHECK(profile.update_seconds > 0);
  std::ostringstream table;
  profile.print(table);
  CHECK(table.str().find("backward Linear(in_features=16, out_features=4)") != std::string::npos);
  CHECK(table.str().find("freeing the graph") != std::string::npos);
  // Static profiles have no such part, and do not print it.
  Net static_net(8, 3);
  optim::Adam static_opt({.lr = 1e-2});
  step_profile static_profile;
  batch b(9);
  static_net.train_step(b.x.view(), b.y.view(), loss::cross_entropy{}, static_opt, static_profile);
  std::ostringstream static_table;
  static_profile.print(static_table);
  CHECK(static_table.str().find("freeing the graph") == std::string::npos);
}

TEST_CASE("a dynamic step profile of another model is refused, and a failed step stops the profiling") {
  auto net = dynamic_net();
  optim::Adam opt(net.parameters(), {.lr = 1e-2});
  step_profile profile;
  batch b(2);
  auto loss_of = [&](const nn::Variable& out) { return nn::cross_entropy(out, b.y); };
  nn::train_step(net, nn::Variable(b.x), loss_of, opt, profile);
  kiln::manual_seed(3);
  nn::Sequential other(nn::Flatten(), nn::Linear(36, 4));
  optim::Adam other_opt(other.parameters(), {.lr = 1e-2});
  CHECK_THROWS_WITH_AS(nn::train_step(other, nn::Variable(b.x), loss_of, other_opt, profile),
                       doctest::Contains("nn::train_step: expected a step_profile of this model's 2 layers"),
                       kiln::error);
  // A wrong input fails in a child's forward, named as Sequential names it; the tape stops attributing entries.
  Tensor<float> wrong(shape{8, 35}, 0.5f);
  CHECK_THROWS_WITH_AS(nn::train_step(net, nn::Variable(wrong), loss_of, opt, profile),
                       doctest::Contains("Sequential[1]"), kiln::error);
  const step_profile before = profile;
  opt.zero_grad();
  nn::Variable loss = loss_of(net(nn::Variable(b.x)));
  loss.backward();
  opt.step();
  CHECK(profile.steps == before.steps);
  CHECK(profile.backward_seconds == before.backward_seconds);
  CHECK(profile.loss_seconds == before.loss_seconds);
}
