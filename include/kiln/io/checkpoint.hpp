// Checkpoints that resume exactly: one safetensors file with the model's parameters and buffers (PyTorch's names),
// the optimizer's state (per-slot step counts and Adam's moments, RMSprop's averages, Adagrad's sums or SGD's momentum
// buffers, under PyTorch's state names; steps taken, learning rate), the epoch and step, and the state of random
// generators (the model's own, one per layer that draws at run time such as dropout, plus any the caller names: data
// order, augmentation). Training resumed from a checkpoint reproduces the uninterrupted run's losses bit for bit.
//
//   kiln::io::save_checkpoint("run.ckpt", net, opt, {.epoch = e, .step = s, .generators = {{"data", data_rng.state()}},
//                                                    .schedulers = {{"lr", schedule.state()}}});
//   auto state = kiln::io::load_checkpoint("run.ckpt", net, opt);   // a fresh model and optimizer of the same kind
//   data_rng.set_state(state.generator("data"));
//   schedule.restore(state.scheduler("lr"));                        // a scheduler made as the saved one was
//
// Layout: the weights under their own names; optimizer tensors under "optimizer.<slot>.<name>" (slot = position in
// the optimizer's parameter list) and "optimizer.step" (I64: Adam, RMSprop, Adagrad); everything else in
// __metadata__ ("kiln.format" = "checkpoint", "epoch", "step", "optimizer", "optimizer.lr", "optimizer.steps_taken",
// "optimizer.slot_sizes", "rng.<name>" = "seed stream position", the model's k-th as "rng.model.<k>"; version 1 had
// one "rng.model" for all; "schedule.<name>" = "last_epoch best bad_epochs cooldown_left" for a learning-rate
// scheduler the caller names). These names, and all of "optimizer.*", "rng.*", "schedule.*" and "kiln.*", are the
// checkpoint's own: save_checkpoint refuses user metadata keys among them, so that whatever it saves loads back
// unchanged. A checkpoint saved before the first step (no optimizer state yet, or a static model's optimizer without
// its parameters) loads like any other.
// load_weights reads a checkpoint's weights and skips the rest.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/optim/adagrad.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/lr_scheduler.hpp"
#include "kiln/optim/rmsprop.hpp"
#include "kiln/optim/sgd.hpp"

namespace kiln::io {

// What a checkpoint records beside the model and the optimizer.
struct checkpoint_state {
  long long epoch = 0;  // for the caller: the epoch to resume at (or the one just finished; the caller decides)
  long long step = 0;   // global step count
  // Named generator states (a data loader's shuffling, augmentation); the static model's generator is added as
  // "model" automatically.
  std::vector<std::pair<std::string, random_generator::state_type>> generators{};
  // Any further string entries.
  std::vector<std::pair<std::string, std::string>> metadata{};
  // Named learning-rate schedulers' states (optim::lr_scheduler::state()).
  std::vector<std::pair<std::string, optim::lr_scheduler_state>> schedulers{};

  // A generator's saved state by name; throws if the checkpoint has none of that name.
  random_generator::state_type generator(const std::string& name) const {
    return named(generators, name, "random generator");
  }
  // A scheduler's saved state by name; throws if the checkpoint has none of that name.
  optim::lr_scheduler_state scheduler(const std::string& name) const {
    return named(schedulers, name, "learning-rate scheduler");
  }
  const std::string* meta(const std::string& key) const {
    for (const auto& [k, v] : metadata)
      if (k == key) return &v;
    return nullptr;
  }

