// ONNX export of the blocks that branch and join (kiln/io/onnx.hpp has the table of operators): static mode's
// kiln::Chain, Residual (with or without a Shortcut), Add and Concat, and, through the same two joins, dynamic mode's
// nn::Residual, nn::Add and nn::Concat (kiln/io/onnx_dynamic.hpp). A block writes each branch's nodes from the block's
// input in turn, then joins the branches' values: with Add nodes, one per term after the first, in the order kiln sums
// them (the shortcut or the input, then the body; branch 0, 1, 2, ...), so that onnxruntime rounds as kiln does; or
// with one Concat node along the block's dim (PyTorch's numbering: the batch is dim 0). Blocks nest, since a branch is
// any layer or chain, blocks included, and every layer in them is written as at the top of a model, its weights named
// as in the model's state_dict ("1.body.0.weight", "1.shortcut.0.weight", "2.0.1.weight").
//
// Static mode walks the layer types: onnx_emit_layers writes a chain of layers, each under its state_dict prefix
// ("<prefix><i>.", a layer with a fused activation counting as two modules, as Sequential names them), handing a
// block to its onnx_emit_block overload and any other layer to its onnx_emit overload with its own state_dict entries.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/static/blocks.hpp"

namespace kiln::io {

// --- the joins, for both modes -------------------------------------------------------------------------------------
// The sum of terms, left to right, becomes the current value; labels[t] says where term t comes from, for messages
// ("the input", "the body"; "branch 1"). The terms must have one shape, or with broadcast (nn::Add, whose sum
// broadcasts) one rank and the batch at one place, each extent agreeing or 1, as kiln and ONNX's Add broadcast alike.
inline void onnx_add(onnx_builder& b, const std::vector<onnx_value>& terms, const std::vector<std::string>& labels,
                     const char* block, bool broadcast) {
  onnx_value sum = terms.at(0);
  for (std::size_t t = 1; t < terms.size(); ++t) {
    const onnx_value& term = terms[t];
    bool fits = term.batch_axis == sum.batch_axis && term.sample.size() == sum.sample.size();
    std::vector<index_t> joined = sum.sample;
    for (std::size_t d = 0; fits && d < joined.size(); ++d) {
      const index_t l = sum.sample[d], r = term.sample[d];
      if (l == r) continue;
      fits = broadcast && (l == 1 || r == 1);
      joined[d] = l == 1 ? r : l;
    }
    if (!fits)
      fail("export_onnx: ", block, " expects ", labels.at(t), " to give the shape of ",
           t > 1 ? std::string("the branches before it") : labels.at(0),
           broadcast ? " (or one of its rank that broadcasts with it)" : "", ", found ", onnx_builder::shape_text(term),
           " and ", onnx_builder::shape_text(sum));
    std::string y = b.fresh("add");
    b.add_node(onnx_builder::node("Add", {sum.name, term.name}, y));
    sum = {y, std::move(joined), sum.batch_axis};
  }
  b.set_current(std::move(sum));
}

// The parts joined along dim (PyTorch's numbering, the batch's dim included; negative counts from the end) become the
// current value. The parts must have one rank and the batch at one place, other than dim, and agree outside dim.
inline void onnx_concat(onnx_builder& b, const std::vector<onnx_value>& parts, const std::vector<std::string>& labels,
                        const char* block, int dim) {
  const onnx_value& first = parts.at(0);
  const int rank = static_cast<int>(first.sample.size()) + 1;
  const int axis = dim < 0 ? dim + rank : dim;
  if (axis < 0 || axis >= rank)
    fail("export_onnx: ", block, " along dim ", dim, " expects a value of rank > ", dim < 0 ? -dim - 1 : dim,
         ", found ", labels.at(0), " of shape ", onnx_builder::shape_text(first));
  if (axis == first.batch_axis)
    fail("export_onnx: ", block, " along dim ", dim, " would join ", labels.at(0), " of shape ",
         onnx_builder::shape_text(first), " along its batch dimension, which is not exported");
  // Where dim is in the per-sample shape.
  const auto at = static_cast<std::size_t>(axis < first.batch_axis ? axis : axis - 1);
  std::vector<index_t> joined = first.sample;
  for (std::size_t p = 1; p < parts.size(); ++p) {
    const onnx_value& part = parts[p];
    bool fits = part.batch_axis == first.batch_axis && part.sample.size() == first.sample.size();
    for (std::size_t d = 0; fits && d < joined.size(); ++d) fits = d == at || part.sample[d] == first.sample[d];
    if (!fits)
      fail("export_onnx: ", block, " along dim ", dim, " expects ", labels.at(0), " and ", labels.at(p),
           " to agree outside dim ", dim, ", found ", onnx_builder::shape_text(first), " and ",
           onnx_builder::shape_text(part));
    joined[at] += part.sample[at];
  }
  if (parts.size() == 1) {
    b.set_current(first);
    return;
  }
  std::vector<std::string> inputs;
  for (const auto& part : parts) inputs.push_back(part.name);
  std::string y = b.fresh("concat");
  auto n = onnx_builder::node("Concat", inputs, y);
  onnx_builder::attr_int(n, "axis", axis);
  b.add_node(std::move(n));
  b.set_current({y, std::move(joined), first.batch_axis});
}

// --- static mode -----------------------------------------------------------------------------------------------------
// A static model's state_dict: (name, tensor) pairs, as Sequential::state_dict() gives them.
using onnx_state_dict = std::vector<std::pair<std::string, Tensor<float>>>;

// A layer that is not a block exports through an onnx_emit overload taking its state_dict entries.
template <class L>
concept onnx_exportable = requires(onnx_builder& b, const L& l, const std::vector<const Tensor<float>*>& p) {
  onnx_emit(b, l, p);
};

namespace detail {

// Stops the build naming the layer (Layer in the compiler's message) that has no ONNX export.
template <class Layer>
struct onnx_layer_check {
  static constexpr bool value = onnx_exportable<Layer>;
  static_assert(value, "kiln::io::export_onnx: this layer (Layer) has no ONNX export: no onnx_emit overload takes it");
};

// How many PyTorch modules a layer stands for in the state_dict's numbering: two for a layer with a fused activation
// (Dense<16, ReLU> is Linear then ReLU), one otherwise, as Sequential and the blocks count them (the layer contract's
// fused_activation, layers/layer_contract.hpp).
template <class L>
constexpr int onnx_torch_modules() {
  if constexpr (requires { L::fused_activation; }) return L::fused_activation != activation::identity ? 2 : 1;
  else return 1;
}

// The state_dict entries of the layer at prefix ("1.body.0."): its own, not a sub-layer's, in state_dict order
// (parameters, then buffers).
inline std::vector<const Tensor<float>*> onnx_layer_entries(const onnx_state_dict& dict, const std::string& prefix) {
  std::vector<const Tensor<float>*> entries;
  for (const auto& [name, tensor] : dict)
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.find('.', prefix.size()) == std::string::npos)
      entries.push_back(&tensor);
  return entries;
}

template <class... Layers>
void onnx_emit_layers(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix);

// One layer under its state_dict prefix: a block through its onnx_emit_block overload, any other through onnx_emit.
template <class L>
void onnx_emit_static(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
  if constexpr (requires { onnx_emit_block(b, L{}, dict, prefix); }) {
    onnx_emit_block(b, L{}, dict, prefix);
  } else if constexpr (onnx_layer_check<L>::value) {
    b.set_parameter_prefix(prefix);
    onnx_emit(b, L{}, onnx_layer_entries(dict, prefix));
  }
}

// Layers one after another, the i-th PyTorch module under "<prefix><i>.".
template <class... Layers>
void onnx_emit_layers(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
  int torch_index = 0;
  ((onnx_emit_static<Layers>(b, dict, prefix + std::to_string(torch_index) + "."),
    torch_index += onnx_torch_modules<Layers>()),
   ...);
}

// A branch of an Add or a Concat under its prefix ("2.0."): a Chain's layers, or one layer as a chain of one.
template <class Branch>
struct onnx_branch {
  static void emit(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
    onnx_emit_layers<Branch>(b, dict, prefix);
  }
};
template <class... L>
struct onnx_branch<Chain<L...>> {
  static void emit(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
    onnx_emit_layers<L...>(b, dict, prefix);
  }
};

// Every branch from the block's input, branch i under "<prefix><i>."; their values, and "branch <i>" for messages.
template <class... Branches>
std::pair<std::vector<onnx_value>, std::vector<std::string>> onnx_emit_branches(onnx_builder& b,
                                                                               const onnx_state_dict& dict,
                                                                               const std::string& prefix) {
  const onnx_value x = b.value();
  std::vector<onnx_value> values;
  std::vector<std::string> labels;
  std::size_t i = 0;
  ((b.set_current(x), onnx_branch<Branches>::emit(b, dict, prefix + std::to_string(i) + "."),
    values.push_back(b.value()), labels.push_back("branch " + std::to_string(i)), ++i),
   ...);
  return {std::move(values), std::move(labels)};
}

// The two forms of a residual block's layers: the body alone, or a Shortcut and the body.
template <class... Layers>
struct onnx_residual {
  static constexpr bool has_shortcut = false;
  static void body(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
    onnx_emit_layers<Layers...>(b, dict, prefix);
  }
  static void shortcut(onnx_builder&, const onnx_state_dict&, const std::string&) {}
};
template <class... S, class... Layers>
struct onnx_residual<Shortcut<S...>, Layers...> {
  static constexpr bool has_shortcut = true;
  static void body(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
    onnx_emit_layers<Layers...>(b, dict, prefix);
  }
  static void shortcut(onnx_builder& b, const onnx_state_dict& dict, const std::string& prefix) {
    onnx_emit_layers<S...>(b, dict, prefix);
  }
};

}  // namespace detail

