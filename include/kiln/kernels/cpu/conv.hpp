// Convolution on the CPU: im2col / col2im (the convolution becomes one GEMM per sample and group), the per-channel
// bias of NCHW tensors, and the convolution itself built from them. The GEMM is the policy's; on kiln's own GEMM the
// forward and the weight gradient of most convolutions read the input in place instead (conv_direct.hpp), with the
// same bits, and the input gradient of unit-stride ones is a forward convolution of dy
// (conv_direct_input_gradient.hpp).
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kiln/core/config.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/conv_direct.hpp"
#include "kiln/kernels/cpu/conv_direct_input_gradient.hpp"
#include "kiln/kernels/cpu/conv_geometry.hpp"
#include "kiln/kernels/cpu/conv_sparse_gradient.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/gemm_pack.hpp"
#include "kiln/kernels/cpu/reduce.hpp"

namespace kiln::kernels::cpu {

// The convolution kernels of the CPU policies.
struct conv_kernels {
  // The samples of a weight gradient's partial sums (see conv2d_backward): a batch of 64 makes 4 groups, shared
  // evenly by 1, 2 or 4 threads. Fewer, larger groups keep the partial sums, a weight gradient's size each, in L2
  // beside the column matrix.
  static constexpr index_t weight_gradient_group = 16;

  // col[(c * kh + i) * kw + j, oh * out_w + ow] = x[c, oh * sh - ph + i * dh, ow * sw - pw + j * dw] (0 outside)
  // for one sample: the column matrix whose product with the weights is the convolution.
  template <class T>
  KILN_KERNEL static void im2col(const T* KILN_RESTRICT x, T* KILN_RESTRICT col, const conv_geometry& g) {
    const index_t oh_n = g.out_height, ow_n = g.out_width;
    for (index_t c = 0; c < g.channels; ++c) {
      const T* plane = x + c * g.height * g.width;
      for (index_t i = 0; i < g.kernel_h; ++i) {
        for (index_t j = 0; j < g.kernel_w; ++j) {
          T* row = col + ((c * g.kernel_h + i) * g.kernel_w + j) * oh_n * ow_n;
          const index_t dx = j * g.dilation_w - g.pad_w;
          // Output columns whose input column lies inside [0, width): ow in [ow_lo, ow_hi).
          index_t ow_lo = dx >= 0 ? 0 : (-dx + g.stride_w - 1) / g.stride_w;
          index_t ow_hi = g.width - dx > 0 ? (g.width - dx + g.stride_w - 1) / g.stride_w : 0;
          ow_lo = std::min(ow_lo, ow_n);
          ow_hi = std::clamp(ow_hi, ow_lo, ow_n);
          for (index_t oh = 0; oh < oh_n; ++oh) {
            T* out = row + oh * ow_n;
            const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= g.height) {
              std::fill_n(out, ow_n, T(0));
              continue;
            }
            const T* in = plane + ih * g.width + dx;
            std::fill_n(out, ow_lo, T(0));
            if (g.stride_w == 1) {
              std::memcpy(out + ow_lo, in + ow_lo, static_cast<std::size_t>(ow_hi - ow_lo) * sizeof(T));
            } else {
              for (index_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * g.stride_w];
            }
            std::fill_n(out + ow_hi, ow_n - ow_hi, T(0));
          }
        }
      }
    }
  }

  // The adjoint of im2col: x[c, ih, iw] = sum of the col entries that im2col copied from it (x is overwritten).
  template <class T>
  KILN_KERNEL static void col2im(const T* KILN_RESTRICT col, T* KILN_RESTRICT x, const conv_geometry& g) {
    std::fill_n(x, g.in_size(), T(0));
    const index_t oh_n = g.out_height, ow_n = g.out_width;
    for (index_t c = 0; c < g.channels; ++c) {
      T* plane = x + c * g.height * g.width;
      for (index_t i = 0; i < g.kernel_h; ++i) {
        for (index_t j = 0; j < g.kernel_w; ++j) {
          const T* row = col + ((c * g.kernel_h + i) * g.kernel_w + j) * oh_n * ow_n;
          const index_t dx = j * g.dilation_w - g.pad_w;
          index_t ow_lo = dx >= 0 ? 0 : (-dx + g.stride_w - 1) / g.stride_w;
          index_t ow_hi = g.width - dx > 0 ? (g.width - dx + g.stride_w - 1) / g.stride_w : 0;
          ow_lo = std::min(ow_lo, ow_n);
          ow_hi = std::clamp(ow_hi, ow_lo, ow_n);
          for (index_t oh = 0; oh < oh_n; ++oh) {
            const index_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            const T* in = row + oh * ow_n;
            T* out = plane + ih * g.width + dx;
            if (g.stride_w == 1) {
              for (index_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] += in[ow];
            } else {
              for (index_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * g.stride_w] += in[ow];
            }
          }
        }
      }
    }
  }

