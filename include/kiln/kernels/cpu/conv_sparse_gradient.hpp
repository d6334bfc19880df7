// A convolution's weight and input gradients from an output gradient that is mostly zeros, as it is under a max pool:
// the pool's backward passes each window's gradient to one position of four (2 x 2), and a ReLU before the pool
// zeroes more (a convolution under a 2 x 2 pool sees at most a quarter nonzero). The dense kernels (conv_direct.hpp,
// im2col + gemm + col2im) multiply every zero; these skip them, sample by sample where at most
// sparse_gradient_max_density of the sample's output gradient is nonzero.
//
// They sum the same terms as the dense kernels, in the same order: each element is the same FMA chains (one per k
// block, from zero) over the same terms less those whose dy is zero, added to the sum before it in the same order. A
// zero term leaves a chain's value as it is (x + 0 = x, and +0 + -0 = +0), so the bits are the dense kernels'
// wherever the input and the weights are finite; where an infinity or a NaN there meets a zero of dy, the dense
// kernels' NaN is not produced. A NaN in dy is summed like any nonzero. They multiply in single precision whatever the
// policy's precision: under bfloat16 products (policy::cpu_bf16), whose dense kernels round the operands, the samples
// they take are computed more exactly than the dense kernels would, rather than with their bits.
//
// The weight gradient turns the dense kernel's loops round: that one vectorises over output channels, sixteen of
// which are rarely all zero at one position; this one vectorises over the window's elements and walks each output
// channel's nonzero positions, reading the input channels-last (copied once per sample) so that a window row's
// elements (kernel width x channels) lie together. The input gradient is below.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/switches.hpp"
#include "kiln/kernels/cpu/conv_direct.hpp"
#include "kiln/kernels/cpu/conv_geometry.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"

namespace kiln::kernels::cpu {

// Samples whose output gradient has at most this fraction of nonzeros take the sparse kernels; denser ones the dense
// kernels, which then run faster. The result is the same either way (above), so only the time depends on it.
inline constexpr double sparse_gradient_max_density = 0.5;

namespace conv_sparse_detail {
// Whether the user allows the kernels: the switch run_switch::sparse_gradient (core/switches.hpp,
// KILN_SPARSE_GRADIENT), which set_sparse_conv_gradients sets.
inline std::atomic<bool>& sparse_allowed() { return switches_detail::state(run_switch::sparse_gradient); }

// Accumulator registers a pass may hold: the window elements are summed in chunks of at most this many vectors.
inline constexpr int max_vectors = 24;

// FMA chains over one run of listed terms, for Vectors vectors of window elements: acc[v] (+)= the sum over the list
// of value[t] * input[base[t] + offsets[v]]. For the weight gradient a run is one output channel's nonzero positions in
// one band (below), for the input gradient one position's nonzero output channels. A chain starts from zero at its k
// block's first run (`start`), else from where the run before left it in `partial`; at the block's last run
// (`finish`) it is folded into `sums` as the dense kernel folds a block into C: sums = acc where `first` (the first
// block of a sample that overwrites), else sums + acc. Between runs a chain waits in `partial`: a store and a load,
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
template <int... V>
constexpr std::array<sparse_chain_fn, sizeof...(V)> make_sparse_chains(std::integer_sequence<int, V...>) {
  return {&sparse_chain<V + 1>...};
}

// The input rows that one band of output positions reads should stay in L1 while every output channel sweeps them:
// at most this many bytes (Zen 4 has 32 KiB of L1, Sapphire Rapids 48).
inline constexpr index_t band_bytes = 32 * 1024;

// A run of output positions [p0, p1) inside one k block: whether it starts the block, ends it, and is in block 0.
struct band {
  index_t p0, p1;
  bool start, finish, first_block;
};

}  // namespace conv_sparse_detail

// Turns the sparse weight and input gradients on or off for every later call (on by default; KILN_SPARSE_GRADIENT=0 in
// the environment starts them off). They change the time a step takes, not its results (see the top of this file).
inline void set_sparse_conv_gradients(bool enabled) {
  conv_sparse_detail::sparse_allowed().store(enabled, std::memory_order_relaxed);
}
inline bool sparse_conv_gradients_enabled() {
  return conv_sparse_detail::sparse_allowed().load(std::memory_order_relaxed);
}

// Whether conv2d_sparse_weight_gradient can compute this convolution's weight gradient with
// conv2d_direct_weight_gradient's bits in single precision: turned on, floats on AVX-512, one group of a multiple of 16
// channels, an input whose padded channels-last copy 32-bit offsets can index, and a product the direct kernel takes.
template <class T>
bool conv_sparse_weight_gradient_applies(const conv_geometry& g) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const auto in = conv_direct_detail::layout_of(g);
    return sparse_conv_gradients_enabled() && g.groups == 1 && g.channels % 16 == 0 &&
           in.plane * g.channels < (index_t(1) << 31) - 16 && conv_direct_weight_gradient_applies<T>(g);
  }
