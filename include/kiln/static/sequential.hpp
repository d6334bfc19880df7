// kiln::Sequential<Policy, Input<...>, Layers...>: a model whose layers are types. Shapes are inferred and checked by
// the compiler, all memory (parameters, gradients, activations, scratch) is planned and allocated once at
// construction for a maximum batch, parameters live in one flat buffer, and a training step allocates nothing.
//
// Memory lives where the policy keeps it (Policy::buffer): host memory for the CPU policies, device memory for the
// CUDA ones. Initial weights are drawn on the host and uploaded; state_dict and predict return host tensors. Batches
// passed as plain views are host data: on a device policy they are uploaded into staging buffers planned at
// construction. A batch already in the policy's memory is passed with kiln::resident and read in place.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/step_profile.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/optim/parameter.hpp"
#include "kiln/policy.hpp"
#include "kiln/static/input.hpp"
#include "kiln/static/options.hpp"
#include "kiln/static/resident.hpp"
#include "kiln/static/shape_check.hpp"

namespace kiln {

// One row of a model summary: the layer, its output shape per sample and its parameter count.
struct layer_summary {
  std::string name;
  kiln::shape output_shape;
  index_t parameters = 0;
};

namespace detail {
template <class List>
struct list_to_tuple;
template <class... B>
struct list_to_tuple<type_list<B...>> {
  using type = std::tuple<B...>;
};
constexpr index_t align_up(index_t n, index_t to) { return (n + to - 1) / to * to; }
// Parameter slices start on 64-byte boundaries so that every layer's weights are aligned for vector loads.
inline constexpr index_t parameter_alignment = 16;
// The streams of random_generator(seed) a layer's init draws from: one for a layer with parameters, or what a block
// of several declares (B::init_stream_count: stream k + j for its j-th parameterised layer, as dynamic mode's modules
// take one stream each).
template <class B>
constexpr std::uint64_t init_streams() {
  if constexpr (requires { B::init_stream_count; }) return B::init_stream_count;
  else return B::param_count > 0 ? 1 : 0;
}
template <class B>
concept describes_parameters = requires { B::parameter_tensors(); };
template <class B>
concept has_buffers = requires { B::buffer_count; B::buffer_tensors(); };
template <class B>
constexpr index_t buffer_count_of() {
  if constexpr (has_buffers<B>) return B::buffer_count;
  else return 0;
}
template <class L>
concept has_fused_activation = requires { L::fused_activation; };
template <class B>
constexpr bool draws_at_run_time() {
  if constexpr (requires { B::draws_at_run_time; }) return B::draws_at_run_time;
  else return false;
}
// An optimizer that names its policy must name the model's, or one whose memory is the model's: its kernels read the
// model's parameters (policy::cpu's Adam updates a policy::cpu_bf16 model, whose parameters are host floats too).
template <class O, class P>
concept optimizer_for_policy = !requires { typename O::policy; } || std::is_same_v<typename O::policy, P> ||
                               (O::policy::host_accessible && P::host_accessible);
}  // namespace detail

template <class Policy, class InputSpec, class... Layers>
class Sequential {
  static_assert(sizeof...(Layers) > 0, "kiln::Sequential needs at least one layer after the Input");

 public:
  using value_type = typename InputSpec::value_type;
  using T = value_type;
  using policy = Policy;
  using input_shape = typename InputSpec::shape;
  using binding = bind_layers<InputSpec, input_shape, Layers...>;
  using output_shape = typename binding::output;
  static constexpr std::size_t layer_count = sizeof...(Layers);
  // Whether the model's memory (parameters, workspace, forward's result) can be read on the host.
  static constexpr bool host_accessible = Policy::host_accessible;

 private:
  template <class U>
  using policy_buffer = typename Policy::template buffer<U>;
  using bound_tuple = typename detail::list_to_tuple<typename binding::type>::type;
  template <std::size_t I>
  using bound = std::tuple_element_t<I, bound_tuple>;
  template <std::size_t I>
  using layer = std::tuple_element_t<I, std::tuple<Layers...>>;

  template <std::size_t... I>
  static constexpr std::array<index_t, layer_count + 1> compute_offsets(std::index_sequence<I...>) {
    std::array<index_t, layer_count + 1> offsets{};
    index_t counts[] = {bound<I>::param_count...};
    for (std::size_t i = 0; i < layer_count; ++i)
      offsets[i + 1] = offsets[i] + detail::align_up(counts[i], detail::parameter_alignment);
    return offsets;
  }
  static constexpr auto param_offsets = compute_offsets(std::make_index_sequence<layer_count>{});
  template <std::size_t... I>
  static constexpr std::array<index_t, layer_count + 1> compute_buffer_offsets(std::index_sequence<I...>) {
    std::array<index_t, layer_count + 1> offsets{};
    index_t counts[] = {detail::buffer_count_of<bound<I>>()...};
    for (std::size_t i = 0; i < layer_count; ++i) offsets[i + 1] = offsets[i] + counts[i];
    return offsets;
  }
  static constexpr auto buffer_offsets = compute_buffer_offsets(std::make_index_sequence<layer_count>{});
  // The k-th layer that draws at run time owns generators_[k]: runtime_index[I] is layer I's k (read only for layers
  // that draw), runtime_index[layer_count] the number of such layers.
  template <std::size_t... I>
  static constexpr std::array<std::size_t, layer_count + 1> compute_runtime_index(std::index_sequence<I...>) {
    std::array<std::size_t, layer_count + 1> index{};
    bool draws[] = {detail::draws_at_run_time<bound<I>>()...};
    std::size_t k = 0;
    for (std::size_t i = 0; i < layer_count; ++i) index[i] = draws[i] ? k++ : 0;
    index[layer_count] = k;
    return index;
  }
  static constexpr auto runtime_index = compute_runtime_index(std::make_index_sequence<layer_count>{});
  static constexpr std::size_t runtime_generator_count = runtime_index[layer_count];
  template <std::size_t... I>
  static constexpr bool all_alias(std::index_sequence<I...>) {
    return (bound<I>::aliases_input && ...);
  }
  static_assert(!all_alias(std::make_index_sequence<layer_count>{}),
                "kiln::Sequential: every layer only reshapes its input; add a layer that computes something");

