// kiln::dims<...>: a per-sample shape known at compile time (the batch extent stays a run-time value).
#pragma once

#include <array>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/shape.hpp"

namespace kiln {

// The extents of one sample, e.g. dims<1, 28, 28>; size is their product.
template <index_t... Extents>
struct dims {
  static constexpr int rank = sizeof...(Extents);
  static constexpr index_t size = (index_t{1} * ... * Extents);
  static constexpr std::array<index_t, sizeof...(Extents)> extents{Extents...};

  // The run-time shape of a batch of these samples.
  static kiln::shape batch_shape(index_t batch) {
    kiln::shape s{batch};
    for (index_t e : extents) s.push_back(e);
    return s;
  }
  // Whether the extents of s from dimension `first` on are as many as these but not these: a sample in another
  // layout (channels-last images for channels-first ones), which holds as many values. Other ranks are reshapes.
  static bool is_other_layout(const kiln::shape& s, int first) {
    if (s.rank() - first != rank) return false;
    for (int d = 0; d < rank; ++d)
      if (s[first + d] != extents[static_cast<std::size_t>(d)]) return true;
    return false;
  }
  static std::string str() {
    std::string out = "(";
    for (int d = 0; d < rank; ++d) out += (d ? ", " : "") + std::to_string(extents[d]);
    return out + (rank == 1 ? ",)" : ")");
  }
};

// Extent d (0 or 1) of a sequence sample [L, E], and 1 for a sample of another rank: what the sequence layers'
// binds read, so that their types still form after the shape error that refuses such a sample.
template <class In>
constexpr index_t sequence_extent(std::size_t d) {
  if constexpr (In::rank == 2) return In::extents[d];
  else return 1;
}

template <class T>
inline constexpr bool is_dims = false;
template <index_t... E>
inline constexpr bool is_dims<dims<E...>> = true;

}  // namespace kiln
