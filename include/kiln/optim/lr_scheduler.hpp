// Learning-rate schedulers for a manual training loop, as torch.optim.lr_scheduler: StepLR, MultiStepLR,
// ExponentialLR, CosineAnnealingLR, LinearLR, LambdaLR, OneCycleLR, SequentialLR and ReduceLROnPlateau. They set the
// rate of any optimizer through its lr() / set_lr() (optimizer_base's, or a fused trainer's: static/fused_mlp.hpp), so
// they serve static and dynamic mode alike.
//
//   optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   optim::CosineAnnealingLR schedule(opt, {.t_max = epochs});
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     train_one_epoch(model, opt);
//     schedule.step();  // after the epoch's optimizer steps, as in PyTorch
//   }
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

// What has a learning rate a scheduler can drive: an optimizer_base<T, Policy>, or a fused trainer's Adam.
template <class Optimizer>
concept has_learning_rate = requires(Optimizer& o, double lr) {
  { o.lr() } -> std::convertible_to<double>;
  o.set_lr(lr);
};

// The optimizer a scheduler drives, seen through its learning rate. It refers to the optimizer, which must outlive
// the scheduler.
class optimizer_lr {
 public:
  template <has_learning_rate Optimizer>
  optimizer_lr(Optimizer& optimizer)  // NOLINT: implicit, so that a scheduler takes the optimizer
      : optimizer_(&optimizer),
        get_([](const void* o) { return double(static_cast<const Optimizer*>(o)->lr()); }),
        set_([](void* o, double lr) { static_cast<Optimizer*>(o)->set_lr(lr); }) {}
  double get() const { return get_(optimizer_); }
  void set(double lr) const { set_(optimizer_, lr); }
  bool operator==(const optimizer_lr& other) const { return optimizer_ == other.optimizer_; }

 private:
  void* optimizer_;
  double (*get_)(const void*);
  void (*set_)(void*, double);
};

// What a scheduler needs to resume where it stopped (PyTorch's state_dict): the epochs stepped, and
// ReduceLROnPlateau's running state (zero, and unused, for the others). io::save_checkpoint keeps it by name.
struct lr_scheduler_state {
  long long last_epoch = 0;
  double best = 0;  // ReduceLROnPlateau: the best metric so far
  long long bad_epochs = 0;
  long long cooldown_left = 0;
};

// The base of every scheduler, for holding any of them: the optimizer, the base rate (the optimizer's when the
// scheduler was made), the epochs stepped (last_epoch, 0 once made) and the rate set last. Move-only: a copy would be
// a second scheduler stepping the same optimizer.
class lr_scheduler {
 public:
  virtual ~lr_scheduler() = default;
  lr_scheduler(const lr_scheduler&) = delete;
  lr_scheduler& operator=(const lr_scheduler&) = delete;
  lr_scheduler(lr_scheduler&&) = default;
  lr_scheduler& operator=(lr_scheduler&&) = default;

  // Advances one epoch (one batch for OneCycleLR) and sets the optimizer's rate.
  virtual void step() = 0;
  // The rate set last (PyTorch's get_last_lr()).
  double last_lr() const { return last_lr_; }
  // The state to resume from, and resuming: restore(state()) of a scheduler made as this one was puts it, and its
  // optimizer's rate, where this one is (ReduceLROnPlateau leaves the rate to the optimizer's own restore).
  virtual lr_scheduler_state state() const { return {last_epoch_, 0, 0, 0}; }
  void restore(const lr_scheduler_state& s) {
    if (s.last_epoch < 0 || s.last_epoch > max_saved_count)
      fail(name_, ": expected a saved last_epoch >= 0 and at most 2^48, found ", s.last_epoch);
    restore_checked(s);
  }
  // The largest count of epochs (batches, for OneCycleLR) a saved state may hold: beyond any training run, and far
  // enough below 2^63 that stepping on from it never overflows.
  static constexpr long long max_saved_count = 1LL << 48;
  long long last_epoch() const { return last_epoch_; }
  double base_lr() const { return base_lr_; }
  const char* name() const { return name_; }

 protected:
  lr_scheduler(optimizer_lr optimizer, const char* name)
      : optimizer_(optimizer), name_(name), base_lr_(optimizer.get()), last_lr_(base_lr_) {}
  // Moves to epoch and gives the optimizer its rate; refused before anything changes when the rate is no rate.
  void set_epoch_lr(long long epoch, double lr) {
    if (!(lr >= 0) || !std::isfinite(lr))
      fail(name_, ": expected a finite learning rate >= 0, found ", lr, " at epoch ", epoch);
    optimizer_.set(lr);
    last_epoch_ = epoch;
    last_lr_ = lr;
  }

