// Dropout (PyTorch's): in training each element is zeroed with probability p and the survivors scaled by 1 / (1 - p)
// (inverted dropout); in evaluation it is the identity. Masks come from the counter-based generator the layer owns
// (the k-th dropout of a model draws from stream runtime_stream_base + k of its seed, in both modes), so one seed
// fixes them and two dropout layers never share numbers.
#pragma once

#include <cstdio>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

// Training: y = x * mask with mask (n elements) drawn from rng and kept for the backward. Evaluation: y = x.
template <class Policy, class T>
void dropout_forward(const T* x, T* y, T* mask, index_t n, T p, bool training, random_generator& rng) {
  if (training && p > T(0)) Policy::dropout_forward(x, y, mask, n, p, rng);
  else Policy::copy(x, y, n);
}
// dx (+)= dy * mask in training, dy in evaluation.
template <class Policy, class T>
void dropout_backward(const T* dy, const T* mask, T* dx, index_t n, T p, bool training, bool accumulate = false) {
  if (training && p > T(0)) Policy::dropout_backward(dy, mask, dx, n, accumulate);
  else if (accumulate) Policy::accumulate(dy, dx, n);
  else Policy::copy(dy, dx, n);
}

// Static-mode Dropout with drop probability P.
template <double P = 0.5>
struct Dropout {
  static_assert(P >= 0 && P <= 1, "kiln::Dropout<P>: P must lie in [0, 1]");
  static constexpr const char* name = "Dropout";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = true;
  static constexpr const char* requirement = "any input";

  template <class In>
  struct bind {
    using output = In;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = In::size;  // the mask
    static constexpr bool aliases_input = false;
    static constexpr bool draws_at_run_time = true;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      random_generator fallback;
      dropout_forward<Policy>(x, y, scratch, ctx.batch * In::size, T(P), ctx.training, ctx.rng ? *ctx.rng : fallback);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T* scratch, const layer_context& ctx) {
      if (dx) dropout_backward<Policy>(dy, scratch, dx, ctx.batch * In::size, T(P), ctx.training);
    }
    static std::string description() {
      char text[48];
      std::snprintf(text, sizeof text, "Dropout(p=%g)", P);
      return text;
    }
  };
};

}  // namespace kiln
