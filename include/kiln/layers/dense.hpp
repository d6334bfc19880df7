// Dense (PyTorch's Linear): y = act(x W^T + b) with W stored (out, in) as in PyTorch. The math lives here once;
// static mode's kiln::Dense and dynamic mode's nn::Linear both call dense_forward and dense_backward.
#pragma once

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/init.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

namespace dense_detail {
// The policy's sparse-input products (kernels/cpu/dense_sparse_input.hpp), where it has them: each returns false,
// computing nothing, where the input is not mostly one value, and the caller then runs its GEMM.
template <class Policy, class T>
bool forward_sparse_input(const T* x, const T* weight, const T* bias, T* y, index_t batch, index_t in, index_t out,
                          activation act, T slope) {
  if constexpr (requires { requires Policy::sparse_input_products; })
    return Policy::dense_forward_sparse_input(x, weight, bias, y, batch, in, out, act, slope);
  (void)x, (void)weight, (void)bias, (void)y, (void)batch, (void)in, (void)out, (void)act, (void)slope;
  return false;
}
template <class Policy, class T>
bool weight_gradient_sparse_input(const T* x, const T* dy, T* dweight, index_t batch, index_t in, index_t out,
                                  bool accumulate) {
  if constexpr (requires { requires Policy::sparse_input_products; })
    return Policy::dense_weight_gradient_sparse_input(x, dy, dweight, batch, in, out, accumulate);
  (void)x, (void)dy, (void)dweight, (void)batch, (void)in, (void)out, (void)accumulate;
  return false;
}
}  // namespace dense_detail

// y[batch, out] = act(x[batch, in] W[out, in]^T + b[out]). bias may be null. With a GELU, whose derivative needs the
// pre-activation, pre_activation (batch x out) receives it; for the other activations it may be null. An input
// mostly of one value (as images with a blank background are) takes the policy's sparse-input product where it takes
// them (policy::cpu_sparse_input).
template <class Policy, class T>
void dense_forward(const T* x, const T* weight, const T* bias, T* y, index_t batch, index_t in, index_t out,
                   activation act = activation::identity, T slope = T(0.01), T* pre_activation = nullptr) {
  if (activation_grad_needs_input(act) && pre_activation) {
    if (!dense_detail::forward_sparse_input<Policy>(x, weight, bias, pre_activation, batch, in, out,
                                                    activation::identity, slope))
      Policy::gemm(false, true, batch, out, in, T(1), x, in, weight, in, T(0), pre_activation, out, {bias});
    Policy::activation_forward(act, pre_activation, y, batch * out, slope);
  } else if (!dense_detail::forward_sparse_input<Policy>(x, weight, bias, y, batch, in, out, act, slope)) {
    Policy::gemm(false, true, batch, out, in, T(1), x, in, weight, in, T(0), y, out, {bias, act, slope});
  }
}

// Given dL/dy (of the pre-activation: apply activation_backward first when an activation was fused), computes
// dx = dy W (skipped when dx is null: the first layer needs none), dW = dy^T x and db = column sums of dy.
// accumulate adds into dW and db (dynamic mode's .grad semantics) instead of overwriting them (static mode).
template <class Policy, class T>
void dense_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias, index_t batch, index_t in,
                    index_t out, bool accumulate) {
  T beta = accumulate ? T(1) : T(0);
  if (!dense_detail::weight_gradient_sparse_input<Policy>(x, dy, dweight, batch, in, out, accumulate))
    Policy::gemm(true, false, out, in, batch, T(1), dy, out, x, in, beta, dweight, in);
  if (dbias) Policy::sum_rows(dy, dbias, batch, out, accumulate);
  if (dx) Policy::gemm(false, false, batch, in, out, T(1), dy, out, weight, in, T(0), dx, in);
}

// PyTorch's default Linear initialisation into the (weight, bias) pair.
template <class T>
void dense_init(std::span<T> weight, std::span<T> bias, index_t in, random_generator& rng) {
  init::linear_weight_default(weight, in, rng);
  if (!bias.empty()) init::linear_bias_default(bias, in, rng);
}

// Static-mode Dense layer with Out units and an optional fused activation (a layer type such as kiln::ReLU).
// Parameters in the flat buffer: weight (Out x In) then bias (Out), PyTorch's order and names.
template <index_t Out, class Act = Identity, bool Bias = true>
struct Dense {
  static_assert(Out > 0, "kiln::Dense<Out>: Out must be positive");
  static_assert(Act::is_activation, "kiln::Dense<Out, Act>: Act must be an activation layer such as kiln::ReLU");
  static constexpr const char* name = "Dense";
  static constexpr activation fused_activation = Act::kind;

