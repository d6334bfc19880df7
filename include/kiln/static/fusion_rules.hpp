// Static mode's fusions, as one list of rewrite rules over a chain of layers. The executor (static/executor.hpp) asks
// the rules, before each pass, how each position runs; it holds no code that names a layer or a pair of layers, and
// passes no flags from one layer to the next.
//
// The rules, in the order they are tried (the first that matches a position and applies to the pass wins):
//   0. epilogue (inside a layer, no rewrite): a layer's own bias and activation in its product's epilogue (Dense's
//      GEMM, Conv2D's per-sample pass). Every forward receives static_options::fuse_epilogues as its `fuse`
//      argument, and the layer decides how to use it (layers/layer_contract.hpp, forward).
//   1. activation_into_producer (forward): a layer with forward_activated, followed by an activation layer whose
//      gradient needs only its output, applies that activation to its own output; the activation layer's forward
//      passes its input through.
//   2. activation_backward_into_consumer (backward): a layer with backward_activated, after an activation layer, runs
//      that activation's backward within its own (writing the activation's input gradient); the activation layer's
//      backward is skipped.
//   3. relu_backward_into_head (backward): a layer with backward_through_relu, over a layer with a fused ReLU and
//      backward_preactivated, computes the lower layer's pre-activation gradient in its own pass where its kernel
//      admits the pass (backward_through_relu_applies); the lower layer then runs backward_preactivated.
// Softmax with cross-entropy needs no rule: loss::cross_entropy takes the logits and runs the softmax, the loss and its
// gradient in one kernel, so a model ends in the layer that gives the logits.
//
// A rule is a type with:
//   name                                   what it fuses, for messages and docs
//   partner                                +1: the rule also runs the position after its anchor (forward rules);
//                                          -1: the position before it (backward rules)
//   matches<G, I>()                        constexpr: the pattern holds with position I of plan G as the anchor
//   applies<G, I>(pass)                    whether it applies to this pass: a pure function of the pass (the options,
//                                          the batch, the policy's settings), asked once per pass and position
//   anchor<G, I>(executor, pass)           runs the anchor position
//   partner_run<G, I>(executor, pass)      runs the partner position I (anchor + partner)
// A position that is a partner of the rule chosen at its neighbour runs as that rule says, and is not an anchor
// itself. Every rule must give what the unfused layers give, within float rounding (every existing test asks for the
// same bits).
#pragma once

#include <cstddef>

#include "kiln/kernels/activation.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln::fusion {

template <class... Rules>
struct rule_list {
  static constexpr std::size_t size = sizeof...(Rules);
};

namespace detail {
// Layer I of plan G is an activation layer with a kind other than identity.
template <class G, std::size_t I>
constexpr bool is_activation_layer() {
  if constexpr (I >= G::layer_count) {
    return false;
  } else {
    using L = typename G::template layer<I>;
    if constexpr (requires { L::kind; L::slope; }) return L::is_activation && L::kind != activation::identity;
    else return false;
  }
}
}  // namespace detail

// 1. An activation taken into the forward of the layer before it.
struct activation_into_producer {
  static constexpr const char* name = "activation into the layer before it (forward)";
  static constexpr int partner = +1;
  template <class G, std::size_t I>
  static constexpr bool matches() {
    if constexpr (!detail::is_activation_layer<G, I + 1>()) {
      return false;
    } else {
      using A = typename G::template layer<I + 1>;
      using B = typename G::template bound<I>;
      using T = typename G::T;
      using P = typename G::policy;
      return !activation_grad_needs_input(A::kind) && requires(const T* c, T* m, const layer_context& ctx) {
        B::template forward_activated<P>(c, m, c, m, m, ctx, A::kind, T(A::slope));
      };
    }
  }
  template <class G, std::size_t I, class Pass>
  static bool applies(const Pass& pass) {
    return pass.fuse;
  }
  template <class G, std::size_t I, class X, class Pass>
  static void anchor(X& x, const Pass& pass) {
    using A = typename G::template layer<I + 1>;
    using T = typename G::T;
    const auto m = x.template at<I>(pass);
    G::template bound<I>::template forward_activated<typename G::policy>(m.params, m.buffers, m.x, m.y, m.scratch,
                                                                         m.ctx, A::kind, T(A::slope));
  }
  template <class G, std::size_t I, class X, class Pass>
  static void partner_run(X& x, const Pass&) {
    x.template pass_through<I>();
  }
};

