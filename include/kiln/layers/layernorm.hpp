// LayerNorm (PyTorch's): each sample's trailing dims (normalized_shape) normalised by their own mean and biased
// variance, then an element-wise affine transform (weight 1, bias 0 initially) over normalized_shape.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

// x is (rows, cols) with cols = the product of normalized_shape; gamma / beta (cols) may be null. save_mean and
// save_invstd (rows each) keep the statistics for the backward.
template <class Policy, class T>
void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, T* save_mean, T* save_invstd, index_t rows,
                        index_t cols, T eps) {
  Policy::layer_norm_forward(x, gamma, beta, y, save_mean, save_invstd, rows, cols, eps);
}
// dx overwritten (skipped when null); dgamma, dbeta added with accumulate.
template <class Policy, class T>
void layer_norm_backward(const T* x, const T* gamma, const T* dy, T* dx, T* dgamma, T* dbeta, const T* save_mean,
                         const T* save_invstd, index_t rows, index_t cols, bool accumulate) {
  Policy::layer_norm_backward(x, gamma, dy, dx, dgamma, dbeta, save_mean, save_invstd, rows, cols, accumulate);
}
template <class T>
void layer_norm_init(std::span<T> weight, std::span<T> bias) {
  for (T& v : weight) v = T(1);
  for (T& v : bias) v = T(0);
}

namespace detail {
// Whether the sample shape In ends with the extents Normalized... (an empty list: all of In).
template <class In, index_t... Normalized>
constexpr bool trailing_dims_match() {
  constexpr index_t n[] = {Normalized..., 0};
  constexpr int count = sizeof...(Normalized);
  if (count > In::rank) return false;
  for (int i = 0; i < count; ++i)
    if (In::extents[static_cast<std::size_t>(In::rank - count + i)] != n[i]) return false;
  return true;
}
}  // namespace detail

// The static layer: LayerNorm<Normalized...> normalises over trailing dims equal to Normalized... (all the sample's
// dims when the list is empty); layer_norm_layer<Eps, Affine, Normalized...> sets eps and elementwise_affine.
template <double Eps, bool Affine, index_t... Normalized>
struct layer_norm_layer {
  static_assert(Eps > 0, "kiln::LayerNorm: eps must be positive");
  static constexpr const char* name = "LayerNorm";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = detail::trailing_dims_match<In, Normalized...>();
  static constexpr const char* requirement = "an input whose trailing dims equal the normalized shape";

  template <class In>
  struct bind {
    static constexpr index_t cols = sizeof...(Normalized) == 0 ? In::size : (index_t{1} * ... * Normalized);
    static constexpr index_t rows_per_sample = In::size / cols;
    using output = In;
    static constexpr index_t param_count = Affine ? 2 * cols : 0;
    static constexpr index_t scratch_per_sample = 2 * rows_per_sample;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator&) {
      if constexpr (Affine) layer_norm_init<T>({params, cols}, {params + cols, cols});
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      const index_t rows = ctx.batch * rows_per_sample;
      layer_norm_forward<Policy>(x, Affine ? params : nullptr, Affine ? params + cols : nullptr, y, scratch,
                                 scratch + rows, rows, cols, T(Eps));
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t rows = ctx.batch * rows_per_sample;
      layer_norm_backward<Policy>(x, Affine ? params : nullptr, dy, dx, Affine ? dparams : nullptr,
                                  Affine ? dparams + cols : nullptr, scratch, scratch + rows, rows, cols, false);
    }
    static kiln::shape normalized_shape() {
      if constexpr (sizeof...(Normalized) == 0) return drop_batch();
      else return kiln::shape{Normalized...};
    }
    static kiln::shape drop_batch() {
      kiln::shape s;
      for (index_t e : In::extents) s.push_back(e);
      return s;
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      if constexpr (Affine) return {{"weight", normalized_shape(), 0}, {"bias", normalized_shape(), cols}};
      else return {};
    }
    static std::string description() { return "LayerNorm"; }
  };
};

template <index_t... Normalized>
struct LayerNorm : layer_norm_layer<1e-5, true, Normalized...> {};

}  // namespace kiln
