// The parts of static mode's core: the workspace planned by liveness (static/workspace_plan.hpp), the fusion rules as
// a model reports them (static/fusion_rules.hpp, Sequential::fusions), and freezing by state_dict name
// (static/state.hpp). That a step gives the same bits with and without each fusion is checked where each layer is
// (test_static_gradients, test_cnn_layers, test_blocks).
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/train.hpp"
#include "same_training.hpp"
#include "kiln/static/workspace_plan.hpp"

using namespace kiln;

namespace {

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

// A small ResNet in the shape of PyTorch's: a stem, two stages of residual blocks (the second strided, with a
// shortcut), global average pooling and a head.
template <index_t C>
using basic_block = Residual<Conv2D<C, 3, conv_options{.padding = 1}>, BatchNorm2d<>, ReLU,
                             Conv2D<C, 3, conv_options{.padding = 1}>, BatchNorm2d<>>;
template <index_t C>
using down_block = Residual<Shortcut<Conv2D<C, 1, conv_options{.stride = 2}>, BatchNorm2d<>>,
                            Conv2D<C, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, ReLU,
                            Conv2D<C, 3, conv_options{.padding = 1}>, BatchNorm2d<>>;
using small_resnet = Sequential<policy::cpu, Input<1, 12, 12>, Conv2D<4, 3, conv_options{.padding = 1}>, BatchNorm2d<>,
                                ReLU, basic_block<4>, ReLU, down_block<8>, ReLU, GlobalAvgPool2D, Flatten, Dense<3>>;

}  // namespace

TEST_CASE("plan_by_liveness: tensors live at the same moment never share memory; the others may") {
  random_generator rng(3);
  for (int round = 0; round < 200; ++round) {
    CAPTURE(round);
    std::vector<live_range> ranges(1 + rng.below(24));
    for (auto& r : ranges) {
      r.size = index_t(rng.below(100));
      r.first = int(rng.below(20));
      r.last = r.first + int(rng.below(10));
    }
    const auto layout = plan_by_liveness(ranges, 16);
    REQUIRE(layout.offsets.size() == ranges.size());
    REQUIRE(layout.peak <= layout.unshared);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].size == 0) continue;
      REQUIRE(layout.offsets[i] % 16 == 0);
      REQUIRE(layout.offsets[i] + ranges[i].size <= layout.peak);
      for (std::size_t j = i + 1; j < ranges.size(); ++j) {
        if (ranges[j].size == 0) continue;
        const bool meet = ranges[i].first <= ranges[j].last && ranges[j].first <= ranges[i].last;
        const bool overlap = layout.offsets[i] < layout.offsets[j] + ranges[j].size &&
                             layout.offsets[j] < layout.offsets[i] + ranges[i].size;
        REQUIRE_FALSE((meet && overlap));
      }
    }
    // A function of the list alone.
    REQUIRE(plan_by_liveness(ranges, 16).offsets == layout.offsets);
  }
  // Two tensors one after the other in time share their memory.
  const std::vector<live_range> apart{{64, 0, 1}, {64, 2, 3}};
  CHECK(plan_by_liveness(apart).peak == 64);
  const std::vector<live_range> together{{64, 0, 2}, {64, 2, 3}};
  CHECK(plan_by_liveness(together).peak == 128);
}

TEST_CASE("the workspace of a residual network is below the sum of its tensors, and training is unchanged by it") {
  small_resnet net(8, 1);
  CHECK(net.workspace_bytes() < net.unshared_workspace_bytes());
  MESSAGE("small ResNet, batch 8: workspace ", net.workspace_bytes(), " bytes planned, ", net.unshared_workspace_bytes(),
          " without sharing");
  // The model's output stays readable after a step (last_output reads it after the backward has reused memory).
  random_generator rng(5);
  Tensor<float> x(small_resnet::input_shape::batch_shape(8));
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels({8});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(3));
  optim::SGD opt({.lr = 0.01});
  net.train_step(x, labels, loss::cross_entropy{}, opt);
  const Tensor<float> after(net.last_output());
  // The same output as a forward in training mode would give from the parameters before the step: compare against a
  // copy that ran forward only.
  small_resnet before(8, 1);
  const auto out = before.forward(x);
  for (index_t i = 0; i < after.numel(); ++i) REQUIRE(after.data()[i] == out.data()[i]);
}

