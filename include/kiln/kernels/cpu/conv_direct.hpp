// A convolution's forward and weight gradient without im2col: the GEMM's register tiles read the input where it lies.
// Row p of im2col's column matrix, window element (c, i, j), is the input read from a fixed offset,
// c * plane + i * dilation_h * pitch + j * dilation_w, at each output position's place in the input:
// - the weight gradient (dW^T += col dy^T) broadcasts those elements one output position at a time, for any strides;
// - the forward (y = W col) loads them as vectors of consecutive positions, for unit strides: with the output's rows
//   laid out at the input's (padded) row pitch instead of their own width, position q = oh * pitch + ow reads input
//   element q + offset. The (kernel_w - 1) * dilation_w positions at the end of each output row that wrap into the
//   next input row are computed and thrown away: a small share of each row for a small kernel, against an im2col
//   that writes a copy of the input per window element and a GEMM that packs it again.
//
// Each element is the blocked GEMM's arithmetic (gemm.hpp): one FMA chain per k block of k_block_depth, in im2col's
// order, the blocks' sums added to C in order, then the bias: the same bits as im2col then gemm (then
// add_channel_bias), wherever gemm runs those products blocked (conv_direct_applies,
// conv_direct_weight_gradient_applies).
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/kernels/cpu/conv_geometry.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"

namespace kiln::kernels::cpu {

// What a convolution kernel keeps in conv_scratch, one buffer per use and thread.
enum class conv_scratch_use {
  padded_input,
  window_offsets,
  packed_weights,
  transposed_output_gradient,
  weight_gradient_sums,
  sparse_values,
  sparse_bases,
  sparse_ends,
  channels_last_input,
  window_offsets_channels_last,
  sparse_window_sums,
  sparse_window_places,
  sparse_bands,
  sparse_input_gradient_weights,
  sparse_input_gradient_sums,
  transposed_weights,
  packed_transposed_weights
};
// The calling thread's buffer for one use: grows to the largest size seen, then is reused, so a steady training step
// allocates nothing. Valid until the thread's next call for the same use; other threads may read it meanwhile.
template <class T, conv_scratch_use Use>
T* conv_scratch(index_t count) {
  static thread_local aligned_buffer<T> buffer;
  if (buffer.size() < count) buffer = aligned_buffer<T>(count);
  return buffer.data();
}

namespace conv_direct_detail {

// The register tile: Rows output channels by Vecs vectors of output positions. AVX-512: 8 x 3 zmm = 24 accumulators,
// 3 input loads and 8 broadcasts per 24 FMAs (and 48 positions a tile: 13 tiles of a 24 x 26 output exactly).
// AVX2's 16 registers hold 4 x 3; the portable fallback takes 4 x 2.
template <class T>
struct tile_shape {
#if defined(__AVX512F__)
  static constexpr int rows = 8, vecs = 3;
#elif defined(__AVX2__) && defined(__FMA__)
  static constexpr int rows = 4, vecs = 3;
#else
  static constexpr int rows = 4, vecs = 2;
#endif
  static constexpr int width = gemm_detail::simd<T>::width;
  static constexpr int cols = vecs * width;
};

// The input's rows as the direct convolution reads them: `pitch` elements apart, `plane` elements a channel, with the
// padding before the first row and column and as much after the last as the windows reach (PyTorch's "same" padding
// of an even kernel reaches one further at the end than at the start). padded: whether that differs from the input.
struct input_layout {
  index_t pitch, plane;
  bool padded;
};
inline input_layout layout_of(const conv_geometry& g) {
  const index_t reach_h = (g.out_height - 1) * g.stride_h + g.dilation_h * (g.kernel_h - 1) + 1;
  const index_t reach_w = (g.out_width - 1) * g.stride_w + g.dilation_w * (g.kernel_w - 1) + 1;
  const index_t rows = std::max(g.pad_h + g.height, reach_h), pitch = std::max(g.pad_w + g.width, reach_w);
  return {pitch, rows * pitch, g.pad_h > 0 || g.pad_w > 0 || rows != g.height || pitch != g.width};
}
// Output positions one sample's forward computes, in the padded layout: every row at the input's pitch but the last,
// which stops at its last real position (so that no window reads past the padded input's end).
inline index_t virtual_positions(const conv_geometry& g, const input_layout& in) {
  return (g.out_height - 1) * in.pitch + g.out_width;
}

// tile (Rows x cols, row stride tile_cols) (+)= packed weights x input columns over window elements [p0, p0 + kc):
// weights[p * Rows + r] is output channel r's weight of window element p (the k block's packed panel), and the
// input column of element p starts at input + offsets[p]. Each accumulator is one FMA chain over the block, from
// zero; `first` stores it, otherwise it is added to what the tile holds (the GEMM's C between k blocks). The last
// vector reads `last_lanes` positions under a mask.
template <class T, int Rows, int Vecs>
KILN_NOINLINE void direct_tile(index_t kc, const T* KILN_RESTRICT weights, const T* input,
                               const index_t* KILN_RESTRICT offsets, T* KILN_RESTRICT tile, index_t tile_cols,
                               int last_lanes, bool first) {
  using S = gemm_detail::simd<T>;
  using Reg = typename S::reg;
  constexpr int W = S::width;
  const bool full = last_lanes == W;
  Reg acc[Rows][Vecs];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = S::zero();
#pragma GCC unroll 2
  for (index_t p = 0; p < kc; ++p) {
    const T* column = input + offsets[p];
    Reg bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v)
      bv[v] = v < Vecs - 1 || full ? S::load(column + v * W) : S::load_n(column + v * W, last_lanes);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const Reg av = S::set1(weights[r]);
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
    }
    weights += Rows;
  }
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      T* out = tile + r * tile_cols + v * W;
      S::store(out, first ? acc[r][v] : S::add(acc[r][v], S::load(out)));
    }
}

