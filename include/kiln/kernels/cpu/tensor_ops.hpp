// CPU kernels of dynamic mode's general tensor ops (dynamic/functional/pointwise.hpp, broadcast.hpp, reduce.hpp,
// shape.hpp, indexing.hpp): element-wise unary ops, binary ops over broadcast operands, strided copies (transpose,
// permute, slicing, expand, cat and their gradients), reductions of rows, and gathers and scatters along a dimension.
//
// Layout: every value is contiguous and row-major; where an op reads or writes another order, a strided_walk
// (kernels/strided.hpp) gives each operand's strides. Index arrays are int64 in the policy's memory and already
// checked against their bounds by the op. The formulas are those of kernels/tensor_math.hpp, shared with CUDA.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/strided.hpp"
#include "kiln/kernels/tensor_math.hpp"

namespace kiln::kernels::cpu {

// Calls body(std::integral_constant<unary_op, op>{}), so that each loop is compiled once per op.
template <class Body>
KILN_ALWAYS_INLINE void with_unary_op(unary_op op, Body&& body) {
  switch (op) {
#define KILN_UNARY_CASE(name) \
  case unary_op::name: return body(std::integral_constant<unary_op, unary_op::name>{});
    KILN_UNARY_CASE(exp) KILN_UNARY_CASE(log) KILN_UNARY_CASE(log1p) KILN_UNARY_CASE(sqrt) KILN_UNARY_CASE(rsqrt)
    KILN_UNARY_CASE(abs) KILN_UNARY_CASE(sin) KILN_UNARY_CASE(cos) KILN_UNARY_CASE(reciprocal)
    KILN_UNARY_CASE(square) KILN_UNARY_CASE(pow) KILN_UNARY_CASE(clamp)
#undef KILN_UNARY_CASE
  }
}
template <class Body>
KILN_ALWAYS_INLINE void with_binary_op(binary_op op, Body&& body) {
  switch (op) {
#define KILN_BINARY_CASE(name) \
  case binary_op::name: return body(std::integral_constant<binary_op, binary_op::name>{});
    KILN_BINARY_CASE(add) KILN_BINARY_CASE(sub) KILN_BINARY_CASE(mul) KILN_BINARY_CASE(div)
    KILN_BINARY_CASE(maximum) KILN_BINARY_CASE(minimum) KILN_BINARY_CASE(pow) KILN_BINARY_CASE(eq)
    KILN_BINARY_CASE(ne) KILN_BINARY_CASE(lt) KILN_BINARY_CASE(le) KILN_BINARY_CASE(gt) KILN_BINARY_CASE(ge)
    KILN_BINARY_CASE(keep_where) KILN_BINARY_CASE(drop_where) KILN_BINARY_CASE(fill_where)
#undef KILN_BINARY_CASE
  }
}

// The tensor-op kernels of the CPU policies.
struct tensor_kernels {
  // y = op(x) over n contiguous elements.
  template <class T>
  KILN_KERNEL static void unary(unary_op op, const T* x, T* y, index_t n, T p, T q) {
    with_unary_op(op, [&](auto op_c) {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        for (index_t i = begin; i < end; ++i) y[i] = unary_value(op_c(), x[i], p, q);
      });
    });
  }
  // dx (+)= op'(x) dy, from the op's input x and output y.
  template <class T>
  KILN_KERNEL static void unary_backward(unary_op op, const T* x, const T* y, const T* dy, T* dx, index_t n, T p,
                                         bool accumulate) {
    with_unary_op(op, [&](auto op_c) {
      parallel_chunks<T>(n, [&](index_t begin, index_t end) {
        if (accumulate)
          for (index_t i = begin; i < end; ++i) dx[i] += unary_gradient(op_c(), x[i], y[i], dy[i], p);
        else
          for (index_t i = begin; i < end; ++i) dx[i] = unary_gradient(op_c(), x[i], y[i], dy[i], p);
      });
    });
  }

  // out = op(a, b, s) over a walk whose operands are out (0), a (1) and b (2).
  template <class T>
  KILN_KERNEL static void binary(binary_op op, const T* a, const T* b, T* out, const strided_walk<3>& w, T s) {
    with_binary_op(op, [&](auto op_c) {
      for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
        T* o = out + at[0];
        const T* pa = a + at[1];
        const T* pb = b + at[2];
        if (step[0] == 1 && step[1] == 1 && step[2] == 1)
          for (index_t i = 0; i < count; ++i) o[i] = binary_value(op_c(), pa[i], pb[i], s);
        else if (step[0] == 1 && step[1] == 1 && step[2] == 0)
          for (index_t i = 0; i < count; ++i) o[i] = binary_value(op_c(), pa[i], *pb, s);
        else
          for (index_t i = 0; i < count; ++i)
            o[i * step[0]] = binary_value(op_c(), pa[i * step[1]], pb[i * step[2]], s);
      });
    });
  }
  // g = dy times the partial derivative of op in operand `side`, at every element of the output: a walk whose operands
  // are g and dy (0, both contiguous over the output), a (1) and b (2).
  template <class T>
  KILN_KERNEL static void binary_backward(binary_op op, int side, const T* a, const T* b, const T* dy, T* g,
                                          const strided_walk<3>& w) {
    with_binary_op(op, [&](auto op_c) {
      for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
        for (index_t i = 0; i < count; ++i) {
          const index_t o = at[0] + i * step[0];
          g[o] = binary_gradient(op_c(), side, a[at[1] + i * step[1]], b[at[2] + i * step[2]], dy[o]);
        }
      });
    });
  }

  // out = mask != 0 ? a : b over a walk whose operands are out (0), mask (1), a (2) and b (3).
  template <class T>
  KILN_KERNEL static void where(const T* mask, const T* a, const T* b, T* out, const strided_walk<4>& w) {
    for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
      for (index_t i = 0; i < count; ++i)
        out[at[0] + i * step[0]] =
            mask[at[1] + i * step[1]] != T(0) ? a[at[2] + i * step[2]] : b[at[3] + i * step[3]];
    });
  }

  // dst[walk 0] = src[walk 1], or += with accumulate (serially: two positions of dst may be the same element, where
  // the walk broadcasts dst, and then their contributions add up).
  // A transpose-like walk (one operand contiguous along the last dimension, the other along the one before) is copied
  // in tiles of those two dimensions, so that both sides stay in cache.
  template <class T>
  KILN_KERNEL static void copy_strided(const T* src, T* dst, const strided_walk<2>& w, bool accumulate) {
    if (w.rank >= 2) {
      const int last = w.rank - 1, before = w.rank - 2;
      const auto* s = w.stride;
      const bool transposing = (s[0][last] == 1 && s[1][before] == 1 && s[1][last] != 1) ||
                               (s[1][last] == 1 && s[0][before] == 1 && s[0][last] != 1);
      if (transposing && w.extent[last] >= transpose_tile && w.extent[before] >= transpose_tile) {
        copy_tiled(src, dst, w, accumulate);
        return;
      }
    }
    for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
      T* d = dst + at[0];
      const T* s = src + at[1];
      if (accumulate) {
        for (index_t i = 0; i < count; ++i) d[i * step[0]] += s[i * step[1]];
      } else if (step[0] == 1 && step[1] == 1) {
        for (index_t i = 0; i < count; ++i) d[i] = s[i];
      } else {
        for (index_t i = 0; i < count; ++i) d[i * step[0]] = s[i * step[1]];
      }
    });
  }

  // out[o, i] = the reduction over r of x[o, r, i], for x [outer, n, inner] and out [outer, inner]: sum, mean, amax
  // and amin over dimensions that are neither first nor last (or first), without moving them last.
  template <class T>
  KILN_KERNEL static void reduce_middle(row_reduction op, const T* x, T* out, index_t outer, index_t n,
                                        index_t inner) {
    for (index_t o = 0; o < outer; ++o) {
      T* dst = out + o * inner;
      const T* block = x + o * n * inner;
      if (n == 0) {
        for (index_t i = 0; i < inner; ++i) dst[i] = op == row_reduction::mean ? T(NAN) : T(0);
        continue;
      }
      for (index_t i = 0; i < inner; ++i) dst[i] = block[i];
      for (index_t r = 1; r < n; ++r) {
        const T* row = block + r * inner;
        switch (op) {
          case row_reduction::amax:
            for (index_t i = 0; i < inner; ++i) dst[i] = (row[i] > dst[i] || row[i] != row[i]) ? row[i] : dst[i];
            break;
          case row_reduction::amin:
            for (index_t i = 0; i < inner; ++i) dst[i] = (row[i] < dst[i] || row[i] != row[i]) ? row[i] : dst[i];
            break;
          default:
            for (index_t i = 0; i < inner; ++i) dst[i] += row[i];
        }
      }
      if (op == row_reduction::mean)
        for (index_t i = 0; i < inner; ++i) dst[i] /= static_cast<T>(n);
    }
  }

  // out[r] = the reduction of row r of x ([rows, cols], contiguous). p is norm's order; correction is var's (the
  // divisor is cols - correction). An empty row gives the reduction of nothing: 0 for sum and norm, NaN for mean and
  // var, -inf for logsumexp, and amax/amin are refused by the op before they get here.
  template <class T>
  KILN_KERNEL static void reduce_rows(row_reduction op, const T* x, T* out, index_t rows, index_t cols, T p,
                                      T correction) {
    for (index_t r = 0; r < rows; ++r) out[r] = reduce_row_value(op, x + r * cols, cols, p, correction);
  }
  // dx (row r of [rows, cols]) = the gradient of out[r] = reduce_rows(x)[r] times dy[r].
  template <class T>
  KILN_KERNEL static void reduce_rows_backward(row_reduction op, const T* x, const T* out, const T* dy, T* dx,
                                               index_t rows, index_t cols, T p, T correction) {
    for (index_t r = 0; r < rows; ++r)
      reduce_row_gradient(op, x + r * cols, out[r], dy[r], dx + r * cols, cols, p, correction);
  }
  // The position of the first largest (or smallest) element of each row; a NaN counts as the largest and the
  // smallest, as in PyTorch.
  template <class T>
  KILN_KERNEL static void arg_reduce_rows(const T* x, std::int64_t* out, index_t rows, index_t cols, bool largest) {
    for (index_t r = 0; r < rows; ++r) out[r] = arg_reduce_row(x + r * cols, cols, largest);
  }

  // out[o, j, i] = x[o, index[j], i] for x of shape [outer, n, inner] and out [outer, m, inner].
  template <class T>
  KILN_KERNEL static void index_select(const T* x, const std::int64_t* index, T* out, index_t outer, index_t n,
                                       index_t inner, index_t m) {
    for (index_t o = 0; o < outer; ++o)
      for (index_t j = 0; j < m; ++j) {
        const T* src = x + (o * n + index[j]) * inner;
        T* dst = out + (o * m + j) * inner;
        for (index_t i = 0; i < inner; ++i) dst[i] = src[i];
      }
  }
  // dx[o, index[j], i] += dy[o, j, i]: index_select's gradient (an index that repeats adds up); rows whose index is
  // `skip` get nothing (embedding's padding_idx; -1 for none).
  template <class T>
  KILN_KERNEL static void index_add(const T* dy, const std::int64_t* index, T* dx, index_t outer, index_t n,
                                    index_t inner, index_t m, std::int64_t skip) {
    for (index_t o = 0; o < outer; ++o)
      for (index_t j = 0; j < m; ++j) {
        if (index[j] == skip) continue;
        const T* src = dy + (o * m + j) * inner;
        T* dst = dx + (o * n + index[j]) * inner;
        for (index_t i = 0; i < inner; ++i) dst[i] += src[i];
      }
  }
  // out[p] = x[p with its coordinate along the gathered dimension replaced by index[p]]: a walk over the index's shape
  // whose operands are index and out (0, contiguous) and x (1, with stride 0 along that dimension); dim_stride is x's
  // stride along it.
  template <class T>
  KILN_KERNEL static void gather(const T* x, const std::int64_t* index, T* out, const strided_walk<2>& w,
                                 index_t dim_stride) {
    for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
      for (index_t i = 0; i < count; ++i) {
        const index_t o = at[0] + i * step[0];
        out[o] = x[at[1] + i * step[1] + index[o] * dim_stride];
      }
    });
  }
  // Static mode's Embedding: out[j] = weight row ids[j] for `count` ids held as whole numbers in T; an id that is not
  // a whole number in [0, num) is refused.
  template <class T>
  KILN_KERNEL static void embedding_lookup(const T* ids, const T* weight, T* out, index_t count, index_t num,
                                           index_t dim) {
    for (index_t j = 0; j < count; ++j) {
      const index_t id = checked_id(ids[j], num);
      for (index_t i = 0; i < dim; ++i) out[j * dim + i] = weight[id * dim + i];
    }
  }
  // dweight = the sum, over j, of dy row j added into row ids[j] (overwritten, in the order of index_add).
  template <class T>
  KILN_KERNEL static void embedding_gradient(const T* ids, const T* dy, T* dweight, index_t count, index_t num,
                                             index_t dim) {
    for (index_t i = 0; i < num * dim; ++i) dweight[i] = T(0);
    for (index_t j = 0; j < count; ++j) {
      const index_t id = checked_id(ids[j], num);
      for (index_t i = 0; i < dim; ++i) dweight[id * dim + i] += dy[j * dim + i];
    }
  }

  // dst[p with the coordinate along the dimension replaced by index[p]] += src[p]: a walk over the index's shape with
  // operands index (0, contiguous), dst (1, stride 0 along the dimension) and src (2).
  template <class T>
  KILN_KERNEL static void scatter_add(const T* src, const std::int64_t* index, T* dst, const strided_walk<3>& w,
                                      index_t dim_stride) {
    for_each_run(w, [&](const index_t* at, index_t count, const index_t* step) {
      for (index_t i = 0; i < count; ++i) {
        const index_t o = at[0] + i * step[0];
        dst[at[1] + i * step[1] + index[o] * dim_stride] += src[at[2] + i * step[2]];
      }
    });
  }


 private:
  static constexpr index_t transpose_tile = 32;

  template <class T>
  static index_t checked_id(T value, index_t num) {
    if (!(value >= T(0) && value < static_cast<T>(num) && value == static_cast<T>(static_cast<index_t>(value))))
      fail("Embedding: expected ids that are whole numbers in [0, ", num, "), found ", value);
    return static_cast<index_t>(value);
  }

  template <class T>
  static void copy_tiled(const T* src, T* dst, const strided_walk<2>& w, bool accumulate) {
    const int last = w.rank - 1, before = w.rank - 2;
    // The dimensions before the two tiled ones, walked as runs of one element.
    strided_walk<2> outer;
    outer.rank = before + 1;
    for (int d = 0; d < before; ++d) {
      outer.extent[d] = w.extent[d];
      for (int k = 0; k < 2; ++k) outer.stride[k][d] = w.stride[k][d];
    }
    outer.extent[before] = 1;
    const index_t rows = w.extent[before], cols = w.extent[last];
    const index_t d_row = w.stride[0][before], d_col = w.stride[0][last];
    const index_t s_row = w.stride[1][before], s_col = w.stride[1][last];
    for_each_run(outer, [&](const index_t* at, index_t, const index_t*) {
      T* d = dst + at[0];
      const T* s = src + at[1];
      for (index_t r0 = 0; r0 < rows; r0 += transpose_tile)
        for (index_t c0 = 0; c0 < cols; c0 += transpose_tile) {
          const index_t r1 = r0 + transpose_tile < rows ? r0 + transpose_tile : rows;
          const index_t c1 = c0 + transpose_tile < cols ? c0 + transpose_tile : cols;
          for (index_t r = r0; r < r1; ++r)
            for (index_t c = c0; c < c1; ++c) {
              if (accumulate) d[r * d_row + c * d_col] += s[r * s_row + c * s_col];
              else d[r * d_row + c * d_col] = s[r * s_row + c * s_col];
            }
        }
    });
  }
};

}  // namespace kiln::kernels::cpu