 private:
  template <class Value>
  static const Value& named(const std::vector<std::pair<std::string, Value>>& entries, const std::string& name,
                            const char* what) {
    for (const auto& [n, value] : entries)
      if (n == name) return value;
    fail("checkpoint: no ", what, " named '", name, "' was saved");
  }
};

namespace detail {
// The generators of a model's layers that draw at run time (static: a span of them; dynamic: pointers collected from
// the modules), in layer order.
template <class M>
std::vector<random_generator*> runtime_generators_of(M& model) {
  std::vector<random_generator*> out;
  if constexpr (requires { model.runtime_generators(); }) {
    for (auto&& g : model.runtime_generators()) {
      if constexpr (std::is_pointer_v<std::remove_cvref_t<decltype(g)>>) out.push_back(g);
      else out.push_back(&g);
    }
  }
  return out;
}
inline std::string model_generator_key(std::size_t k) { return "rng.model." + std::to_string(k); }
// Accepts any state buffer: the visitor named_slot_state tries. (Not a lambda in the requires-expression: nvcc's
// front end then found no such call, and took Adam for SGD.)
struct any_buffer_visitor {
  template <class Buffer>
  void operator()(const char*, Buffer&, bool) const {}
};
// An optimizer whose per-slot state is a step count and buffers it names (slot_state::for_each_buffer): Adam, AdamW,
// RMSprop, Adagrad. SGD's state is its momentum buffers alone.
template <class O>
concept named_slot_state = requires(O& o, typename O::slot_state& s, any_buffer_visitor visit) {
  o.state();
  s.step;
  s.for_each_buffer(o.options(), visit);
};
template <class O, class Options>
concept options_are = std::is_same_v<typename O::options_type, Options>;

template <class O>
std::string optimizer_kind(const O& o) {
  if constexpr (options_are<O, optim::adam_options>) return "adam";
  else if constexpr (options_are<O, optim::adamw_options>) return "adamw";
  else if constexpr (options_are<O, optim::sgd_options>) return "sgd";
  else if constexpr (options_are<O, optim::rmsprop_options>) return "rmsprop";
  else if constexpr (options_are<O, optim::adagrad_options>) return "adagrad";
  else static_assert(sizeof(O) == 0, "checkpoint: kiln saves the state of Adam, AdamW, SGD, RMSprop and Adagrad");
  (void)o;
}
inline std::string format_double(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}
inline long long parse_integer(const std::string& text, const std::string& key, const std::string& source) {
  long long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    fail("checkpoint '", source, "': expected an integer for metadata '", key, "', found '", text, "'");
  return v;
}
inline std::uint64_t parse_unsigned(std::string_view text, const std::string& key, const std::string& source) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    fail("checkpoint '", source, "': expected an unsigned integer in metadata '", key, "', found '", text, "'");
  return v;
}
inline std::string generator_text(const random_generator::state_type& s) {
  std::string t = std::to_string(s.seed);
  t += ' ';
  t += std::to_string(s.stream);
  t += ' ';
  t += std::to_string(s.position);
  return t;
}
inline std::string scheduler_text(const optim::lr_scheduler_state& s) {
  return std::to_string(s.last_epoch) + ' ' + format_double(s.best) + ' ' + std::to_string(s.bad_epochs) + ' ' +
         std::to_string(s.cooldown_left);
}
// The space-separated parts of a metadata value.
inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> parts;
  std::string_view rest = text;
  for (std::size_t at; (at = rest.find(' ')) != std::string_view::npos; rest.remove_prefix(at + 1))
    parts.emplace_back(rest.substr(0, at));
  parts.emplace_back(rest);
  return parts;
}
inline optim::lr_scheduler_state parse_scheduler(const std::string& text, const std::string& key,
                                                 const std::string& source) {
  const auto parts = split_words(text);
  if (parts.size() != 4)
    fail("checkpoint '", source, "': expected 'last_epoch best bad_epochs cooldown_left' in metadata '", key,
         "', found '", text, "'");
  char* end = nullptr;
  const double best = std::strtod(parts[1].c_str(), &end);
  if (parts[1].empty() || end != parts[1].c_str() + parts[1].size())
    fail("checkpoint '", source, "': expected a number for the best metric in metadata '", key, "', found '", text,
         "'");
  return {parse_integer(parts[0], key, source), best, parse_integer(parts[2], key, source),
          parse_integer(parts[3], key, source)};
}
inline random_generator::state_type parse_generator(const std::string& text, const std::string& key,
                                                    const std::string& source) {
  const auto parts = split_words(text);
  if (parts.size() != 3)
    fail("checkpoint '", source, "': expected 'seed stream position' in metadata '", key, "', found '", text, "'");
  const random_generator::state_type state{parse_unsigned(parts[0], key, source), parse_unsigned(parts[1], key, source),
                                           parse_unsigned(parts[2], key, source)};
  // The position counts numbers drawn: near 2^64 it would wrap around and repeat the stream from its start.
  if (state.position > random_generator::max_saved_position)
    fail("checkpoint '", source, "': expected the position in metadata '", key, "' to be at most 2^62 = ",
         random_generator::max_saved_position, ", found ", state.position);
  return state;
}
// Adds an optimizer state buffer to the file: viewed in place when the policy's memory is host memory, otherwise
// downloaded first.
template <class Policy, class Buffer>
void add_state_buffer(st_file& file, std::string name, const Buffer& buffer) {
  using T = std::remove_cvref_t<decltype(*buffer.data())>;
  if constexpr (Policy::host_accessible) {
    file.add(std::move(name), tensor_view<const T>(buffer.data(), shape{buffer.size()}));
  } else {
    Tensor<T> host(shape{buffer.size()});
    if (buffer.size() > 0) Policy::download(buffer.data(), host.data(), buffer.size());
    file.add(std::move(name), host.view());
  }
}
// A state buffer of the policy holding a tensor read from the file.
template <class Policy, class T>
typename Policy::template buffer<T> to_state_buffer(const Tensor<T>& t) {
  typename Policy::template buffer<T> buffer(t.numel());
  if (t.numel() > 0) Policy::upload(t.data(), buffer.data(), t.numel());
  return buffer;
}
// The sizes of the optimizer's parameter slots; for an optimizer that has none yet (a static model's, before its first
// train_step) those of the model's parameters, which load_checkpoint gives it: a checkpoint saved at the start of
// training then loads like any other.
template <class M, class O>
std::vector<index_t> slot_sizes(M& model, const O& optimizer) {
  std::vector<index_t> sizes;
  if (optimizer.has_parameters()) {
    for (const auto& s : optimizer.slots()) sizes.push_back(s.size);
  } else {
    for (const auto& p : model.parameters()) sizes.push_back(as_parameter_slot(p).size);
  }
  return sizes;
}
inline std::string sizes_text(const std::vector<index_t>& sizes) {
  std::string text;
  for (auto size : sizes) {
    if (!text.empty()) text += ',';
    text += std::to_string(size);
  }
  return text;
}
// Metadata the checkpoint writes and reads itself; a user key there would be overwritten or taken for one of its own.
inline bool reserved_metadata_key(std::string_view key) {
  return key == "epoch" || key == "step" || key == "optimizer" || key.starts_with("optimizer.") ||
         key.starts_with("rng.") || key.starts_with("schedule.") || key.starts_with("kiln.");
}
// A count read from a checkpoint that the optimizer will increment: at least 0 and at most lr_scheduler's
// max_saved_count (2^48), beyond any training run and far enough below 2^63 that counting on never overflows.
inline void check_count(long long value, const std::string& what, const std::string& source) {
  constexpr long long most = optim::lr_scheduler::max_saved_count;
  if (value < 0 || value > most)
    fail("checkpoint '", source, "': expected ", what, " in [0, 2^48 = ", most, "], found ", value);
}
inline std::string slot_name(std::size_t slot, const char* what) {
  std::string n = "optimizer.";
  n += std::to_string(slot);
  n += '.';
  n += what;
  return n;
}
}  // namespace detail

