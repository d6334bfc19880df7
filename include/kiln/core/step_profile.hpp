// kiln::step_profile: where a model's training steps spend their time, layer by layer, in either mode.
//
// Static mode: Sequential::train_step(x, target, loss, optimizer, profile) runs the same step as train_step without
// it (the same kernels, the same bits) and adds the time of each part to the profile: staging the batch into the
// policy's memory, each layer's forward and backward, the loss with its gradient, and the optimizer's update. The
// parts are timed with a wall clock read between them, after Policy::synchronize(): on a GPU policy that waits for
// every kernel, so a profiled step runs without the overlap of an unprofiled one and takes longer; on the CPU it costs
// one clock read per part. With fused epilogues (static_options::fuse_epilogues), an activation that runs inside the
// layer before it is timed there, and its own forward shows the time of passing the output through (about zero); a
// backward that a layer takes into its own (a Dense layer's fused ReLU, taken in by the Dense layer above) is timed
// in that layer's.
//
// Dynamic mode: nn::train_step(model, x, loss_of, optimizer, profile) (dynamic/step_profile.hpp) fills the same parts
// for a dynamic Sequential's children, plus the graph's bookkeeping that static mode does not have. A model trained
// both ways gives two profiles of the same parts: the cost of dynamism, part by part.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln {

// Seconds per part of a training step, summed over `steps` profiled steps.
struct step_profile {
  std::vector<std::string> layers;  // the layers' descriptions, as summary() prints them
  std::vector<double> forward_seconds, backward_seconds;
  double staging_seconds = 0, loss_seconds = 0, update_seconds = 0;
  double graph_seconds = 0;  // dynamic mode: freeing the graph after the backward walk (static mode has none)
  long long steps = 0;

  // Mean microseconds per step.
  double per_step_us(double seconds) const { return steps > 0 ? seconds * 1e6 / double(steps) : 0.0; }
  double total_seconds() const {
    double total = staging_seconds + loss_seconds + update_seconds + graph_seconds;
    for (double s : forward_seconds) total += s;
    for (double s : backward_seconds) total += s;
    return total;
  }
  // Starts over (the layers stay).
  void reset() {
    std::fill(forward_seconds.begin(), forward_seconds.end(), 0.0);
    std::fill(backward_seconds.begin(), backward_seconds.end(), 0.0);
    staging_seconds = loss_seconds = update_seconds = graph_seconds = 0;
    steps = 0;
  }
  // A table of the mean microseconds per step of every part, and each part's share of the step.
  void print(std::ostream& out) const {
    const double total = total_seconds();
    int width = 36;  // wide enough for every part's name (a dynamic module's description can be long)
    for (const auto& layer : layers) width = std::max(width, static_cast<int>(layer.size()) + 9);
    auto row = [&](const std::string& part, double seconds) {
      char numbers[64];
      std::snprintf(numbers, sizeof numbers, " %10.2f us %6.1f%%\n", per_step_us(seconds),
                    total > 0 ? 100.0 * seconds / total : 0.0);
      const int padding = std::max(0, width - static_cast<int>(part.size()));
      out << "  " << part << std::string(static_cast<std::size_t>(padding), ' ') << numbers;
    };
    out << "step profile, mean over " << steps << " steps:\n";
    row("staging the batch", staging_seconds);
    for (std::size_t i = 0; i < layers.size(); ++i) row("forward  " + layers[i], forward_seconds[i]);
    row("loss and its gradient", loss_seconds);
    for (std::size_t i = layers.size(); i-- > 0;) row("backward " + layers[i], backward_seconds[i]);
    if (graph_seconds > 0) row("freeing the graph", graph_seconds);
    row("optimizer update", update_seconds);
    row("total", total);
  }
};

// Two profiles of one model, part against part (static against dynamic mode, or one build against another): the
// layers may differ in number (a static Dense<128, ReLU> is a dynamic Linear and ReLU), so each is summed over the
// forward, over the backward, and so on. Mean microseconds per step, and the second's time over the first's.
inline void print_comparison(std::ostream& out, const step_profile& first, const char* first_name,
                             const step_profile& second, const char* second_name) {
  auto sum = [](const std::vector<double>& v) {
    double total = 0;
    for (double s : v) total += s;
    return total;
  };
  char line[160];
  std::snprintf(line, sizeof line, "  %-26s %10s %10s %8s\n", "part, us per step", first_name, second_name, "ratio");
  out << line;
  auto row = [&](const char* part, double a, double b) {
    char ratio[32] = "-";
    if (a > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", b / a);
    std::snprintf(line, sizeof line, "  %-26s %10.2f %10.2f %8s\n", part, first.per_step_us(a), second.per_step_us(b),
                  ratio);
    out << line;
  };
  row("staging the batch", first.staging_seconds, second.staging_seconds);
  row("forward, all layers", sum(first.forward_seconds), sum(second.forward_seconds));
  row("loss and its gradient", first.loss_seconds, second.loss_seconds);
  row("backward, all layers", sum(first.backward_seconds), sum(second.backward_seconds));
  row("freeing the graph", first.graph_seconds, second.graph_seconds);
  row("optimizer update", first.update_seconds, second.update_seconds);
  row("total", first.total_seconds(), second.total_seconds());
}

namespace detail {
// The clock a profiled step reads between its parts: each lap adds the time since the previous one to a slot.
class profile_clock {
 public:
  void start() { last_ = std::chrono::steady_clock::now(); }
  void lap(double& slot) {
    const auto now = std::chrono::steady_clock::now();
    slot += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_;
};

// Makes `profile` fit a model with these layers: sized on first use, checked after.
inline void prepare_profile(step_profile& profile, const std::vector<std::string>& layers, const char* where) {
  if (profile.layers.empty() && profile.steps == 0) {
    profile.layers = layers;
    profile.forward_seconds.assign(layers.size(), 0.0);
    profile.backward_seconds.assign(layers.size(), 0.0);
    return;
  }
  if (profile.layers != layers || profile.forward_seconds.size() != layers.size() ||
      profile.backward_seconds.size() != layers.size())
    fail(where, ": expected a step_profile of this model's ", layers.size(),
         " layers (or a new one), found one of ", profile.layers.size(), " layers",
         profile.layers.empty() ? "" : " starting with " + profile.layers.front());
}
}  // namespace detail

}  // namespace kiln
