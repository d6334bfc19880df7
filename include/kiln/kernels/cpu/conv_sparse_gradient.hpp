// A convolution's weight gradient from an output gradient that is mostly zeros, as it is under a max pool: the pool's
// backward passes each window's gradient to one position of four (2 x 2), and a ReLU before the pool zeroes more.
// The dense kernels (conv_direct.hpp, im2col + gemm) multiply every zero; this one skips them.
//
// It sums the same terms as conv2d_direct_weight_gradient, in the same order: element (window element r, output
// channel o) is one FMA chain per k block of the output positions, from zero, over the positions where dy is not zero,
// added to the sum before it as the dense kernel adds its blocks. A zero term leaves a chain's value as it is (x + 0 =
// x, and +0 + -0 = +0), so the bits are the dense kernel's wherever the input is finite; where the input holds an
// infinity or a NaN that meets a zero of dy, the dense kernel's NaN is not produced.
//
// The loops are turned round to make skipping possible: the dense kernel vectorises over output channels, sixteen of
// which are rarely all zero at one position; this one vectorises over the window's elements and walks each output
// channel's nonzero positions. It reads the input channels-last, copied once per sample, so that a window row's
// elements (kernel width x channels) lie together.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/env_switch.hpp"
#include "kiln/kernels/cpu/conv_direct.hpp"
#include "kiln/kernels/cpu/conv_geometry.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"

namespace kiln::kernels::cpu {

// Samples whose output gradient has at most this fraction of nonzeros take the sparse kernel; denser ones the dense
// kernel, which then runs faster. The result is the same either way (above), so only the time depends on it.
inline constexpr double sparse_gradient_max_density = 0.5;

namespace conv_sparse_detail {
// Whether the user allows the kernel: set_sparse_conv_gradients, initialised from KILN_SPARSE_GRADIENT.
inline std::atomic<bool>& sparse_allowed() {
  static std::atomic<bool> allowed{env_switch_on("KILN_SPARSE_GRADIENT")};
  return allowed;
}

// Accumulator registers a pass may hold: the window elements are summed in chunks of at most this many vectors.
inline constexpr int max_vectors = 24;

// One output channel's FMA chains over one band of positions, for Vectors vectors of window elements:
// acc[v] (+)= sum over the listed positions t of value[t] * input[base[t] + offsets[v]]. A chain starts from zero at
// its k block's first band (`start`), else from where the band before left it in `partial`; at the block's last band
// (`finish`) it is folded into `sums` as the dense kernel folds a block into C: sums = acc where `first` (the first
// block of a sample that overwrites), else sums + acc. Between bands a chain waits in `partial`: a store and a load,
// which change no bits.
template <int Vectors>
KILN_NOINLINE void sparse_chain(const float* KILN_RESTRICT input, const std::int32_t* KILN_RESTRICT offsets,
                                const float* KILN_RESTRICT values, const std::int32_t* KILN_RESTRICT bases,
                                index_t count, float* KILN_RESTRICT partial, float* KILN_RESTRICT sums, bool start,
                                bool finish, bool first) {
#if defined(__AVX512F__)
  __m512 acc[Vectors];
#pragma GCC unroll 24
  for (int v = 0; v < Vectors; ++v) acc[v] = start ? _mm512_setzero_ps() : _mm512_load_ps(partial + 16 * v);
  for (index_t t = 0; t < count; ++t) {
    const __m512 value = _mm512_set1_ps(values[t]);
    const float* window = input + bases[t];
#pragma GCC unroll 24
    for (int v = 0; v < Vectors; ++v) acc[v] = _mm512_fmadd_ps(value, _mm512_loadu_ps(window + offsets[v]), acc[v]);
  }
  if (!finish) {
#pragma GCC unroll 24
    for (int v = 0; v < Vectors; ++v) _mm512_store_ps(partial + 16 * v, acc[v]);
    return;
  }
#pragma GCC unroll 24
  for (int v = 0; v < Vectors; ++v)
    _mm512_store_ps(sums + 16 * v, first ? acc[v] : _mm512_add_ps(_mm512_load_ps(sums + 16 * v), acc[v]));
#else
  (void)input, (void)offsets, (void)values, (void)bases, (void)count, (void)partial, (void)sums, (void)start,
      (void)finish, (void)first;
#endif
}

using sparse_chain_fn = void (*)(const float*, const std::int32_t*, const float*, const std::int32_t*, index_t,
                                 float*, float*, bool, bool, bool);

// The input rows that one band of output positions reads should stay in L1 while every output channel sweeps them:
// at most this many bytes (Zen 4 has 32 KiB of L1, Sapphire Rapids 48).
inline constexpr index_t band_bytes = 32 * 1024;

// A run of output positions [p0, p1) inside one k block: whether it starts the block, ends it, and is in block 0.
struct band {
  index_t p0, p1;
  bool start, finish, first_block;
};
template <int... V>
constexpr std::array<sparse_chain_fn, sizeof...(V)> make_sparse_chains(std::integer_sequence<int, V...>) {
  return {&sparse_chain<V + 1>...};
}

}  // namespace conv_sparse_detail

// Turns the sparse weight gradient on or off for every later call (on by default; KILN_SPARSE_GRADIENT=0 in the
// environment starts it off). It changes the time a step takes, not its results (see the top of this file).
inline void set_sparse_conv_gradients(bool enabled) {
  conv_sparse_detail::sparse_allowed().store(enabled, std::memory_order_relaxed);
}
inline bool sparse_conv_gradients_enabled() {
  return conv_sparse_detail::sparse_allowed().load(std::memory_order_relaxed);
}

// Whether conv2d_sparse_weight_gradient can compute this convolution's weight gradient with
// conv2d_direct_weight_gradient's bits: turned on, floats on AVX-512, one group of a multiple of 16 channels, an
// input whose padded channels-last copy 32-bit offsets can index, and a product the direct kernel takes.
template <class T>
bool conv_sparse_weight_gradient_applies(const conv_geometry& g,
                                         product_precision precision = product_precision::single) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const auto in = conv_direct_detail::layout_of(g);
    return sparse_conv_gradients_enabled() && g.groups == 1 && g.channels % 16 == 0 &&
           in.plane * g.channels < (index_t(1) << 31) - 16 && conv_direct_weight_gradient_applies<T>(g, precision);
  }
