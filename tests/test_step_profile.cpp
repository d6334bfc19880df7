// kiln::step_profile: a profiled training step is the same step, and its time lands in the right parts.
#include <doctest/doctest.h>

#include <cstring>
#include <sstream>

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