 public:
  // Total parameter elements including alignment padding between layers (the padding stays zero).
  static constexpr index_t flat_parameter_size = param_offsets[layer_count];
  // Total non-trainable state (running statistics), kept in a second flat buffer.
  static constexpr index_t flat_buffer_size = buffer_offsets[layer_count];

  // Plans and allocates everything for batches of up to max_batch samples, initialising the k-th layer that has
  // parameters from random_generator(seed).fork(k), like dynamic mode after kiln::manual_seed(seed).
  explicit Sequential(index_t max_batch, std::uint64_t seed = 0, static_options options = {})
      : max_batch_(max_batch), options_(options) {
    if (max_batch <= 0) fail("Sequential: expected a positive maximum batch, found ", max_batch);
    // The workspace holds each layer's output and gradient and its scratch for max_batch samples: a product that
    // overflowed planned a tiny workspace, and the first forward wrote past it.
    constexpr index_t per_sample = workspace_per_sample(std::make_index_sequence<layer_count>{});
    constexpr index_t largest_batch = (index_t{1} << 46) / (per_sample + input_shape::size + output_shape::size + 1);
    if (max_batch > largest_batch)
      fail("Sequential: a maximum batch of ", max_batch, " needs ", per_sample, " workspace values per sample, more ",
           "than memory can hold; expected at most ", largest_batch);
    params_ = policy_buffer<T>(flat_parameter_size);
    grads_ = policy_buffer<T>(flat_parameter_size);
    buffers_ = policy_buffer<T>(flat_buffer_size);
    // The optimizer updates the whole flat buffer, alignment padding included: its gradient must stay zero.
    if (flat_parameter_size > 0) Policy::fill(grads_.data(), T(0), flat_parameter_size);
    if (flat_buffer_size > 0) Policy::fill(buffers_.data(), T(0), flat_buffer_size);
    try {
      plan_workspace(std::make_index_sequence<layer_count>{});
      plan_staging();
    } catch (const std::bad_alloc&) {
      fail("Sequential: cannot allocate the workspace for a maximum batch of ", max_batch, " (", per_sample,
           " values per sample)");
    }
    initialize(seed);
  }

  // A copy is a model of its own: the same parameters, gradients, running statistics, generators, frozen layers and
  // mode, with its own workspace. (Member-wise, the copy's layer pointers would have read and written the original's
  // workspace, and freezing one would have frozen both.)
  Sequential(const Sequential& other) : Sequential(other.max_batch_, 0, other.options_) {
    if (flat_parameter_size > 0) {
      Policy::copy(other.params_.data(), params_.data(), flat_parameter_size);
      Policy::copy(other.grads_.data(), grads_.data(), flat_parameter_size);
    }
    if (flat_buffer_size > 0) Policy::copy(other.buffers_.data(), buffers_.data(), flat_buffer_size);
    generators_ = other.generators_;
    training_ = other.training_;
    *trainable_ = *other.trainable_;
    any_frozen_ = other.any_frozen_;
  }
  Sequential& operator=(const Sequential& other) {
    if (this != &other) *this = Sequential(other);
    return *this;
  }
  // Moving keeps every buffer where it is, so the layer pointers stay valid.
  Sequential(Sequential&&) noexcept = default;
  Sequential& operator=(Sequential&&) noexcept = default;
  ~Sequential() = default;

  // Re-draws every parameter as a freshly constructed model with this seed would. The draws happen on the host (one
  // generator for every policy, so CPU and GPU models start from the same numbers) and are uploaded.
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
    for_each_layer([&]<std::size_t I>() {
      if constexpr (bound<I>::param_count > 0) {
        random_generator rng = root.fork(stream);
        bound<I>::init(params + param_offsets[I], rng);
      }
      stream += detail::init_streams<bound<I>>();
      if constexpr (detail::has_buffers<bound<I>>) bound<I>::init_buffers(buffers + buffer_offsets[I]);
    });
    if constexpr (!host_accessible) {
      upload(host_params.data(), params_.data(), flat_parameter_size);
      upload(host_buffers.data(), buffers_.data(), flat_buffer_size);
    }
    std::uint64_t runtime_stream = runtime_stream_base;
    for (auto& generator : generators_) generator = random_generator(seed, runtime_stream++);
  }

  index_t max_batch() const { return max_batch_; }
  const static_options& options() const { return options_; }
  void set_options(const static_options& o) { options_ = o; }
  // Training mode affects layers such as dropout and batch normalisation; train_step always trains.
  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // Runs the layers on a batch of host data and returns a view of the output inside the workspace (valid until the
  // next call; in the policy's memory, see last_output_on_host).
  tensor_view<const T> forward(tensor_view<const T> x) {
    index_t batch = check_input(x, "Sequential::forward");
    return forward_batch(stage_input(x, batch), batch);
  }
  // The same on a batch already in the policy's memory.
  tensor_view<const T> forward(resident_t, tensor_view<const T> x) {
    return forward_batch(x.data(), check_input(x, "Sequential::forward"));
  }

