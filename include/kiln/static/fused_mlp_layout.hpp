// The static models that a fused training step takes (kiln::fused_mlp_trainer, on the CPU and on CUDA): an input,
// Flatten where the input has more than one dimension, Dense<Hidden, ReLU>, Dense<Out> (both with biases).
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/static/sequential.hpp"

namespace kiln {

// Trains a static MLP with one fused step per batch: see static/fused_mlp.hpp (CPU policies) and
// static/fused_mlp.cuh (CUDA policies).
template <class Net, bool OnHost = Net::host_accessible>
class fused_mlp_trainer;

namespace detail {

template <class Net>
struct fused_mlp_layout {
  static constexpr bool matches = false;
};
template <class Policy, class InputSpec, index_t Hidden, index_t Out>
struct fused_mlp_layout<Sequential<Policy, InputSpec, Flatten, Dense<Hidden, ReLU>, Dense<Out>>> {
  static constexpr bool matches = true;
  static constexpr index_t hidden = Hidden, out = Out;
};
template <class Policy, class InputSpec, index_t Hidden, index_t Out>
struct fused_mlp_layout<Sequential<Policy, InputSpec, Dense<Hidden, ReLU>, Dense<Out>>> {
  static constexpr bool matches = true;
  static constexpr index_t hidden = Hidden, out = Out;
};

}  // namespace detail

}  // namespace kiln