// The tile kernel for 1..vecs vectors of positions, chosen at run time (the last tile of a sample may be narrower).
template <class T>
using direct_tile_fn = void (*)(index_t, const T*, const T*, const index_t*, T*, index_t, int, bool);
template <class T, int... V>
constexpr std::array<direct_tile_fn<T>, sizeof...(V)> make_direct_tiles(std::integer_sequence<int, V...>) {
  return {&direct_tile<T, tile_shape<T>::rows, V + 1>...};
}

// The weight gradient's register tile: Rows window elements by Vecs vectors of output channels, the transposed
// gradient dW^T (window elements x output channels) that conv2d_backward sums, the im2col GEMM's C. AVX-512: 6 x 4
// zmm = 24 accumulators (64 output channels at once), 4 loads and 6 broadcasts per 24 FMAs; AVX2 6 x 2 and the fallback
// 4 x 2, as the GEMM's tiles.
template <class T>
struct gradient_tile_shape {
#if defined(__AVX512F__)
  static constexpr int rows = 6, vecs = 4;
#elif defined(__AVX2__) && defined(__FMA__)
  static constexpr int rows = 6, vecs = 2;
#else
  static constexpr int rows = 4, vecs = 2;
#endif
  static constexpr int width = gemm_detail::simd<T>::width;
};

// Where the output positions of one k block lie: positions [p0, p0 + kc) of the output plane (row-major, out_width
// a row), position (oh, ow) reading its window element at input + oh * row_step + ow * col_step.
struct position_walk {
  index_t p0, kc, out_width, row_step, col_step;
};