  optimizer_lr optimizer_;
  const char* name_;
  double base_lr_;
  double last_lr_;
  long long last_epoch_ = 0;

 private:
  friend class SequentialLR;
  // Back to epoch 0: PyTorch's step(0), which SequentialLR makes at each milestone.
  virtual void restart() = 0;
  // SequentialLR's schedulers all count from the first one's base rate (what PyTorch's initial_lr gives them).
  virtual void rebase(double base_lr) { base_lr_ = base_lr; }
  // Goes to the saved epoch (last_epoch checked >= 0); refuses a state it cannot be in before changing anything.
  virtual void restore_checked(const lr_scheduler_state& s) = 0;
};

// A scheduler whose rate follows from the base rate and the epoch alone: PyTorch's closed forms. PyTorch's step()
// mostly chains from the optimizer's current rate instead (rate *= factor); the two agree to rounding (within 5e-15
// of each other over the fixtures' 30 epochs) unless something else changes the rate between steps: here that change
// does not carry over to the next step, in PyTorch it does.
class closed_form_scheduler : public lr_scheduler {
 public:
  void step() override { go_to(last_epoch_ + 1); }

 protected:
  using lr_scheduler::lr_scheduler;
  void go_to(long long epoch) { set_epoch_lr(epoch, lr_at(epoch)); }

 private:
  virtual double lr_at(long long epoch) const = 0;
  void restart() override { go_to(0); }
  void restore_checked(const lr_scheduler_state& s) override { go_to(s.last_epoch); }
};

// A closed-form scheduler and its settings, Options.
template <class Options>
class scheduler_with_options : public closed_form_scheduler {
 public:
  using options_type = Options;
  const options_type& options() const { return options_; }

 protected:
  scheduler_with_options(optimizer_lr optimizer, const char* name, options_type o)
      : closed_form_scheduler(optimizer, name), options_(std::move(o)) {}
  options_type options_;
};

namespace lr_detail {
// NaN fails too.
inline void require_positive(const char* scheduler, const char* what, double value) {
  if (!(value > 0) || !std::isfinite(value)) fail(scheduler, ": expected ", what, " > 0, found ", value);
}
inline void require_positive(const char* scheduler, const char* what, long long value) {
  if (value <= 0) fail(scheduler, ": expected ", what, " > 0, found ", value);
}
inline void require_milestones(const char* scheduler, const std::vector<long long>& milestones) {
  for (std::size_t i = 0; i < milestones.size(); ++i) {
    if (milestones[i] <= 0) fail(scheduler, ": expected milestones > 0, found ", milestones[i], " at index ", i);
    if (i > 0 && milestones[i] <= milestones[i - 1])
      fail(scheduler, ": expected increasing milestones, found ", milestones[i], " after ", milestones[i - 1],
           " at index ", i);
  }
}
}  // namespace lr_detail

// StepLR's settings: step_size has no default, as in PyTorch.
struct step_lr_options {
  long long step_size = 0;
  double gamma = 0.1;
};

// Multiplies the rate by gamma every step_size epochs: base_lr * gamma^(epoch / step_size).
class StepLR : public scheduler_with_options<step_lr_options> {
 public:
  StepLR(optimizer_lr optimizer, options_type o) : scheduler_with_options(optimizer, "StepLR", o) {
    lr_detail::require_positive(name_, "step_size", o.step_size);
    lr_detail::require_positive(name_, "gamma", o.gamma);
    go_to(0);
  }
  // The rate at an epoch; train::LearningRateScheduler::step uses it too.
  static double closed_form(double base_lr, long long epoch, const options_type& o) {
    return base_lr * std::pow(o.gamma, static_cast<double>(epoch / o.step_size));
  }

 private:
  double lr_at(long long epoch) const override { return closed_form(base_lr_, epoch, options_); }
};

// MultiStepLR's settings: milestones (epochs, increasing) have no default, as in PyTorch.
struct multi_step_lr_options {
  std::vector<long long> milestones{};
  double gamma = 0.1;
};