// Writes model, optimizer and state to one safetensors file (atomically).
template <has_state_dict M, class O>
void save_checkpoint(const std::filesystem::path& path, const M& model, O& optimizer,
                     const checkpoint_state& state = {}) {
  using T = typename M::value_type;
  st_file file;
  for (const auto& [name, tensor] : model.state_dict()) {
    if (name.rfind("optimizer.", 0) == 0)
      fail("save_checkpoint: the model's tensor '", name, "' collides with the checkpoint's optimizer names");
    file.add(name, tensor.view());
  }
  file.set_meta("kiln.format", "checkpoint");
  file.set_meta("kiln.checkpoint_version", "2");
  file.set_meta("epoch", std::to_string(state.epoch));
  file.set_meta("step", std::to_string(state.step));
  file.set_meta("optimizer", detail::optimizer_kind(optimizer));
  file.set_meta("optimizer.lr", detail::format_double(optimizer.lr()));
  file.set_meta("optimizer.steps_taken", std::to_string(optimizer.steps_taken()));
  const auto sizes = detail::slot_sizes(const_cast<M&>(model), optimizer);
  file.set_meta("optimizer.slot_sizes", detail::sizes_text(sizes));
  using P = typename O::policy;
  if constexpr (detail::named_slot_state<O>) {
    // One step count per slot; slots without state yet (filled at their first step) have taken none.
    auto& st = optimizer.state();
    Tensor<std::int64_t> steps(shape{static_cast<index_t>(sizes.size())}, 0);
    for (std::size_t i = 0; i < st.size() && i < sizes.size(); ++i) {
      steps[static_cast<index_t>(i)] = st[i].step;
      st[i].for_each_buffer(optimizer.options(), [&](const char* name, const auto& buffer, bool) {
        if (buffer.size()) detail::add_state_buffer<P>(file, detail::slot_name(i, name), buffer);
      });
    }
    file.add("optimizer.step", steps.view());
  } else {
    auto& buffers = optimizer.momentum_buffers();
    for (std::size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].size()) detail::add_state_buffer<P>(file, detail::slot_name(i, "momentum_buffer"), buffers[i]);
  }
  const auto model_generators = detail::runtime_generators_of(const_cast<M&>(model));
  for (std::size_t k = 0; k < model_generators.size(); ++k)
    file.set_meta(detail::model_generator_key(k), detail::generator_text(model_generators[k]->state()));
  for (const auto& [name, s] : state.generators) {
    if (name == "model" || name.rfind("model.", 0) == 0)
      fail("save_checkpoint: generator names 'model' and 'model.*' are reserved (found '", name, "')");
    if (file.meta("rng." + name)) fail("save_checkpoint: expected unique generator names, found '", name, "' twice");
    file.set_meta("rng." + name, detail::generator_text(s));
  }
  for (const auto& [name, s] : state.schedulers) {
    if (file.meta("schedule." + name))
      fail("save_checkpoint: expected unique scheduler names, found '", name, "' twice");
    file.set_meta("schedule." + name, detail::scheduler_text(s));
  }
  for (const auto& [k, v] : state.metadata) {
    if (detail::reserved_metadata_key(k))
      fail("save_checkpoint: the metadata key '", k, "' is in the checkpoint's own namespace (epoch, step, optimizer, "
           "optimizer.*, rng.*, schedule.*, kiln.*); generators go in checkpoint_state::generators, schedulers in "
           "checkpoint_state::schedulers");
    if (file.meta(k)) fail("save_checkpoint: expected unique metadata keys, found '", k, "' twice");
    file.set_meta(k, v);
  }
  static_assert(std::is_same_v<T, typename O::value_type>, "save_checkpoint: model and optimizer value types differ");
  write_safetensors(path, file);
}

