// The plan of a static model, all of it fixed by the model's type: the layers bound to their input shapes, where each
// layer's parameters and buffers sit in the flat buffers, which layers draw random numbers at run time, and the names
// every parameter and buffer takes in state_dict. static/state.hpp keeps the values the plan lays out,
// static/executor.hpp runs the layers over them, static/sequential.hpp puts the three together.
//
// Names follow torch.nn.Sequential for the same modules: "<module index>.<name>", where a layer with a fused
// activation (Dense<N, ReLU>) counts as two modules, the Linear and then the activation, and a block (static/blocks.hpp)
// adds its own part between the index and the name ("1.body.0.weight", "1.shortcut.0.weight", "2.0.1.weight" for
// branch 0 of an Add or a Concat), as PyTorch names the same nesting of modules.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/static_shape.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/optim/parameter.hpp"
#include "kiln/static/input.hpp"
#include "kiln/static/layer_traits.hpp"
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
}  // namespace detail

template <class Policy, class InputSpec, class... Layers>
struct static_plan {
  static_assert(sizeof...(Layers) > 0, "kiln::Sequential needs at least one layer after the Input");
  using T = typename InputSpec::value_type;
  using policy = Policy;
  using input_shape = typename InputSpec::shape;
  using binding = bind_layers<InputSpec, input_shape, Layers...>;
  using output_shape = typename binding::output;
  static constexpr std::size_t layer_count = sizeof...(Layers);
  using bound_tuple = typename detail::list_to_tuple<typename binding::type>::type;
  // Layer I as written in the type list, and bound to its input shape.
  template <std::size_t I>
  using layer = std::tuple_element_t<I, std::tuple<Layers...>>;
  template <std::size_t I>
  using bound = std::tuple_element_t<I, bound_tuple>;

  template <class Body>
  static constexpr void for_each_layer(Body&& body) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (body.template operator()<I>(), ...);
    }(std::make_index_sequence<layer_count>{});
  }

  // Where each layer's parameters start in the flat buffer (16-aligned; [layer_count] is the buffer's size), and its
  // buffers in the flat buffer of buffers.
  static constexpr auto param_offsets = [] {
    std::array<index_t, layer_count + 1> offsets{};
    for_each_layer([&]<std::size_t I>() {
      offsets[I + 1] = offsets[I] + detail::align_up(bound<I>::param_count, detail::parameter_alignment);
    });
    return offsets;
  }();
  static constexpr auto buffer_offsets = [] {
    std::array<index_t, layer_count + 1> offsets{};
    for_each_layer([&]<std::size_t I>() { offsets[I + 1] = offsets[I] + detail::buffer_count_of<bound<I>>(); });
    return offsets;
  }();
  // The layers that draw at run time own generators [runtime_index[I], runtime_index[I] + their count);
  // runtime_index[layer_count] is how many there are in all.
  static constexpr auto runtime_index = [] {
    std::array<std::size_t, layer_count + 1> index{};
    for_each_layer([&]<std::size_t I>() { index[I + 1] = index[I] + detail::runtime_generators_of<bound<I>>(); });
    return index;
  }();
  static constexpr std::size_t runtime_generator_count = runtime_index[layer_count];
  // Whether layer I computes (its output is memory of its own) or only reshapes its input (Flatten).
  static constexpr auto computes = [] {
    std::array<bool, layer_count> c{};
    for_each_layer([&]<std::size_t I>() { c[I] = !bound<I>::aliases_input; });
    return c;
  }();
  static_assert([] {
    for (bool c : computes)
      if (c) return true;
    return false;
  }(), "kiln::Sequential: every layer only reshapes its input; add a layer that computes something");
  // The torch.nn.Sequential index of layer I's module.
  static constexpr auto module_index = [] {
    std::array<int, layer_count + 1> index{};
    for_each_layer([&]<std::size_t I>() { index[I + 1] = index[I] + detail::torch_modules<layer<I>>(); });
    return index;
  }();

  // Total parameter elements including alignment padding between layers (the padding stays zero).
  static constexpr index_t flat_parameter_size = param_offsets[layer_count];
  // Total non-trainable state (running statistics), kept in a second flat buffer.
  static constexpr index_t flat_buffer_size = buffer_offsets[layer_count];

  // Number of parameters (without alignment padding).
  static constexpr index_t parameter_count() {
    index_t n = 0;
    for_each_layer([&]<std::size_t I>() { n += detail::parameter_values_of<bound<I>>(); });
    return n;
  }

  // The layer whose part of the flat parameter buffer holds `offset`.
  static std::size_t layer_holding(index_t offset) {
    std::size_t layer = 0;
    while (layer + 1 < layer_count && param_offsets[layer + 1] <= offset) ++layer;
    return layer;
  }

  // Every parameter tensor by state_dict name, with offsets into the flat buffer.
  static std::vector<static_parameter_info> named_parameter_infos() { return named_infos(false); }
  // Every buffer (running statistics) by state_dict name, with offsets into the flat buffer of buffers.
  static std::vector<static_parameter_info> named_buffer_infos() { return named_infos(true); }

  // Parameters and buffers in state_dict order: layer by layer, a layer's parameters before its buffers; second: is a
  // buffer.
  static std::vector<std::pair<static_parameter_info, bool>> state_infos() {
    std::vector<std::pair<static_parameter_info, bool>> out;
    for_each_layer([&]<std::size_t I>() {
      for (auto& info : layer_infos<I>(false)) out.emplace_back(std::move(info), false);
      for (auto& info : layer_infos<I>(true)) out.emplace_back(std::move(info), true);
    });
    return out;
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

  // One row per layer: the table behind Model::summary().
  static std::vector<layer_summary> summary_rows() {
    std::vector<layer_summary> rows;
    for_each_layer([&]<std::size_t I>() {
      using out = typename bound<I>::output;
      rows.push_back({bound<I>::description(), out::batch_shape(1), detail::parameter_values_of<bound<I>>()});
    });
    return rows;
  }
  // The layers' descriptions, as summary() shows them: fixed by the type, so made once.
  static const std::vector<std::string>& layer_names() {
    static const std::vector<std::string> names = [] {
      std::vector<std::string> out;
      for (auto& row : summary_rows()) out.push_back(row.name);
      return out;
    }();
    return names;
  }

 private:
  template <std::size_t I>
  static std::vector<static_parameter_info> layer_infos(bool buffers) {
    std::vector<static_parameter_info> out;
    const std::string prefix = std::to_string(module_index[I]) + ".";
    if (buffers) {
      if constexpr (detail::has_buffers<bound<I>>)
        for (auto info : bound<I>::buffer_tensors()) {
          info.name = prefix + info.name;
          info.offset += buffer_offsets[I];
          out.push_back(std::move(info));
        }
    } else {
      if constexpr (detail::describes_parameters<bound<I>>)
        for (auto info : bound<I>::parameter_tensors()) {
          info.name = prefix + info.name;
          info.offset += param_offsets[I];
          out.push_back(std::move(info));
        }
    }
    return out;
  }
  static std::vector<static_parameter_info> named_infos(bool buffers) {
    std::vector<static_parameter_info> out;
    for_each_layer([&]<std::size_t I>() {
      for (auto& info : layer_infos<I>(buffers)) out.push_back(std::move(info));
    });
    return out;
  }
};

}  // namespace kiln
