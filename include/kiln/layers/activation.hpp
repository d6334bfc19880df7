// Element-wise activation layers (ReLU, LeakyReLU, GELU, Sigmoid, Tanh, Identity): no parameters, the output has
// the input's shape. Each is also usable as the fused activation of a Dense layer: kiln::Dense<128, kiln::ReLU>.
#pragma once

#include <string>

#include "kiln/core/static_shape.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

// The shared body of the activation layers; Kind picks the function.
template <activation Kind, double Slope = 0.0>
struct activation_layer {
  static constexpr bool is_activation = true;
  static constexpr activation kind = Kind;
  static constexpr double slope = Slope;
  static constexpr const char* name = activation_name(Kind);

  template <class In>
  static constexpr bool accepts = true;
  static constexpr const char* requirement = "any input";

  template <class In>
  struct bind {
    using output = In;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    // Identity passes its input buffer through untouched.
    static constexpr bool aliases_input = Kind == activation::identity;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      if constexpr (Kind != activation::identity) Policy::activation_forward(Kind, x, y, ctx.batch * In::size, T(Slope));
    }
    template <class Policy, class T>
    static void backward(const T*, const T* x, const T* y, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if constexpr (Kind != activation::identity)
        if (dx) Policy::activation_backward(Kind, x, y, dy, dx, ctx.batch * In::size, T(Slope));
    }
    static std::string description() { return activation_name(Kind); }
  };
};

// max(x, 0).
struct ReLU : activation_layer<activation::relu> {};
// x for x > 0, Slope * x otherwise (PyTorch's default negative slope 0.01; Slope must not be negative).
template <double Slope = 0.01>
struct LeakyReLU : activation_layer<activation::leaky_relu, Slope> {
  static_assert(Slope >= 0, "kiln::LeakyReLU<Slope>: the negative slope must not be negative");
};
// x * Phi(x), the exact (erf) form, PyTorch's GELU(approximate='none').
struct GELU : activation_layer<activation::gelu> {};
// 1 / (1 + exp(-x)).
struct Sigmoid : activation_layer<activation::sigmoid> {};
// tanh(x).
struct Tanh : activation_layer<activation::tanh> {};
// The input unchanged; as a Dense activation it means "none".
struct Identity : activation_layer<activation::identity> {};

}  // namespace kiln