// Restores model, optimizer and the model's generator from a checkpoint and returns the saved state. The optimizer
// must be of the same kind (Adam, AdamW, SGD, RMSprop, Adagrad) over the same parameters; an optimizer that has none
// yet (a static model's, before its first train_step) is given the model's. Everything is checked before anything
// changes.
template <has_state_dict M, class O>
checkpoint_state load_checkpoint(const std::filesystem::path& path, M& model, O& optimizer) {
  using T = typename M::value_type;
  const std::string source = path.string();
  st_file file = read_safetensors(path);
  auto need = [&](const std::string& key) -> const std::string& {
    const std::string* v = file.meta(key);
    if (!v) fail("checkpoint '", source, "': metadata '", key, "' is missing (not a kiln checkpoint?)");
    return *v;
  };
  if (need("kiln.format") != "checkpoint")
    fail("checkpoint '", source, "': expected kiln.format 'checkpoint', found '", need("kiln.format"), "'");
  if (need("optimizer") != detail::optimizer_kind(optimizer))
    fail("checkpoint '", source, "': it holds the state of optimizer '", need("optimizer"),
         "', but it is being loaded into a '", detail::optimizer_kind(optimizer), "'");

  // Weights: checked completely.
  auto weights = detail::merged_state_dict(model, file, source, {});

  // Optimizer slots: the saved sizes must match (those of the model's parameters if the optimizer has none: it is
  // given them once everything is checked).
  const auto slots = detail::slot_sizes(model, optimizer);
  if (need("optimizer.slot_sizes") != detail::sizes_text(slots))
    fail("checkpoint '", source, "': the optimizer's parameter slots have sizes [", detail::sizes_text(slots),
         "], the checkpoint's [", need("optimizer.slot_sizes"), "]");
  // The optimizer's tensors by name, so that finding each slot's takes constant time.
  std::unordered_map<std::string_view, const st_tensor*> optimizer_tensors;
  for (const auto& t : file.tensors)
    if (detail::is_optimizer_state(t.name)) optimizer_tensors.emplace(t.name, &t);
  auto slot_tensor = [&](std::size_t i, const char* what) -> std::optional<Tensor<T>> {
    const auto entry = optimizer_tensors.find(detail::slot_name(i, what));
    const st_tensor* t = entry == optimizer_tensors.end() ? nullptr : entry->second;
    if (!t) return std::nullopt;
    if (!st_is_float(t->dtype))
      fail("checkpoint '", source, "': expected a floating-point tensor '", t->name, "', found dtype ",
           st_dtype_name(t->dtype));
    if (t->shape.numel() != slots[i])
      fail("checkpoint '", source, "': '", t->name, "' holds ", t->shape.numel(), " values for a slot of ", slots[i]);
    return to_tensor<T>(*t, source);
  };
  long long steps_taken = detail::parse_integer(need("optimizer.steps_taken"), "optimizer.steps_taken", source);
  detail::check_count(steps_taken, "optimizer.steps_taken", source);
  double lr = 0;
  {
    const std::string& text = need("optimizer.lr");
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), lr);
    if (ec != std::errc() || end != text.data() + text.size())
      fail("checkpoint '", source, "': expected a number for metadata 'optimizer.lr', found '", text, "'");
    if (!std::isfinite(lr) || lr < 0)
      fail("checkpoint '", source, "': expected a finite optimizer.lr >= 0, found '", text, "'");
  }
  using P = typename O::policy;
  using slot_state = typename std::conditional_t<detail::named_slot_state<O>, O, optim::basic_adam<T, P>>::slot_state;
  std::vector<slot_state> slot_states(slots.size());
  std::vector<typename P::template buffer<T>> momentum(slots.size());
  if constexpr (detail::named_slot_state<O>) {
    // Earlier versions saved no step counts before Adam's first step (an empty tensor): none were taken.
    const auto steps_entry = optimizer_tensors.find("optimizer.step");
    const st_tensor* steps = steps_entry == optimizer_tensors.end() ? nullptr : steps_entry->second;
    const bool saved_before_first_step = steps && steps->dtype == st_dtype::i64 && steps->shape.numel() == 0;
    if (!steps || steps->dtype != st_dtype::i64 ||
        (steps->shape.numel() != static_cast<index_t>(slots.size()) && !saved_before_first_step))
      fail("checkpoint '", source, "': expected an I64 tensor 'optimizer.step' with ", slots.size(), " values");
    auto step_values = to_tensor<std::int64_t>(*steps, source);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto& st = slot_states[i];
      st.step = saved_before_first_step ? 0 : step_values[static_cast<index_t>(i)];
      detail::check_count(st.step, detail::slot_name(i, "step"), source);
      st.for_each_buffer(optimizer.options(), [&](const char* name, auto& buffer, bool used) {
        if (auto t = slot_tensor(i, name)) buffer = detail::to_state_buffer<P>(*t);
        if (st.step > 0 && used && buffer.size() != slots[i])
          fail("checkpoint '", source, "': slot ", i, " has taken ", st.step, " steps but its ", name,
               " is missing (these options use it)");
      });
    }
  } else {
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (auto t = slot_tensor(i, "momentum_buffer")) momentum[i] = detail::to_state_buffer<P>(*t);
  }

  checkpoint_state state;
  state.epoch = detail::parse_integer(need("epoch"), "epoch", source);
  state.step = detail::parse_integer(need("step"), "step", source);
  const auto model_generators = detail::runtime_generators_of(model);
  std::vector<std::optional<random_generator::state_type>> model_states(model_generators.size());
  std::optional<random_generator::state_type> version1_model_state;
  for (const auto& [k, v] : file.metadata) {
    if (k.rfind("rng.", 0) == 0) {
      auto s = detail::parse_generator(v, k, source);
      if (k == "rng.model") {
        version1_model_state = s;
      } else if (k.rfind("rng.model.", 0) == 0) {
        std::size_t index = 0;
        auto digits = std::string_view(k).substr(10);
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
        if (ec != std::errc{} || end != digits.data() + digits.size() || index >= model_states.size())
          fail("checkpoint '", source, "': generator state '", k, "' names no layer of this model, which has ",
               model_states.size(), " layer(s) that draw at run time");
        model_states[index] = s;
      } else {
        state.generators.emplace_back(k.substr(4), s);
      }
    } else if (k.rfind("schedule.", 0) == 0) {
      state.schedulers.emplace_back(k.substr(9), detail::parse_scheduler(v, k, source));
    } else if (k != "kiln.format" && k != "kiln.checkpoint_version" && k != "epoch" && k != "step" &&
               k != "optimizer" && k.rfind("optimizer.", 0) != 0) {
      state.metadata.emplace_back(k, v);
    }
  }
  // Version 1 saved one generator for all of a static model's dropout layers, on the stream the first of them now
  // has: it resumes a model with one such layer exactly, and none can be resumed for more.
  if (version1_model_state && model_states.size() == 1 && !model_states[0]) model_states[0] = version1_model_state;
  for (std::size_t k = 0; k < model_states.size(); ++k)
    if (!model_states[k])
      fail("checkpoint '", source, "': expected the state of generator '", detail::model_generator_key(k),
           "' (layer ", k, " of the ", model_states.size(), " that draw at run time), found none",
           version1_model_state ? " (a version 1 checkpoint resumes models with at most one such layer)" : "");

  // Everything checked: apply.
  if (!optimizer.has_parameters()) optimizer.add_parameters(model.parameters());
  model.load_state_dict(weights);
  for (std::size_t k = 0; k < model_generators.size(); ++k) model_generators[k]->set_state(*model_states[k]);
  optimizer.set_lr(lr);
  optimizer.set_steps_taken(steps_taken);
  if constexpr (detail::named_slot_state<O>) {
    optimizer.state() = std::move(slot_states);
  } else {
    optimizer.momentum_buffers() = std::move(momentum);
  }
  return state;
}

}  // namespace kiln::io