  // y[n, o, :, :] = sum over the group's channels and the window of weight[o, c, i, j] x[n, c, ...] + bias[o]:
  // im2col of each sample, then one GEMM per group (a pointwise kernel reads the input directly). weight is
  // (out_channels, channels / groups, kernel_h, kernel_w); bias may be null; col has room for batch * g.col_size()
  // elements (none for pointwise) and is scratch: each slice of the batch reuses the column matrix of its first
  // sample's place, which stays in cache, and the backward builds the columns again (see conv2d_backward). Policy
  // names the policy whose im2col, gemm and add_channel_bias run, so a policy that replaces only the GEMM
  // (cpu_blas) convolves with its own GEMM.
  // act (with LeakyReLU's slope) is applied to each sample's output after its bias, while it is still in cache: a
  // static model fuses a Conv2D and the activation layer after it this way (see Sequential).
  template <class Policy, class T>
  KILN_KERNEL static void conv2d_forward(const T* x, const T* weight, const T* bias, T* y, T* col, index_t batch,
                             const conv_geometry& g, activation act = activation::identity, T slope = T(0)) {
    const index_t k = g.group_k(), plane = g.out_plane(), out_per_group = g.out_channels / g.groups;
    // A unit-stride convolution on kiln's own GEMM reads its input in place (conv_direct.hpp), with the same bits;
    // the weights are packed for it once, here, and read by every thread.
    const T* direct_weights = nullptr;
    if constexpr (requires { requires Policy::direct_convolution; }) {
      if (conv_direct_applies<T>(g, Policy::gemm_precision())) direct_weights = conv_direct_pack_weights(weight, g);
    }
    // Samples are independent: each thread takes a slice of the batch (im2col included), rather than every small
    // per-sample GEMM forking and joining the threads while im2col runs on one.
    Policy::for_batch_slices(batch, g.out_channels * plane * k, [&](index_t n0, index_t n1) {
      for (index_t n = n0; n < n1; ++n) {
        if (direct_weights) {
          conv2d_direct_forward(x + n * g.in_size(), direct_weights, bias, y + n * g.out_size(), g);
        } else {
          const T* columns = sample_columns<Policy>(x, col + n0 * g.col_size(), n, g);
          for (index_t grp = 0; grp < g.groups; ++grp)
            Policy::gemm(false, false, out_per_group, plane, k, T(1), weight + grp * out_per_group * k, k,
                         columns + grp * k * plane, plane, T(0), y + n * g.out_size() + grp * out_per_group * plane,
                         plane);
          // The bias goes on each sample while its output is still in cache, on the sample's thread.
          if (bias) Policy::add_channel_bias(y + n * g.out_size(), bias, 1, g.out_channels, plane);
        }
        if (act != activation::identity) {
          T* out = y + n * g.out_size();
          Policy::activation_forward(act, out, out, g.out_size(), slope);
        }
      }
    });
  }