// c (Rows x cols, row stride ldc; only the first `rows` rows stored) = (overwrite ? 0 : c) + the k block's sum over
// positions p of input_rows[r][position p] * dy_t[p, :]: window element r's column of im2col read where it lies in
// the input, and dy_t the sample's output gradient transposed (positions x output channels, row stride ldb). Each
// accumulator is one FMA chain over the block's positions from zero, added to c in one rounding: the GEMM's C with
// beta 1, or its first k block with beta 0. The last vector stores last_lanes channels.
template <class T, int Rows, int Vecs>
KILN_NOINLINE void gradient_tile(const position_walk& walk, const T* const* input_rows, const T* KILN_RESTRICT dy_t,
                                 index_t ldb, T* c, index_t ldc, int rows, int last_lanes, bool overwrite) {
  using S = gemm_detail::simd<T>;
  using Reg = typename S::reg;
  constexpr int W = S::width;
  const T* a[Rows];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) a[r] = input_rows[r];
  Reg acc[Rows][Vecs];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = S::zero();
  const T* b = dy_t + walk.p0 * ldb;
  index_t oh = walk.p0 / walk.out_width, ow = walk.p0 % walk.out_width, left = walk.kc;
  while (left > 0) {
    const index_t run = std::min(walk.out_width - ow, left);
    index_t at = oh * walk.row_step + ow * walk.col_step;
#pragma GCC unroll 2
    for (index_t t = 0; t < run; ++t) {
      Reg bv[Vecs];
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) bv[v] = S::load(b + v * W);
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) {
        const Reg av = S::set1(a[r][at]);
#pragma GCC unroll 4
        for (int v = 0; v < Vecs; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
      }
      b += ldb;
      at += walk.col_step;
    }
    left -= run;
    ++oh;
    ow = 0;
  }
  for (int r = 0; r < rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      T* out = c + r * ldc + v * W;
      const int lanes = v < Vecs - 1 ? W : last_lanes;
      if (lanes == W)
        S::store(out, overwrite ? acc[r][v] : S::add(S::load(out), acc[r][v]));
      else
        S::store_n(out, overwrite ? acc[r][v] : S::add(S::load_n(out, lanes), acc[r][v]), lanes);
    }
}

template <class T>
using gradient_tile_fn = void (*)(const position_walk&, const T* const*, const T*, index_t, T*, index_t, int, int,
                                  bool);
template <class T, int... V>
constexpr std::array<gradient_tile_fn<T>, sizeof...(V)> make_gradient_tiles(std::integer_sequence<int, V...>) {
  return {&gradient_tile<T, gradient_tile_shape<T>::rows, V + 1>...};
}

// One sample's input as the direct kernels read it: x itself, or a copy with its padding in the calling thread's
// scratch.
template <class T>
const T* padded_input(const T* x, const conv_geometry& g, const input_layout& in) {
  if (!in.padded) return x;
  T* padded = conv_scratch<T, conv_scratch_use::padded_input>(g.channels * in.plane);
  std::fill_n(padded, g.channels * in.plane, T(0));
  for (index_t c = 0; c < g.channels; ++c)
    for (index_t h = 0; h < g.height; ++h)
      std::memcpy(padded + c * in.plane + (h + g.pad_h) * in.pitch + g.pad_w, x + (c * g.height + h) * g.width,
                  static_cast<std::size_t>(g.width) * sizeof(T));
  return padded;
}

// Each window element's offset into one group's input, in im2col's row order (its row p of the column matrix), in
// the calling thread's scratch.
inline const index_t* window_offsets(const conv_geometry& g, const input_layout& in) {
  index_t* offsets = conv_scratch<index_t, conv_scratch_use::window_offsets>(g.group_k());
  for (index_t c = 0, p = 0; c < g.channels / g.groups; ++c)
    for (index_t i = 0; i < g.kernel_h; ++i)
      for (index_t j = 0; j < g.kernel_w; ++j)
        offsets[p++] = c * in.plane + i * g.dilation_h * in.pitch + j * g.dilation_w;
  return offsets;
}

}  // namespace conv_direct_detail

// Whether conv2d_direct_forward computes this convolution, with the bits of im2col and the blocked GEMM: unit
// strides, a window wider than one pixel (a pointwise kernel already reads its input in place), gemm taking the
// per-group product blocked at the policy's precision (not on the bfloat16 path, nor a small product's direct loop),
// and at most one computed position in eight thrown away.
template <class T>
bool conv_direct_applies(const conv_geometry& g, product_precision precision = product_precision::single) {
  if (g.stride_h != 1 || g.stride_w != 1 || g.pointwise() || g.out_height < 1 || g.out_width < 1) return false;
  const index_t plane = g.out_plane(), out_per_group = g.out_channels / g.groups;
  if (gemm_detail::route_of<T>(false, false, out_per_group, plane, g.group_k(), plane, precision) !=
      gemm_detail::gemm_route::blocked)
    return false;
  const auto in = conv_direct_detail::layout_of(g);
  return 8 * (in.pitch - g.out_width) <= in.pitch;
}