// Multiplies the rate by gamma at each milestone: base_lr * gamma^(milestones reached).
class MultiStepLR : public scheduler_with_options<multi_step_lr_options> {
 public:
  MultiStepLR(optimizer_lr optimizer, options_type o) : scheduler_with_options(optimizer, "MultiStepLR", std::move(o)) {
    lr_detail::require_milestones(name_, options_.milestones);
    lr_detail::require_positive(name_, "gamma", options_.gamma);
    go_to(0);
  }

 private:
  double lr_at(long long epoch) const override {
    const auto& m = options_.milestones;
    const auto reached = std::upper_bound(m.begin(), m.end(), epoch) - m.begin();
    return base_lr_ * std::pow(options_.gamma, static_cast<double>(reached));
  }
};

// ExponentialLR's settings: gamma has no default, as in PyTorch.
struct exponential_lr_options {
  double gamma = 0;
};

// Multiplies the rate by gamma every epoch: base_lr * gamma^epoch.
class ExponentialLR : public scheduler_with_options<exponential_lr_options> {
 public:
  ExponentialLR(optimizer_lr optimizer, options_type o) : scheduler_with_options(optimizer, "ExponentialLR", o) {
    lr_detail::require_positive(name_, "gamma", o.gamma);
    go_to(0);
  }

 private:
  double lr_at(long long epoch) const override {
    return base_lr_ * std::pow(options_.gamma, static_cast<double>(epoch));
  }
};

// CosineAnnealingLR's settings: t_max (PyTorch's T_max) has no default.
struct cosine_annealing_lr_options {
  long long t_max = 0;
  double eta_min = 0.0;
};

// Anneals the rate from base_lr to eta_min along half a cosine over t_max epochs; past t_max it rises again along the
// same cosine, as PyTorch's does (no restarts, no clamping).
class CosineAnnealingLR : public scheduler_with_options<cosine_annealing_lr_options> {
 public:
  CosineAnnealingLR(optimizer_lr optimizer, options_type o)
      : scheduler_with_options(optimizer, "CosineAnnealingLR", o) {
    lr_detail::require_positive(name_, "t_max", o.t_max);
    if (!(o.eta_min >= 0) || !std::isfinite(o.eta_min)) fail(name_, ": expected eta_min >= 0, found ", o.eta_min);
    go_to(0);
  }
  // The rate at an epoch; train::LearningRateScheduler::cosine uses it too.
  static double closed_form(double base_lr, long long epoch, const options_type& o) {
    const double angle = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(o.t_max);
    return o.eta_min + (base_lr - o.eta_min) * (1 + std::cos(angle)) / 2;
  }

 private:
  double lr_at(long long epoch) const override { return closed_form(base_lr_, epoch, options_); }
};

// LinearLR's settings, with PyTorch's defaults.
struct linear_lr_options {
  double start_factor = 1.0 / 3;
  double end_factor = 1.0;
  long long total_iters = 5;
};

// Scales the base rate by a factor going linearly from start_factor to end_factor over total_iters epochs, then
// holding: a warm-up (end_factor 1) or a linear decay.
class LinearLR : public scheduler_with_options<linear_lr_options> {
 public:
  explicit LinearLR(optimizer_lr optimizer, options_type o = {}) : scheduler_with_options(optimizer, "LinearLR", o) {
    if (!(o.start_factor > 0 && o.start_factor <= 1))
      fail(name_, ": expected start_factor in (0, 1], found ", o.start_factor);
    if (!(o.end_factor >= 0 && o.end_factor <= 1)) fail(name_, ": expected end_factor in [0, 1], found ", o.end_factor);
    lr_detail::require_positive(name_, "total_iters", o.total_iters);
    go_to(0);
  }

 private:
  double lr_at(long long epoch) const override {
    const auto& o = options_;
    const double done = static_cast<double>(std::min(o.total_iters, epoch));
    return base_lr_ * (o.start_factor + (o.end_factor - o.start_factor) * done / static_cast<double>(o.total_iters));
  }
};

// Sets the rate to base_lr * lr_lambda(epoch).
class LambdaLR : public closed_form_scheduler {
 public:
  using lambda_type = std::function<double(long long epoch)>;
  LambdaLR(optimizer_lr optimizer, lambda_type lr_lambda)
      : closed_form_scheduler(optimizer, "LambdaLR"), lambda_(std::move(lr_lambda)) {
    if (!lambda_) fail(name_, ": expected a function of the epoch, found an empty std::function");
    go_to(0);
  }