// 2. An activation's backward taken into the backward of the layer after it.
struct activation_backward_into_consumer {
  static constexpr const char* name = "activation backward into the layer after it (backward)";
  static constexpr int partner = -1;
  template <class G, std::size_t I>
  static constexpr bool matches() {
    if constexpr (I == 0 || !detail::is_activation_layer<G, (I > 0 ? I - 1 : 0)>()) {
      return false;
    } else {
      using A = typename G::template layer<I - 1>;
      using B = typename G::template bound<I>;
      using T = typename G::T;
      using P = typename G::policy;
      return requires(const T* c, T* m, const layer_context& ctx) {
        B::template backward_activated<P>(c, c, c, m, m, m, m, ctx, A::kind, c, T(A::slope));
      };
    }
  }
  template <class G, std::size_t I, class Pass>
  static bool applies(const Pass& pass) {
    return pass.fuse;
  }
  // dx: the activation's input gradient (null where none is wanted); act_input: the activation's input, or its output
  // where rule 1 took the activation into the layer before it.
  template <class G, std::size_t I, class X, class Pass>
  static void anchor(X& x, const Pass& pass) {
    using A = typename G::template layer<I - 1>;
    using T = typename G::T;
    const auto m = x.template at<I>(pass);
    const auto below = x.template at<I - 1>(pass);
    G::template bound<I>::template backward_activated<typename G::policy>(
        m.params, m.x, m.y, m.dy, below.dx, m.dparams, m.scratch, m.ctx, A::kind, below.x, T(A::slope));
  }
  template <class G, std::size_t I, class X, class Pass>
  static void partner_run(X&, const Pass&) {}  // the activation's backward ran inside the anchor's
};

// 3. The ReLU backward of a layer with a fused ReLU, taken into the backward of the layer after it.
struct relu_backward_into_head {
  static constexpr const char* name = "fused ReLU's backward into the layer after it (backward)";
  static constexpr int partner = -1;
  template <class G, std::size_t I>
  static constexpr bool matches() {
    if constexpr (I == 0) {
      return false;
    } else {
      using Below = typename G::template layer<I - 1>;
      if constexpr (!requires { Below::fused_activation; }) {
        return false;
      } else {
        using B = typename G::template bound<I>;
        using D = typename G::template bound<I - 1>;
        using T = typename G::T;
        using P = typename G::policy;
        return Below::fused_activation == activation::relu &&
               requires(const T* c, T* m, const layer_context& ctx) {
                 { B::template backward_through_relu_applies<P, T>(ctx) } -> std::same_as<bool>;
                 B::template backward_through_relu<P>(c, c, c, m, m, m, m, ctx);
                 D::template backward_preactivated<P>(c, c, c, m, m, m, m, ctx);
               };
      }
    }
  }
  template <class G, std::size_t I, class Pass>
  static bool applies(const Pass& pass) {
    using T = typename G::T;
    return pass.fuse &&
           G::template bound<I>::template backward_through_relu_applies<typename G::policy, T>(pass.ctx);
  }
  // dx: the gradient of the layer below's pre-activation.
  template <class G, std::size_t I, class X, class Pass>
  static void anchor(X& x, const Pass& pass) {
    const auto m = x.template at<I>(pass);
    G::template bound<I>::template backward_through_relu<typename G::policy>(m.params, m.x, m.y, m.dy, m.dx,
                                                                             m.dparams, m.scratch, m.ctx);
  }
  template <class G, std::size_t I, class X, class Pass>
  static void partner_run(X& x, const Pass& pass) {
    const auto m = x.template at<I>(pass);
    G::template bound<I>::template backward_preactivated<typename G::policy>(m.params, m.x, m.y, m.dy, m.dx,
                                                                             m.dparams, m.scratch, m.ctx);
  }
};

using forward_rules = rule_list<activation_into_producer>;
using backward_rules = rule_list<activation_backward_into_consumer, relu_backward_into_head>;

}  // namespace kiln::fusion