  template <class In>
  static constexpr bool accepts = In::rank == 1;
  static constexpr const char* requirement = "a flat input (rank 1): put kiln::Flatten before it";

  template <class In>
  struct bind {
    static constexpr index_t in = In::size;
    using output = dims<Out>;
    static constexpr index_t weight_size = Out * in;
    static constexpr index_t param_count = weight_size + (Bias ? Out : 0);
    // GELU's derivative needs the pre-activation, kept per sample in scratch.
    static constexpr index_t scratch_per_sample = activation_grad_needs_input(Act::kind) ? Out : 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator& rng) {
      dense_init<T>({params, weight_size}, {params + weight_size, Bias ? Out : 0}, in, rng);
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool fuse) {
      const T* bias = Bias ? params + weight_size : nullptr;
      if (fuse || Act::kind == activation::identity) {
        dense_forward<Policy>(x, params, bias, y, ctx.batch, in, Out, Act::kind, T(Act::slope), scratch);
      } else {
        // Unfused: the plain product, then the activation as its own pass (the ladder's rung without fusion).
        T* pre = scratch_per_sample ? scratch : y;
        dense_forward<Policy>(x, params, bias, pre, ctx.batch, in, Out);
        Policy::activation_forward(Act::kind, pre, y, ctx.batch * Out, T(Act::slope));
      }
    }
    // dy is clobbered: the activation's backward runs in place before the product.
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      activation_backward_in_place<Policy>(y, dy, scratch, ctx);
      backward_preactivated<Policy>(params, x, y, dy, dx, dparams, scratch, ctx);
    }
    // Where the layer below is a Dense layer with a fused ReLU (x is its output): whether this backward can take that
    // ReLU's backward in (the policy has the one-pass kernel and it admits these sizes, policy::cpu's
    // dense_backward_through_relu_applies). A pure function of the batch and the policy's settings: both layers of
    // the pair ask it (static/fusion_rules.hpp, relu_backward_into_head).
    template <class Policy, class T>
    static bool backward_through_relu_applies(const layer_context& ctx) {
      if constexpr (std::is_same_v<T, float> && requires { requires Policy::one_pass_relu_backward; })
        return Policy::dense_backward_through_relu_applies(ctx.batch, in, Out, Policy::gemm_precision());
      else
        return (void)ctx, false;
    }
    // Where backward_through_relu_applies: this backward with the lower layer's ReLU backward taken in, dx being the
    // lower layer's pre-activation gradient (never null: the layer below computes).
    template <class Policy, class T>
    static void backward_through_relu(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                                      const layer_context& ctx) {
      if constexpr (std::is_same_v<T, float> && requires { requires Policy::one_pass_relu_backward; }) {
        activation_backward_in_place<Policy>(y, dy, scratch, ctx);
        Policy::dense_backward_through_relu(dy, x, params, dparams, dx, ctx.batch, in, Out);
        if constexpr (Bias) Policy::sum_rows(dy, dparams + weight_size, ctx.batch, Out, false);
      } else {
        fail("Dense::backward_through_relu: called where backward_through_relu_applies is false");
        (void)params, (void)x, (void)y, (void)dy, (void)dx, (void)dparams, (void)scratch, (void)ctx;
      }
    }
    // The layer's own activation's backward on dy, in place (nothing without one).
    template <class Policy, class T>
    static void activation_backward_in_place(const T* y, T* dy, T* scratch, const layer_context& ctx) {
      if constexpr (Act::kind != activation::identity)
        Policy::activation_backward(Act::kind, scratch_per_sample ? scratch : nullptr, y, dy, dy, ctx.batch * Out,
                                    T(Act::slope));
      else
        (void)y, (void)dy, (void)scratch, (void)ctx;
    }
    // The backward of a layer whose activation's backward has run (backward, or the layer above took it in:
    // backward_through_relu): dy is the gradient of the pre-activation.
    template <class Policy, class T>
    static void backward_preactivated(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T*,
                                      const layer_context& ctx) {
      dense_backward<Policy>(x, params, dy, dx, dparams, Bias ? dparams + weight_size : nullptr, ctx.batch, in, Out,
                             false);
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      std::vector<static_parameter_info> tensors{{"weight", shape{Out, in}, 0}};
      if constexpr (Bias) tensors.push_back({"bias", shape{Out}, weight_size});
      return tensors;
    }
    static std::string description() {
      std::string d = "Dense";
      if constexpr (Act::kind != activation::identity) d += std::string("+") + activation_name(Act::kind);
      return d;
    }
  };
};

}  // namespace kiln