 private:
  double lr_at(long long epoch) const override { return base_lr_ * lambda_(epoch); }
  lambda_type lambda_;
};

// How OneCycleLR moves between two rates (PyTorch's anneal_strategy).
enum class annealing { cos, linear };

// OneCycleLR's settings, with PyTorch's defaults. The cycle lasts total_steps steps, or epochs * steps_per_epoch when
// total_steps is 0; max_lr has no default.
struct one_cycle_lr_options {
  double max_lr = 0;
  long long total_steps = 0;
  long long epochs = 0;
  long long steps_per_epoch = 0;
  double pct_start = 0.3;  // the part of the cycle spent rising to max_lr
  annealing anneal_strategy = annealing::cos;
  double div_factor = 25;         // the first rate is max_lr / div_factor
  double final_div_factor = 1e4;  // the last is that divided again by final_div_factor
  bool three_phase = false;       // back down to the first rate, then on to the last (the paper's schedule)
};

// The 1cycle policy (Smith & Topin, 2017), stepped after every batch: the rate rises from max_lr / div_factor to
// max_lr over pct_start of the cycle, then falls far below where it started. It sets the rate only: PyTorch's
// cycle_momentum (momentum or beta1 moving against the rate) is not done here. The base rate is max_lr / div_factor,
// not the optimizer's. As PyTorch, it allows total_steps steps after construction (the last one after the last batch)
// and refuses more.
class OneCycleLR : public scheduler_with_options<one_cycle_lr_options> {
 public:
  OneCycleLR(optimizer_lr optimizer, options_type o) : scheduler_with_options(optimizer, "OneCycleLR", o) {
    lr_detail::require_positive(name_, "max_lr", o.max_lr);
    if (o.total_steps != 0 || o.epochs <= 0 || o.steps_per_epoch <= 0) {
      if (o.total_steps <= 0)
        fail(name_, ": expected total_steps > 0, or epochs > 0 and steps_per_epoch > 0, found total_steps ",
             o.total_steps, ", epochs ", o.epochs, " and steps_per_epoch ", o.steps_per_epoch);
      total_steps_ = o.total_steps;
    } else {
      total_steps_ = o.epochs * o.steps_per_epoch;
    }
    if (!(o.pct_start >= 0 && o.pct_start <= 1)) fail(name_, ": expected pct_start in [0, 1], found ", o.pct_start);
    lr_detail::require_positive(name_, "div_factor", o.div_factor);
    lr_detail::require_positive(name_, "final_div_factor", o.final_div_factor);
    // PyTorch's phases, to the last rounding: each ends at a step (a fraction where pct_start makes one).
    const double initial = o.max_lr / o.div_factor, final_lr = initial / o.final_div_factor;
    const double total = static_cast<double>(total_steps_), rise_end = o.pct_start * total - 1;
    if (o.three_phase)
      phases_ = {{rise_end, initial, o.max_lr}, {2 * o.pct_start * total - 2, o.max_lr, initial},
                 {total - 1, initial, final_lr}};
    else
      phases_ = {{rise_end, initial, o.max_lr}, {total - 1, o.max_lr, final_lr}};
    base_lr_ = initial;
    go_to(0);
  }
  long long total_steps() const { return total_steps_; }

 private:
  struct phase {
    double end_step, start_lr, end_lr;
  };
  double lr_at(long long step) const override {
    if (step > total_steps_)
      fail(name_, ": expected at most total_steps = ", total_steps_, " steps, found step ", step);
    const double at = static_cast<double>(step);
    double start = 0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const phase& p = phases_[i];
      if (at <= p.end_step || i + 1 == phases_.size()) {
        const double pct = (at - start) / (p.end_step - start);
        // The step after the last batch lies past the last phase, where linear annealing overshoots the final rate,
        // below zero when that is small: the optimizer takes no negative rate, so it stops at 0 (PyTorch's goes
        // negative).
        return std::max(0.0, anneal(p.start_lr, p.end_lr, pct));
      }
      start = p.end_step;
    }
    return 0;  // not reached: the last phase takes every step
  }
  double anneal(double start, double end, double pct) const {
    if (options_.anneal_strategy == annealing::linear) return (end - start) * pct + start;
    return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
  }
  void rebase(double) override {}  // its rates come from max_lr, whatever it follows

  long long total_steps_ = 0;
  std::vector<phase> phases_;
};