// The weights as conv2d_direct_forward reads them, packed once per forward into the calling thread's scratch for `Use`
// (valid until its next call for that use; other threads may read it meanwhile): for each group, each tile of output
// channels and each window element in order, the tile's channels side by side, zeros past the group's last channel.
template <class T, conv_scratch_use Use = conv_scratch_use::packed_weights>
const T* conv_direct_pack_weights(const T* weight, const conv_geometry& g) {
  constexpr index_t rows = conv_direct_detail::tile_shape<T>::rows;
  const index_t k = g.group_k(), out_per_group = g.out_channels / g.groups;
  const index_t size = g.groups * gemm_detail::round_up(out_per_group, rows) * k;
  T* packed = conv_scratch<T, Use>(size);
  T* to = packed;
  for (index_t grp = 0; grp < g.groups; ++grp)
    for (index_t o0 = 0; o0 < out_per_group; o0 += rows)
      for (index_t p = 0; p < k; ++p)
        for (index_t r = 0; r < rows; ++r) {
          const index_t o = o0 + r;
          *to++ = o < out_per_group ? weight[(grp * out_per_group + o) * k + p] : T(0);
        }
  return packed;
}

// One sample: y = conv(x, weights) + bias (bias may be null), y overwritten; x one sample's input (NCHW), `packed` from
// conv_direct_pack_weights. The caller has checked conv_direct_applies.
template <class T>
void conv2d_direct_forward(const T* x, const T* packed, const T* bias, T* y, const conv_geometry& g) {
  using namespace conv_direct_detail;
  using shape = tile_shape<T>;
  constexpr int W = shape::width;
  const auto in = layout_of(g);
  const index_t k = g.group_k(), kc_depth = gemm_detail::k_block_depth<T>(k);
  const index_t channels_per_group = g.channels / g.groups, out_per_group = g.out_channels / g.groups;
  const index_t positions = virtual_positions(g, in), plane = g.out_plane();
  const index_t row_tiles = gemm_detail::ceil_div(out_per_group, shape::rows);

  const T* input = padded_input(x, g, in);
  const index_t* offsets = window_offsets(g, in);

  static constexpr auto tiles = make_direct_tiles<T>(std::make_integer_sequence<int, shape::vecs>{});
  alignas(64) T tile[shape::rows * shape::cols];
  for (index_t grp = 0; grp < g.groups; ++grp) {
    const T* group_input = input + grp * channels_per_group * in.plane;
    const T* group_weights = packed + grp * row_tiles * shape::rows * k;
    for (index_t q0 = 0; q0 < positions; q0 += shape::cols) {
      const int cols = int(std::min<index_t>(shape::cols, positions - q0));
      const int vecs = (cols + W - 1) / W;
      const auto kernel = tiles[vecs - 1];
      for (index_t t = 0; t < row_tiles; ++t) {
        for (index_t p0 = 0; p0 < k; p0 += kc_depth) {
          const index_t kc = std::min(kc_depth, k - p0);
          kernel(kc, group_weights + (t * k + p0) * shape::rows, group_input + q0, offsets + p0, tile, shape::cols,
                 cols - (vecs - 1) * W, p0 == 0);
        }
        // The tile's real positions into y, each output row's part at a time, with the bias.
        const index_t o0 = grp * out_per_group + t * shape::rows;
        const index_t rows = std::min<index_t>(shape::rows, out_per_group - t * shape::rows);
        for (index_t q = q0; q < q0 + cols;) {
          const index_t oh = q / in.pitch, ow = q % in.pitch;
          const index_t run = std::min<index_t>(q0 + cols, oh * in.pitch + g.out_width) - q;
          if (run > 0) {
            for (index_t r = 0; r < rows; ++r) {
              const T* from = tile + r * shape::cols + (q - q0);
              T* to = y + (o0 + r) * plane + oh * g.out_width + ow;
              if (bias) {
                const T b = bias[o0 + r];
                for (index_t e = 0; e < run; ++e) to[e] = from[e] + b;
              } else {
                std::memcpy(to, from, static_cast<std::size_t>(run) * sizeof(T));
              }
            }
          }
          q = (oh + 1) * in.pitch;  // the next output row's first position
        }
      }
    }
  }
}

