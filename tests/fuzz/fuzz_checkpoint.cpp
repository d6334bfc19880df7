// libFuzzer target: load_checkpoint over an arbitrary file, into a static model with each optimizer kiln has (Adam,
// AdamW, SGD with momentum, RMSprop, Adagrad) and into a dynamic model with Adam, each after a step so that its
// optimizer has state. A refused load must leave model and optimizer bit for bit as they were (what save_checkpoint
// writes of them is unchanged). Each scheduler state a load returns is restored into each kind of scheduler and
// stepped on: a refused restore leaves the scheduler and its optimizer's rate unchanged.
#include <cstdint>
#include <string>

#include "fuzz_common.hpp"
#include "fuzz_models.hpp"
#include "kiln/io/checkpoint.hpp"

namespace {

using namespace kiln;

// What save_checkpoint writes of model and optimizer: equal exactly when both are bit for bit unchanged.
template <class M, class O>
std::string checkpoint_bytes(const M& model, O& optimizer) {
  const auto path = kiln_fuzz::scratch_dir() / "reference.ckpt";
  io::save_checkpoint(path, model, optimizer, {.epoch = 1, .step = 2});
  return kiln_fuzz::read_file(path);
}

template <class S, class O>
void restore_into(O& optimizer, const optim::lr_scheduler_state& saved, S scheduler) {
  const auto before = scheduler.state();
  const double lr = optimizer.lr();
  if (kiln_fuzz::refused([&] { scheduler.restore(saved); })) {
    const auto after = scheduler.state();
    kiln_fuzz::require(after.last_epoch == before.last_epoch && after.bad_epochs == before.bad_epochs &&
                           after.cooldown_left == before.cooldown_left && optimizer.lr() == lr,
                       "a refused restore leaves the scheduler and the rate unchanged");
    return;
  }
  for (int i = 0; i < 3; ++i) {
    if constexpr (std::is_same_v<S, optim::ReduceLROnPlateau>) kiln_fuzz::refused([&] { scheduler.step(1.0); });
    else kiln_fuzz::refused([&] { scheduler.step(); });
  }
}

template <class O>
void restore_schedulers(O& optimizer, const io::checkpoint_state& state) {
  for (const auto& [name, saved] : state.schedulers) {
    restore_into(optimizer, saved, optim::StepLR(optimizer, {.step_size = 3}));
    restore_into(optimizer, saved, optim::CosineAnnealingLR(optimizer, {.t_max = 10}));
    restore_into(optimizer, saved, optim::OneCycleLR(optimizer, {.max_lr = 0.1, .total_steps = 100}));
    restore_into(optimizer, saved, optim::ReduceLROnPlateau(optimizer, {.cooldown = 2}));
    restore_into(optimizer, saved,
                 optim::SequentialLR(optimizer, {optim::StepLR(optimizer, {.step_size = 2}),
                                                 optim::CosineAnnealingLR(optimizer, {.t_max = 5})},
                                     {4}));
  }
}

template <class M, class O>
void load_into(const std::filesystem::path& input, M& model, O& optimizer) {
  const std::string before = checkpoint_bytes(model, optimizer);
  io::checkpoint_state state;
  if (kiln_fuzz::refused([&] { state = io::load_checkpoint(input, model, optimizer); })) {
    kiln_fuzz::require(checkpoint_bytes(model, optimizer) == before,
                       "a refused load_checkpoint leaves model and optimizer unchanged");
    return;
  }
  restore_schedulers(optimizer, state);
}

template <class O, class Options>
void load_static(const std::filesystem::path& input, Options options) {
  auto model = kiln_fuzz::make_static_model();
  O optimizer(options);
  Tensor<float> x(shape{8, 4}, 0.5f), y(shape{8, 2}, 0.25f);
  model.train_step(x, y, loss::mse{}, optimizer);
  load_into(input, model, optimizer);
}

void load_dynamic(const std::filesystem::path& input) {
  auto model = kiln_fuzz::make_dynamic_model();
  optim::Adam optimizer(model.parameters(), {.lr = 1e-2});
  kiln_fuzz::dynamic_step(model, optimizer);
  load_into(input, model, optimizer);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto input = kiln_fuzz::input_file("input.ckpt", data, size);
  load_static<optim::Adam>(input, optim::adam_options{.lr = 1e-2});
  load_static<optim::AdamW>(input, optim::adamw_options{.lr = 1e-2, .amsgrad = true});
  load_static<optim::SGD>(input, optim::sgd_options{.lr = 0.05, .momentum = 0.9});
  load_static<optim::RMSprop>(input, optim::rmsprop_options{.lr = 1e-2, .momentum = 0.9, .centered = true});
  load_static<optim::Adagrad>(input, optim::adagrad_options{.lr = 0.1});
  load_dynamic(input);
  return 0;
}