#endif
  (void)g, (void)precision;
  return false;
}

// One sample's term of the transposed weight gradient, dweight_t (+)= col dy^T (group_k x out_channels; overwrite:
// the first sample's term replaces what dweight_t holds), from the nonzeros of dy alone; see the top of this file.
// Returns false, computing nothing, where more than sparse_gradient_max_density of dy is nonzero: the caller
// then runs conv2d_direct_weight_gradient. The caller has checked conv_sparse_weight_gradient_applies.
inline bool conv2d_sparse_weight_gradient(const float* x, const float* dy, float* dweight_t, const conv_geometry& g,
                                          bool overwrite) {
#if defined(__AVX512F__)
  using namespace conv_sparse_detail;
  const auto in = conv_direct_detail::layout_of(g);
  const index_t plane = g.out_plane(), channels = g.channels, kc_depth = gemm_detail::k_block_depth<float>(plane);
  const index_t outputs = g.out_channels;

  // The bands: each k block cut into runs of whole output rows whose input rows fit in band_bytes.
  const index_t row_bytes = in.pitch * channels * index_t(sizeof(float));
  const index_t band_rows = std::max<index_t>(
      1, (band_bytes / row_bytes - (g.kernel_h - 1) * g.dilation_h - 1) / g.stride_h + 1);
  band* bands = conv_scratch<band, conv_scratch_use::sparse_bands>(plane);
  index_t band_count = 0;
  for (index_t b0 = 0; b0 < plane; b0 += kc_depth) {
    const index_t b1 = std::min(plane, b0 + kc_depth);
    for (index_t p0 = b0; p0 < b1;) {
      const index_t p1 = std::min(b1, (p0 / g.out_width + band_rows) * g.out_width);
      bands[band_count++] = {p0, p1, p0 == b0, p1 == b1, b0 == 0};
      p0 = p1;
    }
  }

  // Each output channel's nonzero values and their positions' window starts, band by band: ends[o * band_count + s]
  // is where band s of channel o's list ends.
  auto* values = conv_scratch<float, conv_scratch_use::sparse_values>(outputs * plane + 16);
  auto* bases = conv_scratch<std::int32_t, conv_scratch_use::sparse_bases>(outputs * plane + 16 + plane);
  auto* ends = conv_scratch<index_t, conv_scratch_use::sparse_ends>(outputs * band_count);
  std::int32_t* position_bases = bases + outputs * plane + 16;
  for (index_t oh = 0, p = 0; oh < g.out_height; ++oh)
    for (index_t ow = 0; ow < g.out_width; ++ow)
      position_bases[p++] = std::int32_t((oh * g.stride_h * in.pitch + ow * g.stride_w) * channels);
  index_t nonzeros = 0;
  const index_t budget = index_t(sparse_gradient_max_density * double(outputs * plane));
  for (index_t o = 0; o < outputs; ++o) {
    const float* row = dy + o * plane;
    for (index_t s = 0; s < band_count; ++s) {
      const index_t p1 = bands[s].p1;
      for (index_t p = bands[s].p0; p < p1; p += 16) {
        const __mmask16 lanes = __mmask16(p1 - p >= 16 ? 0xFFFF : (1u << (p1 - p)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(lanes, row + p);
        // Unordered compares true: a NaN is summed, as the dense kernel sums it.
        const __mmask16 kept = _mm512_mask_cmp_ps_mask(lanes, v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        // Compressed in registers and stored whole, the lanes past the kept ones overwritten by the next store:
        // the compressing store to memory is microcoded on Zen 4, tens of times slower.
        _mm512_storeu_ps(values + nonzeros, _mm512_maskz_compress_ps(kept, v));
        _mm512_storeu_si512(bases + nonzeros,
                            _mm512_maskz_compress_epi32(kept, _mm512_maskz_loadu_epi32(lanes, position_bases + p)));
        nonzeros += _mm_popcnt_u32(kept);
      }
      ends[o * band_count + s] = nonzeros;
    }
    if (nonzeros > budget) return false;
  }

  // The sample channels-last, with its padding as the direct kernels lay it out (layout_of).
  float* input = conv_scratch<float, conv_scratch_use::channels_last_input>(in.plane * channels + 16);
  if (in.padded) std::fill_n(input, in.plane * channels, 0.0f);
  for (index_t h = 0; h < g.height; ++h)
    gemm_detail::transpose_into(x + h * g.width, g.height * g.width, channels, g.width,
                                input + ((h + g.pad_h) * in.pitch + g.pad_w) * channels);

  // The window's vectors in (kernel row, kernel column, channel) order, and where each lies from a window's start.
  const index_t vectors = g.kernel_h * g.kernel_w * channels / 16, per_pixel = channels / 16;
  auto* offsets = conv_scratch<std::int32_t, conv_scratch_use::window_offsets_channels_last>(vectors);
  for (index_t i = 0, v = 0; i < g.kernel_h; ++i)
    for (index_t j = 0; j < g.kernel_w; ++j)
      for (index_t c = 0; c < per_pixel; ++c)
        offsets[v++] = std::int32_t((i * g.dilation_h * in.pitch + j * g.dilation_w) * channels + 16 * c);
  // Where each of those elements lies in dweight_t (its row in im2col's order: channel, kernel row, kernel column).
  const index_t elements = vectors * 16, window = g.kernel_h * g.kernel_w;
  auto* places = conv_scratch<index_t, conv_scratch_use::sparse_window_places>(elements);
  for (index_t pixel = 0, e = 0; pixel < window; ++pixel)
    for (index_t c = 0; c < channels; ++c) places[e++] = (c * window + pixel) * outputs;

  // Per output channel, its sums over the window in the vectors' order (dweight_t's values, where the sample adds to
  // them), and its chains between bands.
  float* sums = conv_scratch<float, conv_scratch_use::sparse_window_sums>(2 * outputs * elements);
  float* partial = sums + outputs * elements;
  if (!overwrite)
    for (index_t o = 0; o < outputs; ++o)
      for (index_t e = 0; e < elements; ++e) sums[o * elements + e] = dweight_t[places[e] + o];
  static constexpr auto chains = make_sparse_chains(std::make_integer_sequence<int, max_vectors>{});
  for (index_t v0 = 0; v0 < vectors; v0 += max_vectors) {
    const auto chain = chains[std::min<index_t>(max_vectors, vectors - v0) - 1];
    for (index_t s = 0; s < band_count; ++s) {
      const band& run = bands[s];
      for (index_t o = 0; o < outputs; ++o) {
        const index_t t0 = o * band_count + s == 0 ? 0 : ends[o * band_count + s - 1], t1 = ends[o * band_count + s];
        chain(input, offsets + v0, values + t0, bases + t0, t1 - t0, partial + o * elements + 16 * v0,
              sums + o * elements + 16 * v0, run.start, run.finish, overwrite && run.first_block);
      }
    }
  }
  for (index_t o = 0; o < outputs; ++o)
    for (index_t e = 0; e < elements; ++e) dweight_t[places[e] + o] = sums[o * elements + e];
  return true;
#else
  (void)x, (void)dy, (void)dweight_t, (void)g, (void)overwrite;
  return false;
#endif
}


// ---- the input gradient ---------------------------------------------------------------------------------------------
// dx = col2im(W^T dy), as conv2d_backward computes it densely: each element of W^T dy, window element (c, i, j) at
// output position q, is one FMA chain over the output channels from zero (one k block), and col2im adds those to a
// zeroed dx in window order (i, then j) at the input pixel each lands on. Here the chains run over the output channels
// whose dy is not zero at q, vectorised over the input channels, and are added to the pixel's sum in the same order:
// the same bits wherever the weights are finite. (A chain over no nonzero adds +0, which changes no sum: col2im's
// sums start at +0 and a sum of nonzero terms never becomes -0.)

// Whether conv2d_sparse_input_gradient can compute this convolution's input gradient with the bits of gemm and
// col2im: turned on, floats on AVX-512, one group of a multiple of 16 channels, and gemm taking the per-sample product
// W^T dy blocked in one k block.
template <class T>
bool conv_sparse_input_gradient_applies(const conv_geometry& g,
                                        product_precision precision = product_precision::single) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const index_t plane = g.out_plane();
    return sparse_conv_gradients_enabled() && g.groups == 1 && g.channels % 16 == 0 && plane > 0 &&
           g.out_channels <= gemm_detail::cache_block<float>::kc &&
           gemm_detail::route_of<T>(true, false, g.group_k(), plane, g.out_channels, plane, precision) ==
               gemm_detail::gemm_route::blocked;
  }
#endif
  (void)g, (void)precision;
  return false;
}

namespace conv_sparse_detail {

// The chains of two output positions at once (their pixels' sums are independent, and two positions' chains keep
// twice as many FMAs in flight), for Vectors vectors of input channels: sum_a (+)= the chain over a's listed output
// channels of value * weights[index], the same for b. weights: one window element's weights, (output channel x input
// channels), indices already scaled to rows.
template <int Vectors>
KILN_NOINLINE void input_gradient_chains(const float* KILN_RESTRICT weights, const float* values_a,
                                         const std::int32_t* rows_a, index_t count_a, float* sum_a,
                                         const float* values_b, const std::int32_t* rows_b, index_t count_b,
                                         float* sum_b) {
#if defined(__AVX512F__)
  __m512 a[Vectors], b[Vectors];
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) a[v] = b[v] = _mm512_setzero_ps();
  const index_t both = std::min(count_a, count_b);
  index_t t = 0;
  for (; t < both; ++t) {
    const __m512 value_a = _mm512_set1_ps(values_a[t]), value_b = _mm512_set1_ps(values_b[t]);
    const float* row_a = weights + rows_a[t];
    const float* row_b = weights + rows_b[t];
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) {
      a[v] = _mm512_fmadd_ps(value_a, _mm512_loadu_ps(row_a + 16 * v), a[v]);
      b[v] = _mm512_fmadd_ps(value_b, _mm512_loadu_ps(row_b + 16 * v), b[v]);
    }
  }
  for (index_t u = t; u < count_a; ++u) {
    const __m512 value = _mm512_set1_ps(values_a[u]);
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v)
      a[v] = _mm512_fmadd_ps(value, _mm512_loadu_ps(weights + rows_a[u] + 16 * v), a[v]);
  }
  for (index_t u = t; u < count_b; ++u) {
    const __m512 value = _mm512_set1_ps(values_b[u]);
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v)
      b[v] = _mm512_fmadd_ps(value, _mm512_loadu_ps(weights + rows_b[u] + 16 * v), b[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) {
    _mm512_storeu_ps(sum_a + 16 * v, _mm512_add_ps(_mm512_loadu_ps(sum_a + 16 * v), a[v]));
    _mm512_storeu_ps(sum_b + 16 * v, _mm512_add_ps(_mm512_loadu_ps(sum_b + 16 * v), b[v]));
  }
#else
  (void)weights, (void)values_a, (void)rows_a, (void)count_a, (void)sum_a, (void)values_b, (void)rows_b,
      (void)count_b, (void)sum_b;
#endif
}