#endif
  (void)g;
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
// zeroed dx in window order (i, then j) at the input pixel each lands on. Here the chains of one position, all its
// window elements at once, run over the output channels whose dy is not zero there (the same list for all of them),
// and the positions go from the last to the first: a pixel's window element (i, j) comes from the position that many
// window steps before it, so the later (i, j), the earlier the position, and the pixel receives its terms in
// col2im's order. The same bits wherever the weights are finite. (A position with no nonzero adds +0 everywhere and is
// skipped: col2im's sums start at +0, and a sum of nonzero terms never becomes -0.)

// Whether conv2d_sparse_input_gradient can compute this convolution's input gradient with the bits of gemm and
// col2im in single precision: turned on, floats on AVX-512, one group of a multiple of 16 channels, and gemm taking
// the per-sample product W^T dy blocked in one k block.
template <class T>
bool conv_sparse_input_gradient_applies(const conv_geometry& g) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const index_t plane = g.out_plane();
    return sparse_conv_gradients_enabled() && g.groups == 1 && g.channels % 16 == 0 && plane > 0 &&
           g.out_channels <= gemm_detail::cache_block<float>::kc &&
           g.out_channels * g.group_k() < (index_t(1) << 31) &&
           gemm_detail::route_of<T>(true, false, g.group_k(), plane, g.out_channels, plane) ==
               gemm_detail::gemm_route::blocked;
  }
#endif
  (void)g;
  return false;
}

// The weights as conv2d_sparse_input_gradient reads them: each output channel's window channels-last, (kernel row,
// kernel column, input channel); in the calling thread's scratch, valid until its next call. Once per thread's share of
// a backward pass's samples.
inline const float* conv_sparse_input_gradient_weights(const float* weight, const conv_geometry& g) {
  const index_t window = g.kernel_h * g.kernel_w, channels = g.channels, outputs = g.out_channels;
  float* packed = conv_scratch<float, conv_scratch_use::sparse_input_gradient_weights>(window * outputs * channels);
  for (index_t o = 0; o < outputs; ++o)
    gemm_detail::transpose_into(weight + o * channels * window, window, channels, window,
                                packed + o * window * channels);
  return packed;
}

