// The workspace of a static model planned by liveness: every tensor a training step writes (a layer's output, the
// gradient of that output, the layer's scratch) is live from the moment of the step that first writes it to the last
// moment that reads it, and two tensors whose live ranges are disjoint may share memory. A step's moments are
// numbered: the forward of layer i at i, the loss at L, the backward of layer i at 2L - i (L layers), and the end of
// the step (after which the model's output is still read, by last_output) at 2L + 1.
//
// The placement is greedy, largest tensor first: each takes the lowest offset where it overlaps no placed tensor whose
// live range meets its own. Ranges are closed at both ends, so a tensor read at moment m never shares memory with one
// written at m. The result is the same for the same list, whatever the machine: it is a function of sizes and moments.
#pragma once

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "kiln/core/config.hpp"

namespace kiln {

// One tensor of the workspace: its size in values and the first and last moment it is live (inclusive).
struct live_range {
  index_t size = 0;
  int first = 0;
  int last = 0;
};

// Where each tensor lives in one buffer, and what that buffer costs against one without sharing.
struct workspace_layout {
  std::vector<index_t> offsets;  // one per live_range, in values from the buffer's start
  index_t peak = 0;              // the buffer's size in values
  index_t unshared = 0;          // the sum of every tensor's size: the buffer without reuse
};

// Places the tensors; each offset is a multiple of `alignment` values. Tensors of size 0 get offset 0 and take no
// memory.
inline workspace_layout plan_by_liveness(std::span<const live_range> ranges, index_t alignment = 16) {
  const auto padded = [&](index_t n) { return (n + alignment - 1) / alignment * alignment; };
  workspace_layout layout;
  layout.offsets.assign(ranges.size(), 0);
  std::vector<std::size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Largest first, the list's order breaking ties (std::sort with the index as tie-break: stable_sort's buffer would
  // come from the nothrow operator new).
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranges[a].size != ranges[b].size ? ranges[a].size > ranges[b].size : a < b;
  });
  std::vector<std::size_t> placed;
  std::vector<std::pair<index_t, index_t>> taken;  // address intervals [begin, end) of the live tensors that meet
  for (std::size_t i : order) {
    const live_range& r = ranges[i];
    if (r.size <= 0) continue;
    layout.unshared += padded(r.size);
    taken.clear();
    for (std::size_t j : placed)
      if (ranges[j].first <= r.last && r.first <= ranges[j].last)
        taken.emplace_back(layout.offsets[j], layout.offsets[j] + padded(ranges[j].size));
    std::sort(taken.begin(), taken.end());
    index_t at = 0;
    for (const auto& [begin, end] : taken) {
      if (at + padded(r.size) <= begin) break;
      at = std::max(at, end);
    }
    layout.offsets[i] = at;
    layout.peak = std::max(layout.peak, at + padded(r.size));
    placed.push_back(i);
  }
  return layout;
}

}  // namespace kiln
