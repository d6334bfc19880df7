// The state of a static model: the values its plan (static/plan.hpp) lays out. One flat buffer of parameters, one of
// their gradients, one of buffers (running statistics), the generators of the layers that draw at run time, and which
// layers are frozen. Here are initialisation, state_dict and load_state_dict by PyTorch's names, the optimizer's view
// (parameters()), freezing, and the copy of one model's state into another. Nothing here runs a layer.
//
// Memory lives where the policy keeps it (Policy::buffer): host memory for the CPU policies, device memory for the
// CUDA ones. Initial weights are drawn on the host and uploaded; state_dict returns host tensors.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/optim/parameter.hpp"
#include "kiln/static/plan.hpp"

namespace kiln {

// A module's name as freeze takes it: a string, never an integer (freeze(0) is the layer at position 0).
template <class S>
concept module_name = std::convertible_to<const S&, std::string_view> && !std::is_arithmetic_v<S>;

template <class Plan>
class static_state {
  using T = typename Plan::T;
  using Policy = typename Plan::policy;
  template <class U>
  using policy_buffer = typename Policy::template buffer<U>;
  static constexpr std::size_t layer_count = Plan::layer_count;
  static constexpr index_t flat_parameter_size = Plan::flat_parameter_size;
  static constexpr index_t flat_buffer_size = Plan::flat_buffer_size;
  static constexpr bool host_accessible = Policy::host_accessible;

 public:
  // Allocates the buffers (gradients and buffers zeroed) and draws the parameters from `seed`.
  explicit static_state(std::uint64_t seed)
      : params_(flat_parameter_size), grads_(flat_parameter_size), buffers_(flat_buffer_size) {
    // The optimizer updates the whole flat buffer, alignment padding included: its gradient must stay zero.
    if (flat_parameter_size > 0) Policy::fill(grads_.data(), T(0), flat_parameter_size);
    if (flat_buffer_size > 0) Policy::fill(buffers_.data(), T(0), flat_buffer_size);
    initialize(seed);
  }
  // A copy holds the same parameters, gradients, buffers, generators and frozen layers in memory of its own (its
  // frozen flags too: freezing one model must not freeze the other).
  static_state(const static_state& other)
      : params_(flat_parameter_size), grads_(flat_parameter_size), buffers_(flat_buffer_size) {
    if (flat_parameter_size > 0) {
      Policy::copy(other.params_.data(), params_.data(), flat_parameter_size);
      Policy::copy(other.grads_.data(), grads_.data(), flat_parameter_size);
    }
    if (flat_buffer_size > 0) Policy::copy(other.buffers_.data(), buffers_.data(), flat_buffer_size);
    generators_ = other.generators_;
    *trainable_ = *other.trainable_;
    any_frozen_ = other.any_frozen_;
  }
  static_state& operator=(const static_state& other) {
    if (this != &other) *this = static_state(other);
    return *this;
  }
  // Moving keeps every buffer where it is.
  static_state(static_state&&) noexcept = default;
  static_state& operator=(static_state&&) noexcept = default;
  ~static_state() = default;

  // Re-draws every parameter as a freshly constructed model with this seed would: the k-th parameterised layer from
  // random_generator(seed).fork(k) (a block takes one stream for each such layer inside), like dynamic mode after
  // kiln::manual_seed(seed). The draws happen on the host (one generator for every policy, so CPU and GPU models start
  // from the same numbers) and are uploaded.
  void initialize(std::uint64_t seed) {
    aligned_buffer<T> host_params, host_buffers;
    T* params = params_.data();
    T* buffers = buffers_.data();
    if constexpr (!host_accessible) {
      host_params = aligned_buffer<T>(flat_parameter_size);
      host_buffers = aligned_buffer<T>(flat_buffer_size);
      params = host_params.data();
      buffers = host_buffers.data();
      std::fill_n(buffers, flat_buffer_size, T(0));
    }
    std::fill_n(params, flat_parameter_size, T(0));
    random_generator root(seed);
    std::uint64_t stream = 0;
    Plan::for_each_layer([&]<std::size_t I>() {
      using B = typename Plan::template bound<I>;
      if constexpr (B::param_count > 0) {
        random_generator rng = root.fork(stream);
        B::init(params + Plan::param_offsets[I], rng);
      }
      stream += detail::init_streams<B>();
      if constexpr (detail::has_buffers<B>) B::init_buffers(buffers + Plan::buffer_offsets[I]);
    });
    if constexpr (!host_accessible) {
      upload(host_params.data(), params_.data(), flat_parameter_size);
      upload(host_buffers.data(), buffers_.data(), flat_buffer_size);
    }
    std::uint64_t runtime_stream = runtime_stream_base;
    for (auto& generator : generators_) generator = random_generator(seed, runtime_stream++);
  }

