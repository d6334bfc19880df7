// Embedding<Num, Dim>: static mode's table of Num rows of Dim values looked up by id, as torch.nn.Embedding (and
// nn::Embedding in dynamic mode, with the same initialisation, kernels and bits). Its input is a sample of ids held
// as whole numbers in the model's value type (Input<L> for L tokens); its output is [L, Dim]. The ids get no gradient.
//   using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<32>, kiln::Embedding<256, 16>, kiln::Flatten,
//                                kiln::Dense<10>>;
#pragma once

#include <string>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

template <index_t Num, index_t Dim>
struct Embedding {
  static_assert(Num >= 1 && Dim >= 1, "Embedding<Num, Dim>: expected at least one row of at least one value");
  static constexpr const char* name = "Embedding";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = In::rank == 1;
  static constexpr const char* requirement = "a flat sample of ids (rank 1): Input<L> for a sequence of L ids";

  template <class In>
  struct bind {
    static constexpr index_t length = In::size;
    using output = dims<length, Dim>;
    static constexpr index_t param_count = Num * Dim;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    // torch.nn.Embedding's initialisation, N(0, 1), drawn as nn::Embedding draws it.
    template <class T>
    static void init(T* params, random_generator& rng) {
      for (index_t i = 0; i < param_count; ++i) params[i] = rng.normal<T>();
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      Policy::embedding_lookup(x, params, y, ctx.batch * length, Num, Dim);
    }
    // dx (the ids' gradient) is zero.
    template <class Policy, class T>
    static void backward(const T*, const T* x, const T*, T* dy, T* dx, T* dparams, T*, const layer_context& ctx) {
      Policy::embedding_gradient(x, dy, dparams, ctx.batch * length, Num, Dim);
      if (dx) Policy::fill(dx, T(0), ctx.batch * length);
    }
    static std::vector<static_parameter_info> parameter_tensors() { return {{"weight", shape{Num, Dim}, 0}}; }
    static std::string description() {
      return "Embedding(" + std::to_string(Num) + ", " + std::to_string(Dim) + ")";
    }
  };
};

}  // namespace kiln