  // The output of the last forward pass (train_step included), still in the workspace, in the policy's memory.
  tensor_view<const T> last_output() const { return {output_, output_shape::batch_shape(last_batch_)}; }
  // The same, readable on the host: the workspace itself on CPU policies, otherwise a host copy (valid until the
  // next call) downloaded into a buffer planned at construction.
  tensor_view<const T> last_output_on_host() {
    if constexpr (host_accessible) {
      return last_output();
    } else {
      download(output_, output_host_.data(), last_batch_ * output_shape::size);
      return {output_host_.data(), output_shape::batch_shape(last_batch_)};
    }
  }

  // Forward in evaluation mode for any number of host samples (processed in chunks of max_batch), into a new host
  // tensor.
  Tensor<T> predict(tensor_view<const T> x) { return predict_chunks(x, false); }
  // The same for samples already in the policy's memory; the result is still a host tensor.
  Tensor<T> predict(resident_t, tensor_view<const T> x) { return predict_chunks(x, true); }

  // One training step: forward, loss and its gradient, backward, optimizer update. Returns the loss.
  // target holds integer labels for cross-entropy and values of the output's shape for the other losses. x and
  // target are host data; the optimizer must use the model's policy.
  template <class Loss, class Optimizer>
  T train_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer) {
    T value = forward_backward(x, target, loss);
    update(optimizer);
    return value;
  }
  // The same on a batch already in the policy's memory.
  template <class Loss, class Optimizer>
  T train_step(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer) {
    T value = forward_backward(resident, x, target, loss);
    update(optimizer);
    return value;
  }
  // The same step, with the time of each of its parts added to `profile` (see step_profile.hpp): an empty profile
  // is sized for this model, one from another model is an error.
  template <class Loss, class Optimizer>
  T train_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer, step_profile& profile) {
    return profiled_step(x, target, loss, optimizer, profile, false);
  }
  template <class Loss, class Optimizer>
  T train_step(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss, Optimizer& optimizer, step_profile& profile) {
    return profiled_step(x, target, loss, optimizer, profile, true);
  }
  // A training step on a resident batch that never waits for the device: the loss is written to *loss_out in the
  // policy's memory instead of being returned. On a GPU policy nothing in it synchronises, so the whole step can be
  // captured into a CUDA graph (with an optimizer that keeps its step count on the device, such as Adam with
  // .capturable = true). No input checks beyond shapes: a bad label is not reported (see the *_on_device losses).
  template <class Loss, class Optimizer>
  void enqueue_train_step(resident_t, tensor_view<const T> x,
                          tensor_view<const typename Loss::template target_type<T>> target, const Loss& loss,
                          Optimizer& optimizer, T* loss_out) {
    index_t batch = check_input(x, "Sequential::enqueue_train_step");
    check_target<Loss>(target, batch);
    layer_context ctx{batch, true};
    run_forward(x.data(), ctx);
    loss.template forward_backward_into<Policy>(output_pointer(), target.data(), output_grad_, batch,
                                                output_shape::size, loss_out);
    run_backward(ctx);
    update(optimizer);
  }

  // Forward, loss and backward without an update: the gradients are left in gradient_values().
  template <class Loss>
  T forward_backward(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
                     const Loss& loss) {
    index_t batch = check_input(x, "Sequential::train_step");
    check_target<Loss>(target, batch);
    return forward_backward_batch(stage_input(x, batch), stage_target(target), batch, loss);
  }
  template <class Loss>
  T forward_backward(resident_t, tensor_view<const T> x,
                     tensor_view<const typename Loss::template target_type<T>> target, const Loss& loss) {
    index_t batch = check_input(x, "Sequential::train_step");
    check_target<Loss>(target, batch);
    return forward_backward_batch(x.data(), target.data(), batch, loss);
  }

  // The loss on a batch in evaluation mode, without gradients.
  template <class Loss>
  T loss_value(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss) {
    index_t batch = check_input(x, "Sequential::loss_value");
    check_target<Loss>(target, batch);
    return loss_value_batch(stage_input(x, batch), stage_target(target), batch, loss);
  }
  template <class Loss>
  T loss_value(resident_t, tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
               const Loss& loss) {
    index_t batch = check_input(x, "Sequential::loss_value");
    check_target<Loss>(target, batch);
    return loss_value_batch(x.data(), target.data(), batch, loss);
  }

  // What the optimizer updates: one slot for the whole flat buffer, or one per parameter tensor when
  // options().flat_parameters is off.
  // Once a layer has been frozen, the slots are per layer (flat) or per tensor, each with its layer's trainable
  // flag, so that freeze/unfreeze later still steer an optimizer that holds them.
  // The slots point into the policy's memory: an optimizer of the same policy updates them.
  // Flat slots list their parameter tensors (tensor_ranges), so that a clipping norm sums them as dynamic mode's
  // per-tensor slots do.
  std::vector<optim::parameter_slot<T>> parameters() {
    if (options_.flat_parameters && !any_frozen_)
      return {{params_.data(), grads_.data(), flat_parameter_size, nullptr, nullptr, tensor_ranges(layer_count)}};
    std::vector<optim::parameter_slot<T>> slots;
    if (options_.flat_parameters) {
      for (std::size_t i = 0; i < layer_count; ++i)
        if (param_offsets[i + 1] > param_offsets[i])
          slots.push_back({params_.data() + param_offsets[i], grads_.data() + param_offsets[i],
                           param_offsets[i + 1] - param_offsets[i], &(*trainable_)[i], nullptr, tensor_ranges(i)});
      return slots;
    }
    for (auto& p : named_parameter_infos())
      slots.push_back({params_.data() + p.offset, grads_.data() + p.offset, p.shape.numel(),
                       &(*trainable_)[layer_holding(p.offset)]});
    return slots;
  }

  // Layer i's parameter tensors as ranges from the layer's start in the flat buffer; for i = layer_count, every
  // tensor as a range from the buffer's start. The alignment padding between layers is in none of them.
  static std::span<const optim::tensor_range> tensor_ranges(std::size_t i) {
    static const auto ranges = [] {
      std::array<std::vector<optim::tensor_range>, layer_count + 1> r;
      for (const auto& p : named_parameter_infos()) {
        const std::size_t layer = layer_holding(p.offset);
        r[layer].push_back({p.offset - param_offsets[layer], p.shape.numel()});
        r[layer_count].push_back({p.offset, p.shape.numel()});
      }
      return r;
    }();
    return ranges[i];
  }

  // Fine-tuning: freeze(i) stops the optimizer from updating layer i (counted from 0 after the Input, as in the type
  // list); unfreeze(i) resumes it. Freeze before the optimizer first sees the model (its first train_step, or
  // add_parameters(parameters())): from then on its slots carry each layer's flag. Gradients are still computed.
  // (An optimizer that took the flat buffer before the first freeze is refused at the next train_step.)
  void freeze(std::size_t layer, bool frozen = true) {
    if (layer >= layer_count) fail("Sequential::freeze: expected a layer index below ", layer_count, ", found ", layer);
    if (frozen && param_offsets[layer + 1] == param_offsets[layer])
      fail("Sequential::freeze: expected a layer with parameters, found layer ", layer, " (",
           layer_names()[layer], "), which has none");
    (*trainable_)[layer] = !frozen;
    if (frozen) any_frozen_ = true;
  }
  void unfreeze(std::size_t layer) { freeze(layer, false); }
  bool is_frozen(std::size_t layer) const { return layer < layer_count && !(*trainable_)[layer]; }
  // Parameters the optimizer updates (those of layers not frozen).
  index_t trainable_parameter_count() const {
    index_t n = 0;
    for_each_layer([&]<std::size_t I>() {
      if ((*trainable_)[I]) n += bound<I>::param_count;
    });
    return n;
  }

  // The generators of the layers that draw at run time (dropout masks), one per such layer in layer order, on the
  // streams a dynamic model built after kiln::manual_seed with the same seed gives its modules; a checkpoint saves
  // and restores their states.
  std::span<random_generator> runtime_generators() { return generators_; }
  std::span<const random_generator> runtime_generators() const { return generators_; }

  // The layer whose part of the flat parameter buffer holds `offset`.
  static std::size_t layer_holding(index_t offset) {
    std::size_t layer = 0;
    while (layer + 1 < layer_count && param_offsets[layer + 1] <= offset) ++layer;
    return layer;
  }

  // Every parameter tensor with PyTorch's Sequential names ("1.weight"): a Dense with a fused activation counts as
  // two modules, Linear then the activation, as in the equivalent torch.nn.Sequential. Offsets are into the flat
  // buffer.
  static std::vector<static_parameter_info> named_parameter_infos() {
    std::vector<static_parameter_info> out;
    int torch_index = 0;
    for_each_layer([&]<std::size_t I>() {
      if constexpr (detail::describes_parameters<bound<I>>) {
        for (auto info : bound<I>::parameter_tensors()) {
          info.name = std::to_string(torch_index) + "." + info.name;
          info.offset += param_offsets[I];
          out.push_back(info);
        }
      }
      torch_index += 1;
      if constexpr (detail::has_fused_activation<layer<I>>)
        if (layer<I>::fused_activation != activation::identity) torch_index += 1;
    });
    return out;
  }

  // Every buffer (running statistics) by PyTorch name, with offsets into the flat buffer of buffers.
  static std::vector<static_parameter_info> named_buffer_infos() {
    std::vector<static_parameter_info> out;
    int torch_index = 0;
    for_each_layer([&]<std::size_t I>() {
      if constexpr (detail::has_buffers<bound<I>>) {
        for (auto info : bound<I>::buffer_tensors()) {
          info.name = std::to_string(torch_index) + "." + info.name;
          info.offset += buffer_offsets[I];
          out.push_back(info);
        }
      }
      torch_index += 1;
      if constexpr (detail::has_fused_activation<layer<I>>)
        if (layer<I>::fused_activation != activation::identity) torch_index += 1;
    });
    return out;
  }

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
    for (auto& [p, is_buffer] : state_infos()) {
      const T* base = is_buffer ? buffers : params;
      out.emplace_back(p.name, Tensor<T>(tensor_view<const T>(base + p.offset, p.shape)));
    }
    return out;
  }
  // Loads parameters by name. Every name must be present with the right shape; all are checked before any is
  // copied, so a failed load leaves the model unchanged.
  template <class Dict>
  void load_state_dict(const Dict& dict) {
    auto states = state_infos();
    std::vector<static_parameter_info> infos;
    for (auto& [info, is_buffer] : states) infos.push_back(info);
    // By name, in one pass over each side: linear in the number of tensors.
    std::unordered_map<std::string_view, const Tensor<T>*> given;
    for (auto& [name, tensor] : dict)
      // Which of two entries of one name would win is a guess the caller did not mean to leave to us.
      if (!given.emplace(name, &tensor).second)
        fail("Sequential::load_state_dict: expected each name once, found '", name, "' twice");
    std::vector<const Tensor<T>*> sources;
    for (auto& p : infos) {
      const auto entry = given.find(p.name);
      if (entry == given.end()) fail("Sequential::load_state_dict: missing parameter '", p.name, "' of shape ", p.shape);
      const Tensor<T>* found = entry->second;
      if (!(found->shape() == p.shape))
        fail("Sequential::load_state_dict: parameter '", p.name, "' expected shape ", p.shape, ", found ",
             found->shape());
      sources.push_back(found);
    }
    if (given.size() != infos.size()) {
      std::unordered_set<std::string_view> known;
      for (auto& p : infos) known.insert(p.name);
      for (auto& [name, tensor] : dict)
        if (!known.count(name)) fail("Sequential::load_state_dict: unexpected parameter '", name, "'");
    }
    for (std::size_t i = 0; i < infos.size(); ++i) {
      T* base = states[i].second ? buffers_.data() : params_.data();
      if constexpr (host_accessible) Policy::copy(sources[i]->data(), base + infos[i].offset, infos[i].shape.numel());
      else upload(sources[i]->data(), base + infos[i].offset, infos[i].shape.numel());
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
    for (const auto& p : named_parameter_infos())
      if (p.name == name) return {params_.data() + p.offset, p.shape};
    std::string known;
    for (const auto& p : named_parameter_infos()) known.append(known.empty() ? "" : ", ").append(p.name);
    fail("Sequential::parameter: expected one of the parameter names ", known, ", found '", name, "'");
  }

  // Number of parameters (without alignment padding).
  static constexpr index_t parameter_count() {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (index_t{0} + ... + bound<I>::param_count);
    }(std::make_index_sequence<layer_count>{});
  }

  // One row per layer: the table behind Model::summary().
  static std::vector<layer_summary> summary_rows() {
    std::vector<layer_summary> rows;
    for_each_layer([&]<std::size_t I>() {
      using out = typename bound<I>::output;
      rows.push_back({bound<I>::description(), out::batch_shape(1), bound<I>::param_count});
    });
    return rows;
  }
  // Bytes of activations, gradients and scratch planned at construction.
  index_t workspace_bytes() const { return static_cast<index_t>(workspace_.size() * sizeof(T)); }
  // Bytes of the input and target staging buffers (device policies only; zero on the CPU).
  index_t staging_bytes() const {
    return static_cast<index_t>(input_stage_.size() * sizeof(T) + target_stage_.size() * sizeof(T) +
                                label_stage_.size() * sizeof(std::int64_t));
  }

 private:
  // Parameters and buffers in state_dict order: layer by layer, parameters before buffers; second: is a buffer.
  static std::vector<std::pair<static_parameter_info, bool>> state_infos() {
    std::vector<std::pair<static_parameter_info, bool>> out;
    auto params = named_parameter_infos();
    auto buffers = named_buffer_infos();
    auto layer_of = [](const std::string& name) { return std::stoi(name.substr(0, name.find('.'))); };
    std::size_t b = 0;
    for (std::size_t p = 0; p < params.size(); ++p) {
      while (b < buffers.size() && layer_of(buffers[b].name) < layer_of(params[p].name)) out.emplace_back(buffers[b++], true);
      out.emplace_back(params[p], false);
      if (p + 1 == params.size() || layer_of(params[p + 1].name) != layer_of(params[p].name))
        while (b < buffers.size() && layer_of(buffers[b].name) == layer_of(params[p].name)) out.emplace_back(buffers[b++], true);
    }
    while (b < buffers.size()) out.emplace_back(buffers[b++], true);
    return out;
  }

  template <class Body>
  static void for_each_layer(Body&& body) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (body.template operator()<I>(), ...);
    }(std::make_index_sequence<layer_count>{});
  }

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
              fail("Sequential::train_step: layer ", layer, " (", layer_names()[layer],
                   ") is frozen, but the optimizer took the parameters as one flat buffer before the freeze, and "
                   "that cannot leave a layer out; freeze before the optimizer's first step, or give the model a "
                   "new optimizer");
      }
    }
  }
  template <std::size_t... I>
  static constexpr index_t workspace_per_sample(std::index_sequence<I...>) {
    return (index_t{0} + ... + ((bound<I>::aliases_input ? 0 : 2 * bound<I>::output::size) +
                                bound<I>::scratch_per_sample));
  }
  template <std::size_t... I>
  void plan_workspace(std::index_sequence<I...>) {
    index_t sizes[] = {(bound<I>::aliases_input ? 0 : detail::align_up(bound<I>::output::size * max_batch_, 16))...};
    index_t scratch[] = {detail::align_up(bound<I>::scratch_per_sample * max_batch_, 16)...};
    index_t total = 0;
    for (std::size_t i = 0; i < layer_count; ++i) total += 2 * sizes[i] + scratch[i];
    workspace_ = policy_buffer<T>(total);
    T* next = workspace_.data();
    for (std::size_t i = 0; i < layer_count; ++i) {
      activations_[i] = sizes[i] ? next : nullptr;
      next += sizes[i];
      gradients_[i] = sizes[i] ? next : nullptr;
      next += sizes[i];
      scratch_[i] = scratch[i] ? next : nullptr;
      next += scratch[i];
    }
    // The gradient each layer writes for its input: that of the nearest computing layer before it, or none.
    T* current = nullptr;
    bool aliases[] = {bound<I>::aliases_input...};
    for (std::size_t i = 0; i < layer_count; ++i) {
      input_gradients_[i] = current;
      if (!aliases[i]) current = gradients_[i];
    }
    output_grad_ = current;
  }

  // Device policies read host batches from staging buffers of max_batch samples: inputs, real-valued targets and
  // integer labels (which one a loss needs is known only at train_step, and each is small), plus a host copy of the
  // output for metrics. CPU policies read host data in place and plan none of them.
  void plan_staging() {
    if constexpr (!host_accessible) {
      input_stage_ = policy_buffer<T>(max_batch_ * input_shape::size);
      target_stage_ = policy_buffer<T>(max_batch_ * output_shape::size);
      label_stage_ = policy_buffer<std::int64_t>(max_batch_);
      output_host_ = aligned_buffer<T>(max_batch_ * output_shape::size);
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
  // Where the layers read a host batch from: in place on the CPU, its staged copy on a device.
  const T* stage_input(const tensor_view<const T>& x, index_t batch) {
    if constexpr (host_accessible) {
      return x.data();
    } else {
      upload(x.data(), input_stage_.data(), batch * input_shape::size);
      return input_stage_.data();
    }
  }
  template <class Target>
  const Target* stage_target(const tensor_view<const Target>& target) {
    if constexpr (host_accessible) {
      return target.data();
    } else if constexpr (std::is_integral_v<Target>) {
      static_assert(std::is_same_v<Target, std::int64_t>, "kiln::Sequential: integer targets are int64 labels");
      upload(target.data(), label_stage_.data(), target.numel());
      return label_stage_.data();
    } else {
      upload(target.data(), target_stage_.data(), target.numel());
      return target_stage_.data();
    }
  }

  tensor_view<const T> forward_batch(const T* x, index_t batch) {
    layer_context ctx{batch, training_};
    run_forward(x, ctx);
    return {output_pointer(), output_shape::batch_shape(batch)};
  }
  template <class Loss, class Target>
  T forward_backward_batch(const T* x, const Target* target, index_t batch, const Loss& loss) {
    layer_context ctx{batch, true};
    run_forward(x, ctx);
    T value = loss.template forward_backward<Policy>(output_pointer(), target, output_grad_, batch, output_shape::size);
    if (profile_) profile_lap(profile_->loss_seconds);
    run_backward(ctx);
    return value;
  }
  template <class Loss, class Target>
  T loss_value_batch(const T* x, const Target* target, index_t batch, const Loss& loss) {
    layer_context ctx{batch, false};
    run_forward(x, ctx);
    return loss.template forward_backward<Policy>(output_pointer(), target, static_cast<T*>(nullptr), batch,
                                                  output_shape::size);
  }
  template <class Optimizer>
  void update(Optimizer& optimizer) {
    static_assert(detail::optimizer_for_policy<Optimizer, Policy>,
                  "kiln::Sequential: the optimizer must use the model's policy (e.g. optim::basic_adam<float, "
                  "policy::cuda> for a Sequential<policy::cuda, ...>)");
    if (!optimizer.has_parameters()) optimizer.add_parameters(parameters());
    else check_optimizer_slots(optimizer);
    optimizer.step();
    if (profile_) profile_lap(profile_->update_seconds);
  }

  // Evaluation-mode forward over any number of samples; resident: x is in the policy's memory.
  Tensor<T> predict_chunks(const tensor_view<const T>& x, bool resident_input) {
    if (x.rank() == 0 || x.shape().row_size() != input_shape::size)
      fail("Sequential::predict: expected input of shape [*, ", input_shape::str(), " = ", input_shape::size,
           " values per sample], found ", x.shape());
    index_t samples = x.extent(0);
    Tensor<T> out(output_shape::batch_shape(samples));
    bool was_training = training_;
    training_ = false;
    for (index_t first = 0; first < samples; first += max_batch_) {
      index_t count = std::min(max_batch_, samples - first);
      layer_context ctx{count, false};
      const T* chunk = x.data() + first * input_shape::size;
      if (!resident_input) chunk = stage_input(tensor_view<const T>(chunk, input_shape::batch_shape(count)), count);
      run_forward(chunk, ctx);
      T* dst = out.data() + first * output_shape::size;
      if constexpr (host_accessible) Policy::copy(output_pointer(), dst, count * output_shape::size);
      else download(output_pointer(), dst, count * output_shape::size);
    }
    training_ = was_training;
    return out;
  }

  // With fused epilogues, a layer that can apply an activation to its own output (Conv2D: per sample, while the
  // output is in cache) takes over the activation layer after it, which then passes its input through: one pass over
  // the activations fewer, whose traffic to memory dominated the CNN's ReLU layers. Not for an activation whose
  // backward needs its input (GELU), which the fused output no longer holds; the others read only their output.
  template <std::size_t I>
  static constexpr bool takes_next_activation() {
    if constexpr (I + 1 >= layer_count) {
      return false;
    } else {
      using next = layer<I + 1>;
      if constexpr (!requires { next::kind; next::slope; }) {
        return false;
      } else {
        return next::is_activation && next::kind != activation::identity &&
               !activation_grad_needs_input(next::kind) &&
               requires(const T* c, T* m, const layer_context& ctx) {
                 bound<I>::template forward_activated<Policy>(c, m, c, m, m, ctx, next::kind, T(next::slope));
               };
      }
    }
  }

  // With fused epilogues, a layer whose backward can take in the backward of the activation layer before it
  // (MaxPool2D: plane by plane, while each plane's gradient is in cache; Conv2D: sample by sample, after its input
  // gradient's col2im) does, writing the activation's input gradient, and the activation's own backward is skipped:
  // one pass fewer over a CNN's largest tensors.
  template <std::size_t I>
  static constexpr bool takes_previous_activation_backward() {
    if constexpr (I == 0 || I >= layer_count) {
      return false;
    } else {
      using previous = layer<I - 1>;
      if constexpr (!requires { previous::kind; previous::slope; }) {
        return false;
      } else {
        return previous::is_activation && previous::kind != activation::identity &&
               requires(const T* c, T* m, const layer_context& ctx) {
                 bound<I>::template backward_activated<Policy>(c, c, c, m, m, m, m, ctx, previous::kind, c,
                                                               T(previous::slope));
               };
      }
    }
  }

  // With fused epilogues, a layer whose backward can take in the ReLU's backward of the Dense layer below it, whose
  // output is its input (Dense over Dense<N, ReLU>: the head's two products and the ReLU's backward in one pass,
  // policy::cpu's dense_backward_through_relu), does where it applies at run time, and that layer's backward then
  // skips its ReLU's.
  template <std::size_t I>
  static constexpr bool takes_previous_relu_backward() {
    if constexpr (I == 0 || I >= layer_count) {
      return false;
    } else {
      using below = layer<I - 1>;
      if constexpr (!requires { below::fused_activation; }) {
        return false;
      } else {
        return below::fused_activation == activation::relu &&
               requires(const T* c, T* m, const layer_context& ctx) {
                 bound<I>::template backward_through_relu<Policy>(c, c, c, m, m, m, m, ctx);
                 bound<I - 1>::template backward_preactivated<Policy>(c, c, c, m, m, m, m, ctx);
               };
      }
    }
  }

  void run_forward(const T* x, const layer_context& ctx) {
    last_batch_ = ctx.batch;
    const T* in = x;
    for_each_layer([&]<std::size_t I>() {
      using B = bound<I>;
      T* out = B::aliases_input ? const_cast<T*>(in) : activations_[I];
      bool done = false;
      if constexpr (I > 0) {  // (nested: the index I - 1 must not be formed for the first layer)
        if constexpr (takes_next_activation<I - 1>()) {
          if (options_.fuse_epilogues) {  // applied by layer I - 1 already: pass its output through
            out = const_cast<T*>(in);
            done = true;
          }
        }
      }
      if constexpr (takes_next_activation<I>()) {
        if (options_.fuse_epilogues) {
          B::template forward_activated<Policy>(params_.data() + param_offsets[I], buffers_.data() + buffer_offsets[I],
                                                in, out, scratch_[I], context_of<I>(ctx), layer<I + 1>::kind,
                                                T(layer<I + 1>::slope));
          done = true;
        }
      }
      if (!done)
        B::template forward<Policy>(params_.data() + param_offsets[I], buffers_.data() + buffer_offsets[I], in, out,
                                    scratch_[I], context_of<I>(ctx), options_.fuse_epilogues);
      inputs_[I] = in;
      outputs_[I] = out;
      in = out;
      if (profile_) profile_lap(profile_->forward_seconds[I]);
    });
    output_ = in;
  }

  // Runs right after run_forward, within one call: each layer's input is as the forward saw it.
  void run_backward(const layer_context& forward_ctx) {
    relu_backward_taken_ = false;
    layer_context ctx = forward_ctx;
    ctx.input_as_in_forward = true;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_layer<layer_count - 1 - I>(ctx), ...);
    }(std::make_index_sequence<layer_count>{});
  }
  template <std::size_t I>
  void backward_layer(const layer_context& ctx) {
    using B = bound<I>;
    bool done = false;
    if constexpr (takes_previous_activation_backward<I>()) {
      if (options_.fuse_epilogues) {  // dx: the activation's input gradient, or null where none is wanted
        B::template backward_activated<Policy>(params_.data() + param_offsets[I], inputs_[I], outputs_[I],
                                               gradients_[I], input_gradients_[I - 1],
                                               grads_.data() + param_offsets[I], scratch_[I], context_of<I>(ctx),
                                               layer<I - 1>::kind, inputs_[I - 1], T(layer<I - 1>::slope));
        done = true;
      }
    }
    if constexpr (takes_previous_activation_backward<I + 1>())
      if (options_.fuse_epilogues) done = true;  // taken in by layer I + 1
    if constexpr (takes_previous_relu_backward<I + 1>()) {
      if (relu_backward_taken_) {  // layer I + 1 took this layer's ReLU's backward in
        relu_backward_taken_ = false;
        B::template backward_preactivated<Policy>(params_.data() + param_offsets[I], inputs_[I], outputs_[I],
                                                  gradients_[I], input_gradients_[I],
                                                  grads_.data() + param_offsets[I], scratch_[I], context_of<I>(ctx));
        done = true;
      }
    }
    if constexpr (takes_previous_relu_backward<I>()) {
      if (options_.fuse_epilogues && !done)  // its dx: the layer below's pre-activation gradient
        done = relu_backward_taken_ = B::template backward_through_relu<Policy>(
            params_.data() + param_offsets[I], inputs_[I], outputs_[I], gradients_[I], input_gradients_[I],
            grads_.data() + param_offsets[I], scratch_[I], context_of<I>(ctx));
    }
    if constexpr (!B::aliases_input) {
      if (!done)
        B::template backward<Policy>(params_.data() + param_offsets[I], inputs_[I], outputs_[I], gradients_[I],
                                     input_gradients_[I], grads_.data() + param_offsets[I], scratch_[I],
                                     context_of<I>(ctx));
    }
    if (profile_) profile_lap(profile_->backward_seconds[I]);
  }
  // The context layer I sees: the pass's, with the layer's own generator if it draws.
  template <std::size_t I>
  layer_context context_of(const layer_context& ctx) {
    layer_context own = ctx;
    if constexpr (detail::draws_at_run_time<bound<I>>()) own.rng = &generators_[runtime_index[I]];
    return own;
  }

  const T* output_pointer() const { return output_; }

  template <class Loss, class Optimizer>
  T profiled_step(tensor_view<const T> x, tensor_view<const typename Loss::template target_type<T>> target,
                  const Loss& loss, Optimizer& optimizer, step_profile& profile, bool resident_batch) {
    index_t batch = check_input(x, "Sequential::train_step");
    check_target<Loss>(target, batch);
    detail::prepare_profile(profile, layer_names(), "Sequential::train_step");
    struct detach {  // the model stops timing when the step ends, also by an exception
      step_profile*& slot;
      ~detach() { slot = nullptr; }
    } stop{profile_};
    Policy::synchronize();
    profile_clock_.start();
    profile_ = &profile;
    const T* staged_x = resident_batch ? x.data() : stage_input(x, batch);
    const auto* staged_target = resident_batch ? target.data() : stage_target(target);
    profile_lap(profile.staging_seconds);
    T value = forward_backward_batch(staged_x, staged_target, batch, loss);
    update(optimizer);
    ++profile.steps;
    return value;
  }
  // The layers' descriptions, as summary() shows them: fixed by the type, so made once rather than every profiled step.
  static const std::vector<std::string>& layer_names() {
    static const std::vector<std::string> names = [] {
      std::vector<std::string> out;
      for (auto& row : summary_rows()) out.push_back(row.name);
      return out;
    }();
    return names;
  }
  // Adds the time since the previous lap of a profiled step to `slot`, once the policy's work so far has finished.
  void profile_lap(double& slot) {
    Policy::synchronize();
    profile_clock_.lap(slot);
  }

  index_t check_input(const tensor_view<const T>& x, const char* where) const {
    if (x.rank() == 0 || x.shape().row_size() != input_shape::size)
      fail(where, ": expected input of shape [batch, ", input_shape::str(), "] (", input_shape::size,
           " values per sample), found ", x.shape());
    // Channels-last images ([N, 32, 32, 3] for Input<3, 32, 32>) hold as many values per sample, in another order;
    // a flat [N, 3072], or [N, 28, 28] for Input<784>, is a reshape.
    if (input_shape::is_other_layout(x.shape(), 1))
      fail(where, ": expected input of shape [batch, ", input_shape::str(), "], found ", x.shape(),
           " (the same number of values per sample, in another layout: channels last? reshape it if the "
           "values are already in the input's order)");
    index_t batch = x.extent(0);
    if (batch < 1 || batch > max_batch_)
      fail(where, ": expected a batch of 1 to ", max_batch_, " samples (the maximum this model was planned for), found ",
           batch);
    return batch;
  }
  template <class Loss, class Target>
  void check_target(const tensor_view<const Target>& target, index_t batch) const {
    index_t expected = std::is_integral_v<Target> ? batch : batch * output_shape::size;
    if (target.numel() != expected)
      fail(Loss::name, ": expected ", expected, std::is_integral_v<Target> ? " labels" : " target values",
           " for a batch of ", batch, " with output ", output_shape::str(), ", found target of shape ",
           target.shape());
  }

  index_t max_batch_;
  static_options options_;
  bool relu_backward_taken_ = false;  // in a backward pass: the last layer run took in the ReLU backward below it
  bool training_ = true;
  policy_buffer<T> params_, grads_, buffers_;
  std::array<random_generator, runtime_generator_count> generators_;
  policy_buffer<T> workspace_;
  // Staging for host batches on device policies (empty on the CPU): see plan_staging.
  policy_buffer<T> input_stage_, target_stage_;
  policy_buffer<std::int64_t> label_stage_;
  aligned_buffer<T> output_host_;
  std::array<T*, layer_count> activations_{}, gradients_{}, scratch_{}, input_gradients_{};
  std::array<const T*, layer_count> inputs_{};
  std::array<T*, layer_count> outputs_{};
  T* output_grad_ = nullptr;
  const T* output_ = nullptr;
  index_t last_batch_ = 0;
  // Per-layer trainable flags on the heap: optimizer slots point at them, and they survive moving the model.
  std::shared_ptr<std::array<bool, layer_count>> trainable_ = [] {
    auto flags = std::make_shared<std::array<bool, layer_count>>();
    flags->fill(true);
    return flags;
  }();
  bool any_frozen_ = false;
  step_profile* profile_ = nullptr;  // set during a profiled train_step
  detail::profile_clock profile_clock_;
};

}  // namespace kiln
