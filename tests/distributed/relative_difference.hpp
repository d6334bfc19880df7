// The comparison the MPI suites make between a data-parallel run and one process: the largest difference between two
// sets of values, relative to the values' size (1 + |b|, so that values near zero compare absolutely).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <span>

namespace kiln::test {

inline double max_relative_difference(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1.0 + std::abs(double(b[i]))));
  return worst;
}

}  // namespace kiln::test