  // What the optimizer updates: one slot for the whole flat buffer, or one per parameter tensor when `flat` is off.
  // Once a layer has been frozen, the slots are per layer (flat) or per tensor, each with its layer's trainable flag,
  // so that freeze/unfreeze later still steer an optimizer that holds them. The slots point into the policy's memory:
  // an optimizer of the same policy updates them. Flat slots list their parameter tensors (tensor_ranges), so that a
  // clipping norm sums them as dynamic mode's per-tensor slots do.
  std::vector<optim::parameter_slot<T>> parameter_slots(bool flat) {
    if (flat && !any_frozen_)
      return {{params_.data(), grads_.data(), flat_parameter_size, nullptr, nullptr, Plan::tensor_ranges(layer_count)}};
    std::vector<optim::parameter_slot<T>> slots;
    if (flat) {
      for (std::size_t i = 0; i < layer_count; ++i)
        if (Plan::param_offsets[i + 1] > Plan::param_offsets[i])
          slots.push_back({params_.data() + Plan::param_offsets[i], grads_.data() + Plan::param_offsets[i],
                           Plan::param_offsets[i + 1] - Plan::param_offsets[i], &(*trainable_)[i], nullptr,
                           Plan::tensor_ranges(i)});
      return slots;
    }
    for (auto& p : Plan::named_parameter_infos())
      slots.push_back({params_.data() + p.offset, grads_.data() + p.offset, p.shape.numel(),
                       &(*trainable_)[Plan::layer_holding(p.offset)]});
    return slots;
  }

  // Fine-tuning: freeze(i) stops the optimizer from updating layer i (counted from 0 after the Input, as in the type
  // list); unfreeze(i) resumes it. Freeze before the optimizer first sees the model (its first train_step, or
  // add_parameters(parameters())): from then on its slots carry each layer's flag. Gradients are still computed.
  // (An optimizer that took the flat buffer before the first freeze is refused at the next train_step.)
  void freeze(std::size_t layer, bool frozen = true) {
    if (layer >= layer_count) fail("Sequential::freeze: expected a layer index below ", layer_count, ", found ", layer);
    if (frozen && Plan::param_offsets[layer + 1] == Plan::param_offsets[layer])
      fail("Sequential::freeze: expected a layer with parameters, found layer ", layer, " (",
           Plan::layer_names()[layer], "), which has none");
    (*trainable_)[layer] = !frozen;
    if (frozen) any_frozen_ = true;
  }
  // The same by the module's state_dict name: "2" freezes the module whose parameters are "2.weight" and "2.bias" (a
  // Dense<N, ReLU> is modules k and k + 1, its parameters under k), "1" a whole block. A name inside a block
  // ("1.body.0") is refused: a block is frozen whole.
  template <module_name Name>
  void freeze(const Name& name, bool frozen = true) {
    freeze(layer_named(name), frozen);
  }
  void unfreeze(std::size_t layer) { freeze(layer, false); }
  template <module_name Name>
  void unfreeze(const Name& name) {
    freeze(layer_named(name), false);
  }
  bool is_frozen(std::size_t layer) const { return layer < layer_count && !(*trainable_)[layer]; }
  template <module_name Name>
  bool is_frozen(const Name& name) const {
    return is_frozen(layer_named(name));
  }
  // Parameters the optimizer updates (those of layers not frozen).
  index_t trainable_parameter_count() const {
    index_t n = 0;
    Plan::for_each_layer([&]<std::size_t I>() {
      if ((*trainable_)[I]) n += detail::parameter_values_of<typename Plan::template bound<I>>();
    });
    return n;
  }
  // The type-list position of the layer whose module has this state_dict name.
  static std::size_t layer_named(std::string_view name) {
    std::string known;
    for (std::size_t i = 0; i < layer_count; ++i) {
      if (Plan::param_offsets[i + 1] == Plan::param_offsets[i]) continue;
      const std::string own = std::to_string(Plan::module_index[i]);
      if (name == own) return i;
      if (name.size() > own.size() && name.substr(0, own.size()) == own && name[own.size()] == '.')
        fail("Sequential::freeze: '", name, "' is inside module '", own, "' (", Plan::layer_names()[i],
             "), which is frozen or unfrozen whole; expected '", own, "'");
      known.append(known.empty() ? "" : ", ").append(own);
    }
    fail("Sequential::freeze: expected the name of a module with parameters (", known, "), found '", name, "'");
  }