// Input channels summed per call: at most this many vectors (two positions' chains hold twice as many registers).
inline constexpr int max_channel_vectors = 4;
using input_gradient_chains_fn = void (*)(const float*, const float*, const std::int32_t*, index_t, float*,
                                          const float*, const std::int32_t*, index_t, float*);
template <int... V>
constexpr std::array<input_gradient_chains_fn, sizeof...(V)> make_input_gradient_chains(
    std::integer_sequence<int, V...>) {
  return {&input_gradient_chains<V + 1>...};
}

}  // namespace conv_sparse_detail

// The weights as conv2d_sparse_input_gradient reads them, window element by window element, each an (output channel x
// input channels) matrix; in the calling thread's scratch, valid until its next call. Once per backward pass.
inline const float* conv_sparse_input_gradient_weights(const float* weight, const conv_geometry& g) {
  const index_t window = g.kernel_h * g.kernel_w, channels = g.channels, outputs = g.out_channels;
  float* packed = conv_scratch<float, conv_scratch_use::sparse_input_gradient_weights>(window * outputs * channels);
  for (index_t o = 0; o < outputs; ++o)
    for (index_t c = 0; c < channels; ++c)
      for (index_t e = 0; e < window; ++e)
        packed[(e * outputs + o) * channels + c] = weight[(o * channels + c) * window + e];
  return packed;
}