// Whether ReduceLROnPlateau's metric improves by going down (a loss) or up (an accuracy).
enum class plateau_mode { min, max };
// Whether an improvement must beat the best by threshold times the best (rel) or by threshold itself (abs).
enum class plateau_threshold { rel, abs };

// ReduceLROnPlateau's settings, with PyTorch's defaults.
struct reduce_lr_on_plateau_options {
  plateau_mode mode = plateau_mode::min;
  double factor = 0.1;
  long long patience = 10;
  double threshold = 1e-4;
  plateau_threshold threshold_mode = plateau_threshold::rel;
  long long cooldown = 0;
  double min_lr = 0.0;
  double eps = 1e-8;  // a reduction smaller than this is skipped
};

// Multiplies the rate by factor (down to min_lr) when the metric given to step(metric) has not improved for more
// than patience epochs, then waits cooldown epochs before counting again. It reads the optimizer's current rate, so
// it reduces whatever rate was set last. A NaN metric counts as no improvement, as in PyTorch.
class ReduceLROnPlateau : public lr_scheduler {
 public:
  using options_type = reduce_lr_on_plateau_options;
  explicit ReduceLROnPlateau(optimizer_lr optimizer, options_type o = {})
      : lr_scheduler(optimizer, "ReduceLROnPlateau"), options_(o) {
    if (!(o.factor > 0 && o.factor < 1)) fail(name_, ": expected factor in (0, 1), found ", o.factor);
    if (o.patience < 0) fail(name_, ": expected patience >= 0, found ", o.patience);
    if (!(o.threshold >= 0) || !std::isfinite(o.threshold))
      fail(name_, ": expected threshold >= 0, found ", o.threshold);
    if (o.cooldown < 0) fail(name_, ": expected cooldown >= 0, found ", o.cooldown);
    if (!(o.min_lr >= 0) || !std::isfinite(o.min_lr)) fail(name_, ": expected min_lr >= 0, found ", o.min_lr);
    if (!(o.eps >= 0)) fail(name_, ": expected eps >= 0, found ", o.eps);
    best_ = worst();
  }
  // Ends an epoch whose monitored quantity was metric.
  void step(double metric) {
    ++last_epoch_;
    if (improves(metric)) {
      best_ = metric;
      bad_epochs_ = 0;
    } else {
      ++bad_epochs_;
    }
    if (cooldown_left_ > 0) {
      --cooldown_left_;
      bad_epochs_ = 0;  // bad epochs in the cooldown do not count
    }
    if (bad_epochs_ > options_.patience) {
      const double old_lr = optimizer_.get(), new_lr = std::max(old_lr * options_.factor, options_.min_lr);
      if (old_lr - new_lr > options_.eps) optimizer_.set(new_lr);
      cooldown_left_ = options_.cooldown;
      bad_epochs_ = 0;
    }
    last_lr_ = optimizer_.get();
  }
  lr_scheduler_state state() const override { return {last_epoch_, best_, bad_epochs_, cooldown_left_}; }
  // There is no plateau without a metric (PyTorch's step() raises too).
  void step() override { fail(name_, ": expected step(metric) with the monitored quantity, found step()"); }
  // The best metric so far (+-infinity before the first step), and the epochs since it without improvement.
  double best() const { return best_; }
  long long num_bad_epochs() const { return bad_epochs_; }
  bool in_cooldown() const { return cooldown_left_ > 0; }
  const options_type& options() const { return options_; }

 private:
  double worst() const {
    const double inf = std::numeric_limits<double>::infinity();
    return options_.mode == plateau_mode::min ? inf : -inf;
  }
  // PyTorch's is_better, term for term.
  bool improves(double metric) const {
    const auto& o = options_;
    const bool relative = o.threshold_mode == plateau_threshold::rel;
    if (o.mode == plateau_mode::min)
      return relative ? metric < best_ * (1 - o.threshold) : metric < best_ - o.threshold;
    return relative ? metric > best_ * (o.threshold + 1) : metric > best_ + o.threshold;
  }
  void restart() override { step(); }  // not reached: SequentialLR refuses it
  void restore_checked(const lr_scheduler_state& s) override {
    if (s.bad_epochs < 0 || s.bad_epochs > max_saved_count || s.cooldown_left < 0 ||
        s.cooldown_left > options_.cooldown || std::isnan(s.best))
      fail(name_, ": expected a saved state with bad_epochs in [0, 2^48], cooldown_left in [0, ", options_.cooldown,
           "] (the cooldown option) and a best metric, found ", s.bad_epochs, ", ", s.cooldown_left, " and ", s.best);
    last_epoch_ = s.last_epoch;
    best_ = s.best;
    bad_epochs_ = s.bad_epochs;
    cooldown_left_ = s.cooldown_left;
    last_lr_ = optimizer_.get();
  }