  // The generators of the layers that draw at run time (dropout masks), one per such layer in layer order, on the
  // streams a dynamic model built after kiln::manual_seed with the same seed gives its modules; a checkpoint saves
  // and restores their states.
  std::span<random_generator> runtime_generators() { return generators_; }
  std::span<const random_generator> runtime_generators() const { return generators_; }

  // Host copies of the parameters and buffers by name, PyTorch's state_dict layout (a layer's parameters, then its
  // buffers, layer by layer).
  std::vector<std::pair<std::string, Tensor<T>>> state_dict() const {
    const T* params = params_.data();
    const T* buffers = buffers_.data();
    aligned_buffer<T> host_params, host_buffers;
    if constexpr (!host_accessible) {
      host_params = aligned_buffer<T>(flat_parameter_size);
      host_buffers = aligned_buffer<T>(flat_buffer_size);
      download(params_.data(), host_params.data(), flat_parameter_size);
      download(buffers_.data(), host_buffers.data(), flat_buffer_size);
      params = host_params.data();
      buffers = host_buffers.data();
    }
    std::vector<std::pair<std::string, Tensor<T>>> out;
    for (auto& [p, is_buffer] : Plan::state_infos()) {
      const T* base = is_buffer ? buffers : params;
      out.emplace_back(p.name, Tensor<T>(tensor_view<const T>(base + p.offset, p.shape)));
    }
    return out;
  }
  // Loads parameters by name. Every name must be present with the right shape; all are checked before any is
  // copied, so a failed load leaves the model unchanged.
  template <class Dict>
  void load_state_dict(const Dict& dict) {
    auto states = Plan::state_infos();
    // By name, in one pass over each side: linear in the number of tensors.
    std::unordered_map<std::string_view, const Tensor<T>*> given;
    for (auto& [name, tensor] : dict)
      // Which of two entries of one name would win is a guess the caller did not mean to leave to us.
      if (!given.emplace(name, &tensor).second)
        fail("Sequential::load_state_dict: expected each name once, found '", name, "' twice");
    std::vector<const Tensor<T>*> sources;
    for (auto& [p, is_buffer] : states) {
      const auto entry = given.find(p.name);
      if (entry == given.end()) fail("Sequential::load_state_dict: missing parameter '", p.name, "' of shape ", p.shape);
      const Tensor<T>* found = entry->second;
      if (!(found->shape() == p.shape))
        fail("Sequential::load_state_dict: parameter '", p.name, "' expected shape ", p.shape, ", found ",
             found->shape());
      sources.push_back(found);
    }
    if (given.size() != states.size()) {
      std::unordered_set<std::string_view> known;
      for (auto& [p, is_buffer] : states) known.insert(p.name);
      for (auto& [name, tensor] : dict)
        if (!known.count(name)) fail("Sequential::load_state_dict: unexpected parameter '", name, "'");
    }
    for (std::size_t i = 0; i < states.size(); ++i) {
      const auto& info = states[i].first;
      T* base = states[i].second ? buffers_.data() : params_.data();
      if constexpr (host_accessible) Policy::copy(sources[i]->data(), base + info.offset, info.shape.numel());
      else upload(sources[i]->data(), base + info.offset, info.shape.numel());
    }
  }