TEST_CASE("a model reports the fusions its rules make, and none with fused epilogues off") {
  using Cnn = Sequential<policy::cpu, Input<1, 8, 8>, Conv2D<4, 3>, ReLU, MaxPool2D<2>, Flatten, Dense<16, ReLU>,
                         Dense<3>>;
  Cnn net(64, 1);
  const auto fusions = net.fusions();
  for (const auto& line : fusions) MESSAGE(line);
  CHECK(mentions(fusions, "0 Conv2D"));
  CHECK(mentions(fusions, "activation into the layer before it (forward)"));
  CHECK(mentions(fusions, "1 ReLU + 2 MaxPool2D"));
  CHECK(mentions(fusions, "activation backward into the layer after it (backward)"));
  // Model::summary prints the workspace and the fusions under the table.
  std::ostringstream text;
  Model(net).summary(text);
  CHECK(text.str().find("planned by liveness") != std::string::npos);
  CHECK(text.str().find("Fused: 0 Conv2D") != std::string::npos);
  net.set_options({.fuse_epilogues = false});
  CHECK(net.fusions().empty());
}

TEST_CASE("freeze takes state_dict names: a module, a block, and clear errors for the rest") {
  using Net = Sequential<policy::cpu, Input<4>, Dense<8, ReLU>, Residual<Dense<8, Tanh>, Dense<8>>, Dense<3>>;
  Net net(4, 1);
  // Modules: 0 Linear, 1 ReLU, 2 the block ("2.body.0.weight"), 3 Linear.
  CHECK(net.state_dict()[2].first == "2.body.0.weight");
  net.freeze("2");
  CHECK(net.is_frozen(1));
  CHECK(net.is_frozen("2"));
  net.freeze("0");
  CHECK(net.is_frozen(0));
  net.unfreeze("0");
  CHECK_FALSE(net.is_frozen(0));
  CHECK(net.trainable_parameter_count() == Net::parameter_count() - (2 * (8 * 8 + 8)));
  CHECK_THROWS_WITH_AS(net.freeze("1"), doctest::Contains("expected the name of a module with parameters (0, 2, 3)"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(net.freeze("2.body.0"), doctest::Contains("is inside module '2'"), kiln::error);
  CHECK_THROWS_WITH_AS(net.freeze("9"), doctest::Contains("found '9'"), kiln::error);
  // Freezing by name steers the optimizer as freezing by position does.
  random_generator rng(2);
  Tensor<float> x({4, 4});
  for (auto& v : x.span()) v = rng.normal<float>();
  Tensor<std::int64_t> labels({4});
  for (auto& l : labels.span()) l = static_cast<std::int64_t>(rng.below(3));
  const auto frozen_before = Tensor<float>(net.state_dict()[2].second);
  optim::SGD opt({.lr = 0.1});
  net.train_step(x, labels, loss::cross_entropy{}, opt);
  const auto frozen_after = net.state_dict()[2].second;
  for (index_t i = 0; i < frozen_after.numel(); ++i) REQUIRE(frozen_after.data()[i] == frozen_before.data()[i]);
}

TEST_CASE("the rules run inside blocks too, with the bits of the unfused step") {
  using Block = Residual<Conv2D<4, 3, conv_options{.padding = 1}>, ReLU, Conv2D<4, 3, conv_options{.padding = 1}>>;
  using Net = Sequential<policy::cpu, Input<1, 6, 6>, Conv2D<4, 3, conv_options{.padding = 1}>, Block, ReLU,
                         MaxPool2D<2>, Flatten, Dense<3>>;
  Net fused(8, 4), unfused(8, 4, {.fuse_epilogues = false});
  const auto fusions = fused.fusions();
  for (const auto& line : fusions) MESSAGE(line);
  CHECK(mentions(fusions, "1.body.0 Conv2D"));
  CHECK(mentions(fusions, "1.body.1 ReLU + 1.body.2 Conv2D"));
  CHECK(mentions(fusions, "2 ReLU + 3 MaxPool2D"));
  CHECK(unfused.fusions().empty());
  optim::SGD a({.lr = 0.05, .momentum = 0.9}), b({.lr = 0.05, .momentum = 0.9});
  require_same_training(fused, a, unfused, b, 8, 9, 10);
}
