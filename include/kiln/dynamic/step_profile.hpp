// nn::train_step with a kiln::step_profile: a dynamic Sequential's training step, timed in the parts of a static
// model's profile (core/step_profile.hpp), so that one model trained both ways shows where dynamism costs.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/step_profile.hpp"
#include "kiln/dynamic/modules/sequential.hpp"
#include "kiln/dynamic/policy.hpp"
#include "kiln/dynamic/tape.hpp"
#include "kiln/dynamic/variable.hpp"

namespace kiln::nn {

namespace detail {
// Laps the profile's clock into the part that recorded each tape entry, as the backward walk finishes it.
class profile_timer final : public backward_observer {
 public:
  explicit profile_timer(step_profile& profile) : profile_(profile) {}
  void start() {
    dynamic_policy::synchronize();
    clock_.start();
  }
  // Adds the time since the previous lap to `slot`, once the policy's work so far has finished.
  void lap(double& slot) {
    dynamic_policy::synchronize();
    clock_.lap(slot);
  }
  // Entries of a child's forward carry its index; the loss's (recorded outside every child) carry -1.
  void entry_done(int owner) override {
    lap(owner >= 0 ? profile_.backward_seconds[static_cast<std::size_t>(owner)] : profile_.loss_seconds);
  }

 private:
  step_profile& profile_;
  kiln::detail::profile_clock clock_;
};
}  // namespace detail

// One training step of a dynamic Sequential, as the usual loop writes it,
//   optimizer.zero_grad(); Variable loss = loss_of(model(x)); loss.backward(); optimizer.step(); return loss.item();
// with the same ops in the same order (the same bits), and the time of each part added to `profile`: the optimizer's
// zero_grad and step (the update), each child's forward (its ops and their recording on the tape), the loss (its
// forward and its own entries' backward), each child's backward (the entries its forward recorded), and freeing the
// graph after the backward walk, which static mode does not have. An empty profile takes the children's
// descriptions; a profile of another model is an error.
template <class LossOf, class Optimizer>
float train_step(basic_sequential<float>& model, const Variable& x, LossOf&& loss_of, Optimizer& optimizer,
                 step_profile& profile) {
  std::vector<std::string> layers;
  layers.reserve(model.size());
  for (std::size_t i = 0; i < model.size(); ++i) layers.push_back(model[i].describe());
  kiln::detail::prepare_profile(profile, layers, "nn::train_step");
  auto& tape = detail::tape<float>::instance();
  detail::profile_timer timer(profile);
  struct stop_profiling {  // also when the step fails
    detail::tape<float>& tape;
    ~stop_profiling() {
      tape.set_owner(-1);
      tape.set_observer(nullptr);
    }
  } stop{tape};

  timer.start();
  optimizer.zero_grad();
  timer.lap(profile.update_seconds);
  Variable y = x;
  for (std::size_t i = 0; i < model.size(); ++i) {
    tape.set_owner(static_cast<int>(i));
    try {
      y = model[i].forward(y);  // as Sequential::forward, child by child
    } catch (const error& e) {
      fail("Sequential[", i, "] ", e.what());
    }
    timer.lap(profile.forward_seconds[i]);
  }
  tape.set_owner(-1);
  Variable loss = std::forward<LossOf>(loss_of)(y);
  timer.lap(profile.loss_seconds);
  tape.set_observer(&timer);
  loss.backward();
  tape.set_observer(nullptr);
  timer.lap(profile.graph_seconds);  // what the walk's last entry left: the graph's release
  optimizer.step();
  timer.lap(profile.update_seconds);
  ++profile.steps;
  return loss.item();
}

}  // namespace kiln::nn
