// Flatten: (batch, d1, d2, ...) -> (batch, d1 * d2 * ...). Row-major data is already flat, so no copy is made.
#pragma once

#include <string>

#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"

namespace kiln {

// Static-mode Flatten: a new shape over the same buffer.
struct Flatten {
  static constexpr const char* name = "Flatten";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = true;
  static constexpr const char* requirement = "any input";

  template <class In>
  struct bind {
    using output = dims<In::size>;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = true;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T*, T*, T*, const layer_context&, bool) {}
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T*, T*, T*, T*, const layer_context&) {}
    static std::string description() { return "Flatten"; }
  };
};

}  // namespace kiln
