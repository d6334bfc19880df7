// What every layer's forward and backward receive besides tensors: the batch size and the training flag.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"

namespace kiln {

// Per-call facts shared by all layers of one forward/backward pass.
struct layer_context {
  index_t batch = 0;
  bool training = true;
  random_generator* rng = nullptr;  // for layers that draw (dropout); null when none is needed
};

}  // namespace kiln