  // Given dL/dy: dweight (+)= sum over samples of dy_n col_n^T, dbias (+)= channel sums of dy (accumulate adds;
  // otherwise they are overwritten), and dx = col2im(weight^T dy_n) (overwritten; skipped when null). col is scratch
  // of conv2d_forward's size.
  // input_act, when not identity, takes in the backward of the activation that produced x (x is its output,
  // act_input its input, needed by the activations whose backward reads it): each sample's dx goes through it while
  // it is still in cache, and dx is then the gradient with respect to the activation's input. A static model's
  // Conv2D does this for the activation layer before it, whose own pass over the tensor is then skipped.
  // Each sample's columns are built again from x rather than kept from the forward: a batch's columns, a copy of the
  // input per window element, can outgrow the last-level cache, so keeping them meant writing them to memory and
  // reading them back twice, where im2col from the sample's input is a copy in cache. Where
  // conv_direct_weight_gradient_applies, the weight gradient reads them in x where they lie, and builds none.
  template <class Policy, class T>
  KILN_KERNEL static void conv2d_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias, T* col,
                              index_t batch, const conv_geometry& g, bool accumulate,
                              activation input_act = activation::identity, const T* act_input = nullptr,
                              T slope = T(0)) {
    const index_t k = g.group_k(), plane = g.out_plane(), out_per_group = g.out_channels / g.groups;
    if (dbias) Policy::sum_channels(dy, dbias, batch, g.out_channels, plane, accumulate);
    // The weight gradient is a sum over the samples. They go in fixed groups of weight_gradient_group, each group's
    // samples in order into the group's own partial sum, and the partial sums are then added in order: the bits
    // depend on the batch alone, never on the thread count, and the groups run on the threads side by side. (Summed
    // in one chain, each sample's GEMM forked and joined the threads for a small product, which kept a CNN's second
    // thread waiting.) It is computed transposed, dW^T (k x out) += col_n dy_n^T: the GEMM then reads the large
    // column matrix in place and packs only dy_n, where dW = dy_n col_n^T packed all of col_n^T.
    if (dweight) {
      const index_t group_weights = out_per_group * k, weights = g.groups * group_weights;
      const index_t sample_groups = (batch + weight_gradient_group - 1) / weight_gradient_group;
      T* partial = conv_scratch<T, conv_scratch_use::weight_gradient_sums>((sample_groups + 1) * weights);
      T* dweight_t = partial + sample_groups * weights;
      bool direct = false;
      [[maybe_unused]] bool sparse = false;  // read for floats only, as are sparse_dx and sparse_weights below
      if constexpr (requires { requires Policy::direct_convolution; }) {
        direct = conv_direct_weight_gradient_applies<T>(g, Policy::gemm_precision());
        sparse = conv_sparse_weight_gradient_applies<T>(g);
      }
      Policy::for_jobs(sample_groups, weight_gradient_group * g.out_channels * plane * k, [&](index_t s0, index_t s1) {
        // Each thread builds its samples' columns in the place of its first sample's, as in the forward.
        T* place = col + s0 * weight_gradient_group * g.col_size();
        for (index_t s = s0; s < s1; ++s) {
          const index_t n0 = s * weight_gradient_group, n1 = std::min(batch, n0 + weight_gradient_group);
          for (index_t n = n0; n < n1; ++n) {
            // A sample whose output gradient is mostly zeros (under a max pool) skips them (conv_sparse_gradient.hpp).
            if constexpr (std::is_same_v<T, float>)
              if (sparse && conv2d_sparse_weight_gradient(x + n * g.in_size(), dy + n * g.out_size(),
                                                          partial + s * weights, g, n == n0))
                continue;
            if (direct) {
              conv2d_direct_weight_gradient(x + n * g.in_size(), dy + n * g.out_size(), partial + s * weights, g,
                                            n == n0);
              continue;
            }
            const T* columns = sample_columns<Policy>(x, place, n, g);
            for (index_t grp = 0; grp < g.groups; ++grp)
              Policy::gemm(false, true, k, out_per_group, plane, T(1), columns + grp * k * plane, plane,
                           dy + n * g.out_size() + grp * out_per_group * plane, plane, n == n0 ? T(0) : T(1),
                           partial + s * weights + grp * group_weights, out_per_group);
          }
        }
      });
      if (accumulate)
        for (index_t grp = 0; grp < g.groups; ++grp)
          gemm_detail::transpose_into(dweight + grp * group_weights, k, out_per_group, k,
                                      dweight_t + grp * group_weights);
      for (index_t e = 0; e < weights; ++e) dweight_t[e] = accumulate ? dweight_t[e] + partial[e] : partial[e];
      for (index_t s = 1; s < sample_groups; ++s)
        for (index_t e = 0; e < weights; ++e) dweight_t[e] += partial[s * weights + e];
      for (index_t grp = 0; grp < g.groups; ++grp)
        gemm_detail::transpose_into(dweight_t + grp * group_weights, out_per_group, k, out_per_group,
                                    dweight + grp * group_weights);
    }
    if (!dx) return;
    // The input gradient is per sample: batch slices, as in the forward, each slice's column gradients in the place
    // of its first sample's.
    // A unit-stride convolution on kiln's own GEMM takes the input gradient as a forward convolution of dy
    // (conv_direct_input_gradient.hpp), with weights packed once, here, and read by every thread.
    [[maybe_unused]] bool sparse_dx = false;
    const T* direct_weights = nullptr;
    if constexpr (requires { requires Policy::direct_convolution; }) {
      sparse_dx = conv_sparse_input_gradient_applies<T>(g);
      if (!sparse_dx && conv_direct_input_gradient_applies<T>(g, Policy::gemm_precision()))
        direct_weights = conv_direct_pack_transposed_weights(weight, g);
    }
    with_activation(input_act, [&](auto kind) {
      Policy::for_batch_slices(batch, g.out_channels * plane * k, [&](index_t n0, index_t n1) {
        [[maybe_unused]] const T* sparse_weights = nullptr;
        if constexpr (std::is_same_v<T, float>)
          if (sparse_dx) sparse_weights = conv_sparse_input_gradient_weights(weight, g);
        for (index_t n = n0; n < n1; ++n) {
          T* const sample_dx = dx + n * g.in_size();
          // A sample whose output gradient is mostly zeros skips them, as in the weight gradient.
          bool done = false;
          if constexpr (std::is_same_v<T, float>)
            done = sparse_weights && conv2d_sparse_input_gradient(sparse_weights, dy + n * g.out_size(), sample_dx, g);
          if (direct_weights) {
            conv2d_direct_input_gradient(dy + n * g.out_size(), direct_weights, sample_dx, g);
            done = true;
          }
          T* dcol = g.pointwise() ? sample_dx : col + n0 * g.col_size();
          for (index_t grp = 0; grp < g.groups && !done; ++grp)
            Policy::gemm(true, false, k, plane, out_per_group, T(1), weight + grp * out_per_group * k, k,
                         dy + n * g.out_size() + grp * out_per_group * plane, plane, T(0), dcol + grp * k * plane,
                         plane);
          if (!g.pointwise() && !done) Policy::col2im(dcol, sample_dx, g);
          if constexpr (kind.value != activation::identity)
            activation_backward_in_place<kind.value>(act_input ? act_input + n * g.in_size() : nullptr,
                                                     x + n * g.in_size(), sample_dx, g.in_size(), slope);
        }
      });
    });
  }

  // y[n, c, :] += bias[c] for a (batch, channels, plane) tensor.
  template <class T>
  KILN_KERNEL static void add_channel_bias(T* y, const T* bias, index_t batch, index_t channels, index_t plane) {
    for (index_t n = 0; n < batch; ++n)
      for (index_t c = 0; c < channels; ++c) {
        T* p = y + (n * channels + c) * plane;
        const T b = bias[c];
        for (index_t s = 0; s < plane; ++s) p[s] += b;
      }
  }
  // sums[c] (+)= sum over n and the plane of dy[n, c, :]: the bias gradient of a convolution. Each channel's terms
  // go round `lanes` partial sums (term s of a plane into lane s mod lanes), added at the end in a fixed tree: one
  // running sum made every add wait for the one before, 4 cycles each.
  template <class T>
  KILN_KERNEL static void sum_channels(const T* dy, T* sums, index_t batch, index_t channels, index_t plane, bool accumulate) {
    constexpr int lanes = 16;
    for (index_t c = 0; c < channels; ++c) {
      sum_type<T> partial[lanes] = {};
      for (index_t n = 0; n < batch; ++n) {
        const T* p = dy + (n * channels + c) * plane;
        index_t s = 0;
        for (; s + lanes <= plane; s += lanes)
          for (int l = 0; l < lanes; ++l) partial[l] += p[s + l];
        for (int l = 0; s + l < plane; ++l) partial[l] += p[s + l];
      }
      for (int span = 1; span < lanes; span *= 2)
        for (int l = 0; l + span < lanes; l += 2 * span) partial[l] += partial[l + span];
      const T total = static_cast<T>(partial[0]);
      sums[c] = accumulate ? sums[c] + total : total;
    }
  }

 private:
  // Sample n's column matrix: built by im2col into `place`, or the input itself for a pointwise kernel.
  template <class Policy, class T>
  static const T* sample_columns(const T* x, T* place, index_t n, const conv_geometry& g) {
    if (g.pointwise()) return x + n * g.in_size();
    Policy::im2col(x + n * g.in_size(), place, g);
    return place;
  }
};

}  // namespace kiln::kernels::cpu
