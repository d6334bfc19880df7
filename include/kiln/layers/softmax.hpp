// Softmax and LogSoftmax over an explicit dimension (as in PyTorch, dimension 0 is the batch; no implicit default).
#pragma once

#include <string>

#include "kiln/core/shape.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

// The (outer, size, inner) split of a shape around dimension dim, which the softmax kernels iterate over.
struct softmax_extents {
  index_t outer = 1, size = 1, inner = 1;
};
inline softmax_extents softmax_split(const shape& s, int dim) {
  softmax_extents e;
  for (int d = 0; d < s.rank(); ++d) {
    if (d < dim) e.outer *= s[d];
    else if (d == dim) e.size = s[d];
    else e.inner *= s[d];
  }
  return e;
}

template <class Policy, class T>
void softmax_forward(const T* x, T* y, const shape& s, int dim, bool log) {
  auto e = softmax_split(s, dim);
  Policy::softmax_forward(x, y, e.outer, e.size, e.inner, log);
}
template <class Policy, class T>
void softmax_backward(const T* y, const T* dy, T* dx, const shape& s, int dim, bool log, bool accumulate = false) {
  auto e = softmax_split(s, dim);
  Policy::softmax_backward(y, dy, dx, e.outer, e.size, e.inner, log, accumulate);
}

// The static-mode layer behind Softmax<Dim> and LogSoftmax<Dim>.
template <int Dim, bool Log>
struct softmax_layer {
  static constexpr const char* name = Log ? "LogSoftmax" : "Softmax";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = Dim >= 0 && Dim <= In::rank;
  static constexpr const char* requirement = "Dim between 0 (the batch) and the input's rank";

  template <class In>
  struct bind {
    using output = In;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      softmax_forward<Policy>(x, y, In::batch_shape(ctx.batch), Dim, Log);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T* y, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) softmax_backward<Policy>(y, dy, dx, In::batch_shape(ctx.batch), Dim, Log);
    }
    static std::string description() { return std::string(name) + "(dim=" + std::to_string(Dim) + ")"; }
  };
};

// softmax along dimension Dim (0 is the batch).
template <int Dim>
struct Softmax : softmax_layer<Dim, false> {};
// log(softmax) along dimension Dim, computed stably.
template <int Dim>
struct LogSoftmax : softmax_layer<Dim, true> {};

}  // namespace kiln