  // The flat buffer of non-trainable state, in the policy's memory.
  std::span<T> buffer_values() { return {buffers_.data(), static_cast<std::size_t>(buffers_.size())}; }
  std::span<const T> buffer_values() const { return {buffers_.data(), static_cast<std::size_t>(buffers_.size())}; }
  // The flat parameter and gradient buffers, in the policy's memory (device pointers on a GPU policy: read them on
  // the host through state_dict, or download them).
  std::span<T> parameter_values() { return {params_.data(), static_cast<std::size_t>(params_.size())}; }
  std::span<const T> parameter_values() const { return {params_.data(), static_cast<std::size_t>(params_.size())}; }
  std::span<T> gradient_values() { return {grads_.data(), static_cast<std::size_t>(grads_.size())}; }

  // One parameter tensor by its state_dict name ("0.weight"), viewed in the flat buffer so that it can be changed in
  // place, for example by an initialiser of kiln/core/tensor_init.hpp. Host policies only: on a GPU, change a
  // state_dict and load it.
  tensor_view<T> parameter(std::string_view name)
    requires host_accessible
  {
    for (const auto& p : Plan::named_parameter_infos())
      if (p.name == name) return {params_.data() + p.offset, p.shape};
    std::string known;
    for (const auto& p : Plan::named_parameter_infos()) known.append(known.empty() ? "" : ", ").append(p.name);
    fail("Sequential::parameter: expected one of the parameter names ", known, ", found '", name, "'");
  }

 protected:
  // An optimizer that already holds parameters must hold this model's: one shared between two models kept updating
  // the first and never trained the second.
  template <class Optimizer>
  void check_optimizer_slots(const Optimizer& optimizer) const {
    if constexpr (requires { optimizer.slots(); }) {
      const T* first = params_.data();
      const T* last = first + flat_parameter_size;
      for (const auto& slot : optimizer.slots()) {
        if (std::less<const T*>{}(slot.value, first) || std::less<const T*>{}(last, slot.value + slot.size))
          fail("Sequential::train_step: expected an optimizer holding this model's parameters (or none yet), found "
               "one holding another model's; give each model an optimizer of its own");
        // A slot without a trainable flag is the flat buffer taken before any layer was frozen: it would go on
        // updating a layer frozen since, silently.
        if (any_frozen_ && !slot.trainable)
          for (std::size_t layer = 0; layer < layer_count; ++layer)
            if (!(*trainable_)[layer])
              fail("Sequential::train_step: layer ", layer, " (", Plan::layer_names()[layer],
                   ") is frozen, but the optimizer took the parameters as one flat buffer before the freeze, and "
                   "that cannot leave a layer out; freeze before the optimizer's first step, or give the model a "
                   "new optimizer");
      }
    }
  }
  // Copies in the policy's memory, for the device policies (n may be zero).
  template <class U>
  static void upload(const U* host, U* dst, index_t n) {
    if (n > 0) Policy::upload(host, dst, n);
  }
  template <class U>
  static void download(const U* src, U* host, index_t n) {
    if (n > 0) Policy::download(src, host, n);
  }

  policy_buffer<T> params_, grads_, buffers_;
  std::array<random_generator, Plan::runtime_generator_count> generators_;
  // Per-layer trainable flags on the heap: optimizer slots point at them, and they survive moving the model.
  std::shared_ptr<std::array<bool, layer_count>> trainable_ = [] {
    auto flags = std::make_shared<std::array<bool, layer_count>>();
    flags->fill(true);
    return flags;
  }();
  bool any_frozen_ = false;
};

}  // namespace kiln
