// static_parameter_info: how a layer describes one of its parameter tensors inside its slice of a flat buffer.
#pragma once

#include <string>

#include "kiln/core/shape.hpp"

namespace kiln {

// A parameter tensor's name within its layer ("weight"), its shape, and its offset in the layer's slice.
struct static_parameter_info {
  std::string name;
  kiln::shape shape;
  index_t offset = 0;
};

}  // namespace kiln
