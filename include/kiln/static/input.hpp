// Input<...>: the first element of a static Sequential, naming the per-sample shape and the element type.
#pragma once

#include "kiln/core/static_shape.hpp"

namespace kiln {

// A static model's input: samples of shape (Extents...) with elements of type T.
template <class T, index_t... Extents>
struct InputOf {
  static_assert(sizeof...(Extents) > 0, "kiln::Input needs at least one extent");
  static_assert(((Extents > 0) && ...), "kiln::Input: every extent must be positive");
  static constexpr const char* name = "Input";
  using value_type = T;
  using shape = dims<Extents...>;
};

// A float input, the common case: kiln::Input<28, 28>.
template <index_t... Extents>
struct Input : InputOf<float, Extents...> {};

}  // namespace kiln