// Chain: its layers in turn, each under "<prefix><i>.".
template <class... Layers>
void onnx_emit_block(onnx_builder& b, const Chain<Layers...>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  detail::onnx_emit_layers<Layers...>(b, dict, prefix);
}

// Residual: the body under "<prefix>body.", the shortcut (if any) under "<prefix>shortcut.", both from the block's
// input, then shortcut (or input) + body.
template <class... Layers>
void onnx_emit_block(onnx_builder& b, const Residual<Layers...>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  using parts = detail::onnx_residual<Layers...>;
  const onnx_value x = b.value();
  parts::body(b, dict, prefix + "body.");
  const onnx_value f = b.value();
  onnx_value s = x;
  if constexpr (parts::has_shortcut) {
    b.set_current(x);
    parts::shortcut(b, dict, prefix + "shortcut.");
    s = b.value();
  }
  onnx_add(b, {s, f}, {parts::has_shortcut ? "the shortcut" : "the input", "the body"}, "Residual", false);
}

// Add: every branch from the block's input, then their sum in branch order.
template <class... Branches>
void onnx_emit_block(onnx_builder& b, const Add<Branches...>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  auto [values, labels] = detail::onnx_emit_branches<Branches...>(b, dict, prefix);
  onnx_add(b, values, labels, "Add", false);
}

// Concat: every branch from the block's input, then one Concat node along Axis (the batch is axis 0).
template <int Axis, class... Branches>
void onnx_emit_block(onnx_builder& b, const Concat<Axis, Branches...>&, const onnx_state_dict& dict,
                     const std::string& prefix) {
  auto [values, labels] = detail::onnx_emit_branches<Branches...>(b, dict, prefix);
  onnx_concat(b, values, labels, "Concat", Axis);
}

}  // namespace kiln::io