// Whether conv2d_direct_weight_gradient computes this convolution's weight gradient with the bits of im2col and the
// blocked GEMM: any strides, a window wider than one pixel (a pointwise kernel's GEMM reads its input in place), and
// gemm taking the per-sample product dW^T += col dy^T blocked. Only real output positions are summed, so nothing is
// thrown away.
template <class T>
bool conv_direct_weight_gradient_applies(const conv_geometry& g,
                                         product_precision precision = product_precision::single) {
  if (g.pointwise() || g.out_height < 1 || g.out_width < 1) return false;
  const index_t out_per_group = g.out_channels / g.groups;
  return gemm_detail::route_of<T>(false, true, g.group_k(), out_per_group, g.out_plane(), out_per_group,
                                  precision) == gemm_detail::gemm_route::blocked;
}

// One sample's term of the transposed weight gradient: dweight_t (+)= col dy^T, where col is im2col of x (never
// built: each window element's column is read in the input) and dy the sample's output gradient. dweight_t holds one
// (group_k x out_per_group) matrix per group; overwrite: the first sample's term replaces what it holds (the GEMM's
// beta 0). The caller has checked conv_direct_weight_gradient_applies.
template <class T>
void conv2d_direct_weight_gradient(const T* x, const T* dy, T* dweight_t, const conv_geometry& g, bool overwrite) {
  using namespace conv_direct_detail;
  using shape = gradient_tile_shape<T>;
  constexpr int W = shape::width;
  const auto in = layout_of(g);
  const index_t k = g.group_k(), plane = g.out_plane(), kc_depth = gemm_detail::k_block_depth<T>(plane);
  const index_t channels_per_group = g.channels / g.groups, out_per_group = g.out_channels / g.groups;
  const T* input = padded_input(x, g, in);
  const index_t* offsets = window_offsets(g, in);
  // The sample's output gradient transposed, each group's channels padded to whole vectors with zeros.
  const index_t ldb = gemm_detail::round_up(out_per_group, W);
  T* dy_t = conv_scratch<T, conv_scratch_use::transposed_output_gradient>(plane * ldb);
  static constexpr auto tiles = make_gradient_tiles<T>(std::make_integer_sequence<int, shape::vecs>{});
  for (index_t grp = 0; grp < g.groups; ++grp) {
    const T* group_dy = dy + grp * out_per_group * plane;
    if (ldb == out_per_group) {
      gemm_detail::transpose_into(group_dy, plane, out_per_group, plane, dy_t);
    } else {
      for (index_t p = 0; p < plane; ++p) {
        T* row = dy_t + p * ldb;
        for (index_t o = 0; o < out_per_group; ++o) row[o] = group_dy[o * plane + p];
        std::fill(row + out_per_group, row + ldb, T(0));
      }
    }
    const T* group_input = input + grp * channels_per_group * in.plane;
    T* c = dweight_t + grp * k * out_per_group;
    for (index_t r0 = 0; r0 < k; r0 += shape::rows) {
      const int rows = int(std::min<index_t>(shape::rows, k - r0));
      // A short last tile reads its first row again in the rows it does not store.
      const T* input_rows[shape::rows];
      for (int r = 0; r < shape::rows; ++r) input_rows[r] = group_input + offsets[r0 + (r < rows ? r : 0)];
      for (index_t o0 = 0; o0 < out_per_group; o0 += shape::vecs * W) {
        const index_t cols = std::min<index_t>(shape::vecs * W, out_per_group - o0);
        const int vecs = int((cols + W - 1) / W);
        for (index_t p0 = 0; p0 < plane; p0 += kc_depth) {
          const position_walk walk{p0, std::min(kc_depth, plane - p0), g.out_width, g.stride_h * in.pitch,
                                   g.stride_w};
          tiles[vecs - 1](walk, input_rows, dy_t + o0, ldb, c + r0 * out_per_group + o0, out_per_group, rows,
                          int(cols - (vecs - 1) * W), overwrite && p0 == 0);
        }
      }
    }
  }
}

}  // namespace kiln::kernels::cpu
