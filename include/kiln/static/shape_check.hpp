// Compile-time shape inference for static Sequentials: each layer is bound to the shape the layer before it
// produces, and a layer that does not accept that shape stops compilation with a message naming both layers.
#pragma once

#include <tuple>

#include "kiln/core/static_shape.hpp"

namespace kiln {

template <class... Ts>
struct type_list {};

// Fails with a static_assert when Layer cannot take Shape from Previous. The compiler prints the template arguments,
// so the error reads "layer_fits<Previous, Layer, dims<...>>" followed by this text.
template <class Previous, class Layer, class Shape>
struct layer_fits {
  static constexpr bool value = Layer::template accepts<Shape>;
  static_assert(value,
                "kiln::Sequential shape mismatch: the layer named second in layer_fits<previous layer, layer, shape> "
                "cannot take the shape that the layer named first produces (see the layer's `requirement`)");
};

// Binds Layers... one after the other starting from shape In; `type` is the list of bound layers.
template <class Previous, class In, class... Layers>
struct bind_layers {
  using type = type_list<>;
  using output = In;
};
template <class Previous, class In, class Layer, class... Rest>
struct bind_layers<Previous, In, Layer, Rest...> {
  static_assert(layer_fits<Previous, Layer, In>::value);
  using bound = typename Layer::template bind<In>;
  using next = bind_layers<Layer, typename bound::output, Rest...>;
  template <class... B>
  static type_list<bound, B...> prepend(type_list<B...>);
  using type = decltype(prepend(typename next::type{}));
  using output = typename next::output;
};

}  // namespace kiln