  options_type options_;
  double best_ = 0;
  long long bad_epochs_ = 0;
  long long cooldown_left_ = 0;
};

// Runs one scheduler after another: schedulers[i + 1] takes over at epoch milestones[i], from its own epoch 0 (e.g. a
// LinearLR warm-up, then CosineAnnealingLR). Every scheduler counts from the base rate the optimizer had before the
// first was made (OneCycleLR from its max_lr), as PyTorch's SequentialLR. The schedulers are moved in:
//   optim::SequentialLR schedule(opt, {optim::LinearLR(opt, {.start_factor = 0.1, .total_iters = 5}),
//                                      optim::CosineAnnealingLR(opt, {.t_max = 45})}, {5});
class SequentialLR : public lr_scheduler {
 public:
  // One scheduler of the list, taken from a temporary (or std::move).
  class entry {
   public:
    template <class S>
      requires std::derived_from<S, lr_scheduler>
    entry(S&& scheduler) : scheduler_(std::make_shared<S>(std::forward<S>(scheduler))) {}  // NOLINT: implicit

   private:
    friend class SequentialLR;
    std::shared_ptr<lr_scheduler> scheduler_;
  };

  SequentialLR(optimizer_lr optimizer, std::vector<entry> schedulers, std::vector<long long> milestones)
      : lr_scheduler(optimizer, "SequentialLR"), milestones_(std::move(milestones)) {
    if (schedulers.empty()) fail(name_, ": expected at least one scheduler, found none");
    if (milestones_.size() != schedulers.size() - 1)
      fail(name_, ": expected one milestone fewer than schedulers, found ", schedulers.size(), " schedulers and ",
           milestones_.size(), " milestones");
    lr_detail::require_milestones(name_, milestones_);
    for (std::size_t i = 0; i < schedulers.size(); ++i) {
      const lr_scheduler& s = *schedulers[i].scheduler_;
      if (dynamic_cast<const ReduceLROnPlateau*>(&s))
        fail(name_, ": expected schedulers stepped without a metric, found ReduceLROnPlateau at index ", i);
      if (!(s.optimizer_ == optimizer_))
        fail(name_, ": expected every scheduler to drive the optimizer given to SequentialLR, found ", s.name(),
             " at index ", i, " driving another");
      schedulers_.push_back(std::move(schedulers[i].scheduler_));
    }
    // Each later scheduler was made after the first had already set its own rate, and took that as its base.
    base_lr_ = schedulers_.front()->base_lr();
    for (auto& s : schedulers_) s->rebase(base_lr_);
    restart();
  }

  void step() override {
    const long long epoch = last_epoch_ + 1;
    const auto next = std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
    lr_scheduler& s = *schedulers_[static_cast<std::size_t>(next)];
    if (next > 0 && milestones_[static_cast<std::size_t>(next - 1)] == epoch)
      s.restart();
    else
      s.step();
    last_epoch_ = epoch;
    last_lr_ = s.last_lr();
  }
  const std::vector<long long>& milestones() const { return milestones_; }

 private:
  void restart() override {
    schedulers_.front()->restart();
    last_epoch_ = 0;
    last_lr_ = schedulers_.front()->last_lr();
  }
  void rebase(double base_lr) override {
    base_lr_ = base_lr;
    for (auto& s : schedulers_) s->rebase(base_lr);
  }
  // The scheduler in charge at the epoch, at its own epoch: epoch - the milestone where it took over.
  void restore_checked(const lr_scheduler_state& s) override {
    const auto index = std::upper_bound(milestones_.begin(), milestones_.end(), s.last_epoch) - milestones_.begin();
    const long long start = index > 0 ? milestones_[static_cast<std::size_t>(index - 1)] : 0;
    lr_scheduler& in_charge = *schedulers_[static_cast<std::size_t>(index)];
    in_charge.restore_checked({s.last_epoch - start, 0, 0, 0});
    last_epoch_ = s.last_epoch;
    last_lr_ = in_charge.last_lr();
  }

  std::vector<std::shared_ptr<lr_scheduler>> schedulers_;
  std::vector<long long> milestones_;
};

}  // namespace kiln::optim