// One sample's input gradient dx (channels x height x width, overwritten) from its output gradient dy and the weights
// as conv_sparse_input_gradient_weights lays them out, from the nonzeros of dy alone; see above. Returns false,
// computing nothing, where more than sparse_gradient_max_density of dy is nonzero: the caller then runs gemm and
// col2im. The caller has checked conv_sparse_input_gradient_applies.
inline bool conv2d_sparse_input_gradient(const float* packed_weights, const float* dy, float* dx,
                                         const conv_geometry& g) {
#if defined(__AVX512F__)
  using namespace conv_sparse_detail;
  const index_t plane = g.out_plane(), channels = g.channels, outputs = g.out_channels;
  const index_t window = g.kernel_h * g.kernel_w, elements = window * channels, pixels = g.height * g.width;
  // Each output position's nonzero output channels: their dy values and where their windows start in the weights.
  float* dy_t = conv_scratch<float, conv_scratch_use::transposed_output_gradient>(plane * outputs);
  gemm_detail::transpose_into(dy, plane, outputs, plane, dy_t);
  auto* values = conv_scratch<float, conv_scratch_use::sparse_values>(outputs * plane + 16);
  auto* starts = conv_scratch<std::int32_t, conv_scratch_use::sparse_bases>(outputs * plane + 16);
  auto* ends = conv_scratch<index_t, conv_scratch_use::sparse_ends>(plane + 1);
  const index_t budget = index_t(sparse_gradient_max_density * double(outputs * plane));
  const __m512i start_step = _mm512_set1_epi32(std::int32_t(16 * elements));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i first_starts = _mm512_mullo_epi32(lane, _mm512_set1_epi32(std::int32_t(elements)));
  index_t nonzeros = 0;
  ends[0] = 0;
  for (index_t q = 0; q < plane; ++q) {
    __m512i start = first_starts;
    for (index_t o = 0; o < outputs; o += 16, start = _mm512_add_epi32(start, start_step)) {
      const __mmask16 lanes = __mmask16(outputs - o >= 16 ? 0xFFFF : (1u << (outputs - o)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, dy_t + q * outputs + o);
      // As in the weight gradient: a NaN is kept, and the compress goes through a register.
      const __mmask16 kept = _mm512_mask_cmp_ps_mask(lanes, v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      _mm512_storeu_ps(values + nonzeros, _mm512_maskz_compress_ps(kept, v));
      _mm512_storeu_si512(starts + nonzeros, _mm512_maskz_compress_epi32(kept, start));
      nonzeros += _mm_popcnt_u32(kept);
    }
    ends[q + 1] = nonzeros;
    if (nonzeros > budget) return false;
  }

  // The window's vectors lie one after the other in an output channel's packed weights.
  const index_t vectors = elements / 16;
  auto* offsets = conv_scratch<std::int32_t, conv_scratch_use::window_offsets_channels_last>(vectors);
  for (index_t v = 0; v < vectors; ++v) offsets[v] = std::int32_t(16 * v);
  // The pixels' sums channels-last, and one position's chains.
  float* sums = conv_scratch<float, conv_scratch_use::sparse_input_gradient_sums>(pixels * channels + elements);
  float* chain_sums = sums + pixels * channels;
  std::fill_n(sums, pixels * channels, 0.0f);
  static constexpr auto chains = make_sparse_chains(std::make_integer_sequence<int, max_vectors>{});
  for (index_t q = plane - 1; q >= 0; --q) {
    const index_t t0 = ends[q], t1 = ends[q + 1];
    if (t0 == t1) continue;
    for (index_t v0 = 0; v0 < vectors; v0 += max_vectors) {
      const auto chain = chains[std::min<index_t>(max_vectors, vectors - v0) - 1];
      chain(packed_weights, offsets + v0, values + t0, starts + t0, t1 - t0, nullptr, chain_sums + 16 * v0, true,
            true, true);
    }
    const index_t oh = q / g.out_width, ow = q % g.out_width;
    for (index_t i = 0; i < g.kernel_h; ++i) {
      const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
      if (ih < 0 || ih >= g.height) continue;
      for (index_t j = 0; j < g.kernel_w; ++j) {
        const index_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
        if (iw < 0 || iw >= g.width) continue;
        float* pixel = sums + (ih * g.width + iw) * channels;
        const float* term = chain_sums + (i * g.kernel_w + j) * channels;
        for (index_t c = 0; c < channels; c += 16)
          _mm512_storeu_ps(pixel + c, _mm512_add_ps(_mm512_loadu_ps(pixel + c), _mm512_load_ps(term + c)));
      }
    }
  }
  gemm_detail::transpose_into(sums, channels, pixels, channels, dx);
  return true;
#else
  (void)packed_weights, (void)dy, (void)dx, (void)g;
  return false;
#endif
}

}  // namespace kiln::kernels::cpu