// One sample's input gradient dx (channels x height x width, overwritten) from its output gradient dy and the weights
// as conv_sparse_input_gradient_weights lays them out, from the nonzeros of dy alone; see above. Returns false,
// computing nothing, where more than sparse_gradient_max_density of dy is nonzero: the caller then runs gemm
// and col2im. The caller has checked conv_sparse_input_gradient_applies.
inline bool conv2d_sparse_input_gradient(const float* packed_weights, const float* dy, float* dx,
                                         const conv_geometry& g) {
#if defined(__AVX512F__)
  using namespace conv_sparse_detail;
  const index_t plane = g.out_plane(), channels = g.channels, outputs = g.out_channels;
  const index_t pixels = g.height * g.width;
  // Each output position's nonzero output channels: their dy values and their rows in a window element's weights.
  float* dy_t = conv_scratch<float, conv_scratch_use::transposed_output_gradient>(plane * outputs);
  gemm_detail::transpose_into(dy, plane, outputs, plane, dy_t);
  auto* values = conv_scratch<float, conv_scratch_use::sparse_values>(outputs * plane + 16);
  auto* rows = conv_scratch<std::int32_t, conv_scratch_use::sparse_bases>(outputs * plane + 16);
  auto* ends = conv_scratch<index_t, conv_scratch_use::sparse_ends>(plane + 1);
  const index_t budget = index_t(sparse_gradient_max_density * double(outputs * plane));
  const __m512i row_step = _mm512_set1_epi32(std::int32_t(16 * channels));
  index_t nonzeros = 0;
  ends[0] = 0;
  for (index_t q = 0; q < plane; ++q) {
    __m512i row = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32(std::int32_t(channels)));
    for (index_t o = 0; o < outputs; o += 16, row = _mm512_add_epi32(row, row_step)) {
      const __mmask16 lanes = __mmask16(outputs - o >= 16 ? 0xFFFF : (1u << (outputs - o)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, dy_t + q * outputs + o);
      const __mmask16 kept = _mm512_mask_cmp_ps_mask(lanes, v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      _mm512_storeu_ps(values + nonzeros, _mm512_maskz_compress_ps(kept, v));
      _mm512_storeu_si512(rows + nonzeros, _mm512_maskz_compress_epi32(kept, row));
      nonzeros += _mm_popcnt_u32(kept);
    }
    ends[q + 1] = nonzeros;
    if (nonzeros > budget) return false;
  }

  // The sums channels-last, in window order: window element (i, j) at position (oh, ow) lands on input pixel
  // (oh * stride_h - pad_h + i * dilation_h, ow * stride_w - pad_w + j * dilation_w), where that lies in the input.
  float* sums = conv_scratch<float, conv_scratch_use::sparse_input_gradient_sums>(pixels * channels + 16);
  std::fill_n(sums, pixels * channels, 0.0f);
  float* nowhere = sums + pixels * channels;  // the second position's sums where there is no second position
  static constexpr auto chains = make_input_gradient_chains(std::make_integer_sequence<int, max_channel_vectors>{});
  const index_t vectors = channels / 16;
  for (index_t i = 0; i < g.kernel_h; ++i)
    for (index_t j = 0; j < g.kernel_w; ++j) {
      const float* weights = packed_weights + (i * g.kernel_w + j) * outputs * channels;
      // The positions whose pixel lies in the input, with their pixels, two at a time.
      index_t pending = -1, pending_pixel = 0;
      auto run = [&](index_t qa, index_t pixel_a, index_t qb, index_t pixel_b) {
        for (index_t v0 = 0; v0 < vectors; v0 += max_channel_vectors) {
          const auto chain = chains[std::min<index_t>(max_channel_vectors, vectors - v0) - 1];
          const index_t count_b = qb < 0 ? 0 : ends[qb + 1] - ends[qb], start_b = qb < 0 ? 0 : ends[qb];
          chain(weights + 16 * v0, values + ends[qa], rows + ends[qa], ends[qa + 1] - ends[qa],
                sums + pixel_a * channels + 16 * v0, values + start_b, rows + start_b, count_b,
                qb < 0 ? nowhere : sums + pixel_b * channels + 16 * v0);
        }
      };
      for (index_t oh = 0, q = 0; oh < g.out_height; ++oh) {
        const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
        for (index_t ow = 0; ow < g.out_width; ++ow, ++q) {
          const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
          if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width || ends[q + 1] == ends[q]) continue;
          if (pending < 0) {
            pending = q;
            pending_pixel = ih * g.width + iw;
          } else {
            run(pending, pending_pixel, q, ih * g.width + iw);
            pending = -1;
          }
        }
      }
      if (pending >= 0) run(pending, pending_pixel, -1, 0);
    }
  gemm_detail::transpose_into(sums, channels, pixels, channels, dx);
  return true;
#else
  (void)packed_weights, (void)dy, (void)dx, (void)g;
  return false;
#endif
}

}  // namespace kiln::kernels::cpu
