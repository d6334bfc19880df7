// strided_walk<K>: an iteration space (the extents of an output, rank 0 to 8) with, for each of K operands, the stride
// of every dimension in elements: 0 where the operand is broadcast along it, a permuted stride where it is read in
// another order, a step where it is sliced. Dynamic mode's general tensor ops (broadcasting, transpose and permute,
// slicing, expand, cat) describe their memory access with one, and the CPU and CUDA kernels walk it.
//
// coalesce() first drops extents of 1 and merges neighbouring dimensions that every operand walks as one (an operand
// contiguous over both, or broadcast over both), so that a same-shape operation becomes one flat run and a [N, F] + [F]
// one becomes N runs of F.
#pragma once

#include <initializer_list>

#include "kiln/core/shape.hpp"

namespace kiln::kernels {

template <int K>
struct strided_walk {
  static constexpr int max_rank = kiln::shape::max_rank;
  int rank = 0;
  index_t extent[max_rank] = {};
  index_t stride[K][max_rank] = {};

  index_t numel() const {
    index_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }

  // Removes extents of 1 and merges dimension d into d - 1 where every operand has stride[d - 1] == stride[d] *
  // extent[d]. The walk visits the same offsets in the same order.
  strided_walk& coalesce() {
    int out = 0;
    for (int d = 0; d < rank; ++d) {
      if (extent[d] == 1) continue;
      if (out > 0) {
        bool merge = true;
        for (int k = 0; k < K; ++k) merge = merge && stride[k][out - 1] == stride[k][d] * extent[d];
        if (merge) {
          extent[out - 1] *= extent[d];
          for (int k = 0; k < K; ++k) stride[k][out - 1] = stride[k][d];
          continue;
        }
      }
      extent[out] = extent[d];
      for (int k = 0; k < K; ++k) stride[k][out] = stride[k][d];
      ++out;
    }
    if (numel() == 0) {  // an empty walk: keep one empty dimension so that nothing is visited
      extent[0] = 0;
      out = 1;
    }
    rank = out;
    return *this;
  }
};

// Row-major strides of a contiguous tensor of shape s.
inline void contiguous_strides(const kiln::shape& s, index_t* stride) {
  index_t step = 1;
  for (int d = s.rank() - 1; d >= 0; --d) {
    stride[d] = step;
    step *= s[d];
  }
}

// The strides with which a contiguous operand of shape `operand` is read when broadcast to `out` (NumPy's rule: shapes
// aligned at the last dimension, extents of 1 and missing leading dimensions repeated). The caller has checked that the
// shapes broadcast.
inline void broadcast_strides(const kiln::shape& operand, const kiln::shape& out, index_t* stride) {
  index_t own[kiln::shape::max_rank] = {};
  contiguous_strides(operand, own);
  const int shift = out.rank() - operand.rank();
  for (int d = 0; d < out.rank(); ++d) {
    const int od = d - shift;
    stride[d] = (od < 0 || operand[od] == 1) ? 0 : own[od];
  }
}

// A walk over `out` with each operand's strides given by broadcast_strides.
template <int K>
strided_walk<K> broadcast_walk(const kiln::shape& out, std::initializer_list<kiln::shape> operands) {
  strided_walk<K> w;
  w.rank = out.rank();
  for (int d = 0; d < out.rank(); ++d) w.extent[d] = out[d];
  int k = 0;
  for (const auto& s : operands) broadcast_strides(s, out, w.stride[k++]);
  return w.coalesce();
}

// Calls body(offsets, count, steps) for each run of a walk along its last dimension, on the host (the CPU kernels,
// and the ops that loop over a batch of matrices): offsets[k] is operand k's
// offset at the start of the run, steps[k] its stride along it. A rank-0 walk is one run of one element.
template <int K, class Body>
KILN_ALWAYS_INLINE void for_each_run(const strided_walk<K>& w, Body&& body) {
  index_t offset[K] = {}, step[K] = {};
  if (w.rank == 0) {
    body(offset, index_t{1}, step);
    return;
  }
  const int last = w.rank - 1;
  const index_t count = w.extent[last];
  index_t runs = 1;
  for (int d = 0; d < last; ++d) runs *= w.extent[d];
  if (count == 0 || runs == 0) return;
  for (int k = 0; k < K; ++k) step[k] = w.stride[k][last];
  index_t counter[strided_walk<K>::max_rank] = {};
  for (index_t r = 0; r < runs; ++r) {
    body(offset, count, step);
    for (int d = last - 1; d >= 0; --d) {
      ++counter[d];
      for (int k = 0; k < K; ++k) offset[k] += w.stride[k][d];
      if (counter[d] < w.extent[d]) break;
      counter[d] = 0;
      for (int k = 0; k < K; ++k) offset[k] -= w.stride[k][d] * w.extent[d];
    }
  }
}

}  // namespace kiln::kernels
