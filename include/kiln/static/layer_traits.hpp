// What a static layer's bound type declares of its optional capabilities (layers/layer_contract.hpp), read the same way
// by the Sequential's plan (static/plan.hpp) and by the blocks (static/blocks.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::detail {

// The streams of random_generator(seed) a layer's init draws from: one for a layer with parameters, or what a block
// of several declares (B::init_stream_count: stream k + j for its j-th parameterised layer, as dynamic mode's modules
// take one stream each).
template <class B>
constexpr std::uint64_t init_streams() {
  if constexpr (requires { B::init_stream_count; }) return B::init_stream_count;
  else return B::param_count > 0 ? 1 : 0;
}
// The trainable values of a layer without padding: param_count, or what a block declares (B::parameter_values: its
// layers' slices are 16-aligned within its own, so its param_count holds padding).
template <class B>
constexpr index_t parameter_values_of() {
  if constexpr (requires { B::parameter_values; }) return B::parameter_values;
  else return B::param_count;
}
template <class B>
concept describes_parameters = requires { B::parameter_tensors(); };
template <class B>
concept has_buffers = requires {
  B::buffer_count;
  B::buffer_tensors();
};
template <class B>
constexpr index_t buffer_count_of() {
  if constexpr (has_buffers<B>) return B::buffer_count;
  else return 0;
}
template <class L>
concept has_fused_activation = requires { L::fused_activation; };
template <class B>
constexpr bool draws_at_run_time() {
  if constexpr (requires { B::draws_at_run_time; }) return B::draws_at_run_time;
  else return false;
}
// How many run-time generators a layer takes: one for a layer that draws, or what a block of several declares
// (B::runtime_generator_count: ctx.rng points to the first of them).
template <class B>
constexpr std::size_t runtime_generators_of() {
  if constexpr (requires { B::runtime_generator_count; }) return B::runtime_generator_count;
  else return draws_at_run_time<B>() ? 1 : 0;
}
// How many PyTorch modules a layer stands for: two for a layer with a fused activation (Dense<N, ReLU>), the Linear
// and then the activation.
template <class L>
constexpr int torch_modules() {
  if constexpr (has_fused_activation<L>) return L::fused_activation != activation::identity ? 2 : 1;
  else return 1;
}

}  // namespace kiln::detail
