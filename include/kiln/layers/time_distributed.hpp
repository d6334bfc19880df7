// TimeDistributed<L>: the static layer L applied to every slice of a sample along its first axis, as Keras'
// TimeDistributed, and as PyTorch's modules that act on the last dimensions do: nn.Linear(E, N) on [batch, T, E] is
// TimeDistributed<Dense<N>> on Input<T, E>, the same products on the same rows, so the same bits.
//   using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<16, 49>,
//                                kiln::TimeDistributed<kiln::Dense<64, kiln::GELU>>, ...>;   // [16, 49] -> [16, 64]
//
// For In = dims<T, rest...>, L is bound to dims<rest...> and sees each batch of n samples as one batch of n * T
// slices: its forward and backward run once with ctx.batch = n * T, on the same memory (sample-major, so slice t of
// sample i is row i * T + t). So L must treat its samples independently, as Dense, the activations, LayerNorm and
// Dropout do; a layer with buffers (BatchNorm's running statistics would then span the slices) is refused. The
// parameters are L's, under L's names (nn.Linear's "weight" and "bias"); a fused activation counts as L's does.
#pragma once

#include <string>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/static/layer_traits.hpp"

namespace kiln {

namespace time_distributed_detail {

// In = dims<T, rest...>: T slices of dims<rest...>. Other ranks (refused by accepts) bind as one slice of In, so that
// the type still forms after the shape error.
template <class In>
struct slices {
  static constexpr index_t count = 1;
  using slice = In;
};
template <index_t T, index_t First, index_t... Rest>
struct slices<dims<T, First, Rest...>> {
  static constexpr index_t count = T;
  using slice = dims<First, Rest...>;
};

template <index_t T, class Out>
struct prepend;
template <index_t T, index_t... E>
struct prepend<T, dims<E...>> {
  using type = dims<T, E...>;
};

// L's fused activation, declared only where L declares one (read by the state_dict's module numbering).
template <class L, bool = detail::has_fused_activation<L>>
struct fused_activation_of {};
template <class L>
struct fused_activation_of<L, true> {
  static constexpr activation fused_activation = L::fused_activation;
};

template <class In, class L>
constexpr bool accepts() {
  if constexpr (In::rank >= 2) return L::template accepts<typename slices<In>::slice>;
  else return false;
}

}  // namespace time_distributed_detail

template <class L>
struct TimeDistributed : time_distributed_detail::fused_activation_of<L> {
  static constexpr const char* name = "TimeDistributed";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = time_distributed_detail::accepts<In, L>();
  static constexpr const char* requirement =
      "an input of rank 2 or more whose slices along the first axis the wrapped layer takes (Input<T, E> for a "
      "Dense over E features at each of T positions)";

  template <class In>
  struct bind {
    using split = time_distributed_detail::slices<In>;
    using inner = typename L::template bind<typename split::slice>;
    static_assert(!detail::has_buffers<inner>,
                  "kiln::TimeDistributed<L>: L keeps buffers (running statistics), which would span the slices; "
                  "wrap a layer that treats its samples independently (Dense, an activation, LayerNorm, Dropout)");
    static_assert(!requires { inner::init_stream_count; } && !requires { inner::runtime_generator_count; } &&
                      !requires { inner::parameter_values; },
                  "kiln::TimeDistributed<L>: L is a block of layers; wrap each of its layers instead");
    static constexpr index_t count = split::count;
    using output = typename time_distributed_detail::prepend<count, typename inner::output>::type;
    static constexpr index_t param_count = inner::param_count;
    static constexpr index_t scratch_per_sample = inner::scratch_per_sample * count;
    static constexpr bool aliases_input = inner::aliases_input;
    static constexpr bool draws_at_run_time = detail::draws_at_run_time<inner>();

    template <class T>
    static void init(T* params, random_generator& rng) {
      if constexpr (param_count > 0) inner::template init<T>(params, rng);
      else (void)params, (void)rng;
    }
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      inner::template forward<Policy>(params, buffers, x, y, scratch, sliced(ctx), fuse);
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      inner::template backward<Policy>(params, x, y, dy, dx, dparams, scratch, sliced(ctx));
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      if constexpr (detail::describes_parameters<inner>) return inner::parameter_tensors();
      else return {};
    }
    static std::string description() { return "TimeDistributed(" + inner::description() + ")"; }

   private:
    static layer_context sliced(const layer_context& ctx) {
      layer_context c = ctx;
      c.batch = ctx.batch * count;
      return c;
    }
  };
};

}  // namespace kiln
