// The CNN and recurrent kernels of policy::cuda (kiln's CUDA kernels + cuBLAS) and policy::cudnn (cuDNN) against
// policy::cpu on random inputs: convolution (stride, padding, "same", dilation, groups, 1x1, odd and rectangular
// sizes; through the layer functions, so the policy wiring is tested too), im2col / col2im, channel bias and sums,
// max / average / global pooling (padding, ceil mode, dilation, ties), batch norm (training with running statistics
// and num_batches_tracked, evaluation, backward with and without batch statistics), layer norm, softmax, the LSTM and
// GRU cells, the time-major transpose and the recurrent dropout mask.
//
// Tolerances, and why:
//  - Exact (bit-identical) where the GPU kernel performs the CPU's operations in the CPU's order: im2col, col2im
//    (a gather that adds the same terms in the same order), the channel bias, every pooling kernel of kiln's, the
//    transpose and the dropout masks (the same Philox numbers). Max pooling through cuDNN is exact too (a maximum
//    involves no rounding).
//  - Sums of products (convolution, weight and bias gradients): |gpu - cpu| <= 8 eps (terms + |cpu|), with eps the
//    type's machine epsilon and terms the number of products in each sum. The GPU adds them in another order (cuBLAS /
//    cuDNN tiling); each addition may round by eps times the partial sum, and with inputs in [-1, 1] the partial sums
//    stay below terms, so a few eps times terms bounds the difference with room to spare while a wrong index (an error
//    of order 0.1) still fails. FP32 runs without TF32 on both GPU policies.
//  - Statistics (batch / layer norm) are summed in double on the CPU and by kiln's kernels, so those agree to a few
//    float ulps: 16 eps relative and absolute. cuDNN computes its statistics in float; over <= 200 values per channel
//    its results agree to 1e-4 (relative and absolute, on normalised values of order 1), and double to 1e-10.
//  - Transcendentals (softmax's exp, the cells' sigmoid / tanh): CUDA's expf / tanhf are within 2 ulp of glibc's, and
//    the cell formulas chain a few of them: 64 eps relative and absolute on values of order 1.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/layers/batchnorm.hpp"
#include "kiln/layers/conv2d.hpp"
#include "kiln/layers/layernorm.hpp"
#include "kiln/layers/pool_common.hpp"
#include "kiln/policy_cuda.cuh"

using namespace kiln;
using namespace kiln::cuda_test;

namespace {

template <class T>
constexpr double eps = std::numeric_limits<T>::epsilon();

// A device copy of host, or no buffer (null pointer) when host is empty.
template <class T>
struct device_copy {
  kiln::cuda::device_buffer<T> buffer;
  explicit device_copy(const std::vector<T>& host) {
    if (!host.empty()) buffer = to_device(host);
  }
  T* get() { return buffer.empty() ? nullptr : buffer.data(); }
  std::vector<T> host() const { return to_host(buffer); }
};

// |gpu - cpu| <= 8 eps (terms + |cpu|) for sums of `terms` products of values in [-1, 1] (see the top).
template <class T>
void check_sums(const std::vector<T>& gpu, const std::vector<T>& cpu, index_t terms, const std::string& what) {
  check_close(gpu, cpu, 8 * eps<T>, 8 * eps<T> * double(terms), what);
}

std::string policy_label(const char* policy, const std::string& what) { return std::string(policy) + " " + what; }

// ---- convolution ---------------------------------------------------------------------------------------------------

struct conv_case {
  const char* name;
  index_t batch, channels, height, width, out_channels, kernel_h, kernel_w, stride, padding, dilation, groups;
  bool same = false;
  bool cudnn_expected = true;  // whether cuDNN can run it (false: policy::cudnn falls back to kiln's kernels)
};

const conv_case conv_cases[] = {
    {"3x3", 2, 3, 8, 8, 4, 3, 3, 1, 0, 1, 1},
    {"3x3 stride 2 padding 1, odd sizes", 3, 4, 9, 7, 6, 3, 3, 2, 1, 1, 1},
    {"3x3 dilation 2 padding 2", 2, 3, 11, 10, 5, 3, 3, 1, 2, 2, 1},
    {"3x3 groups 2 padding 1", 2, 4, 7, 9, 6, 3, 3, 1, 1, 1, 2},
    {"5x5 stride 2 padding 2 dilation 2 groups 2", 2, 6, 13, 12, 4, 5, 5, 2, 2, 2, 2},
    {"3x2 rectangular kernel, stride 2", 2, 2, 7, 6, 3, 3, 2, 2, 0, 1, 1},
    {"1x1 pointwise", 2, 8, 5, 5, 4, 1, 1, 1, 0, 1, 1},
    {"1x1 stride 2", 2, 4, 7, 7, 3, 1, 1, 2, 0, 1, 1},
    {"3x3 same", 2, 3, 6, 7, 4, 3, 3, 1, 0, 1, 1, true},
    // PyTorch's "same" for an even kernel pads one pixel more after the end: cuDNN's symmetric padding cannot.
    {"4x4 same (asymmetric padding)", 2, 3, 6, 7, 4, 4, 4, 1, 0, 1, 1, true, false},
};

template <class Policy, class T>
void check_convolution(const conv_case& k, const char* policy) {
  const conv_geometry g =
      make_conv_geometry(k.channels, k.height, k.width, k.out_channels, k.kernel_h, k.kernel_w, k.stride, k.stride,
                         k.padding, k.padding, k.dilation, k.dilation, k.groups, k.same);
  const index_t batch = k.batch, weights = g.out_channels * g.group_k();
  const auto x = random_values<T>(batch * g.in_size(), 1);
  const auto w = random_values<T>(weights, 2);
  const auto b = random_values<T>(g.out_channels, 3);
  const auto dy = random_values<T>(batch * g.out_size(), 4);
  const auto dw_before = random_values<T>(weights, 5);
  const auto db_before = random_values<T>(g.out_channels, 6);
  const index_t col_count = std::max<index_t>(1, conv2d_col_size(g, batch));
  const std::string name = policy_label(policy, k.name);

  // CPU reference: forward, then the backward twice (overwriting, then accumulating onto earlier gradients).
  std::vector<T> y(batch * g.out_size()), col(col_count), dx(x.size()), dw(weights), db(g.out_channels);
  conv2d_forward<policy::cpu>(x.data(), w.data(), b.data(), y.data(), col.data(), batch, g);
  std::vector<T> col_saved = col;
  conv2d_backward<policy::cpu>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), col.data(), batch, g,
                               false);
  std::vector<T> dw_acc = dw_before, db_acc = db_before, dx_acc(x.size());
  conv2d_backward<policy::cpu>(x.data(), w.data(), dy.data(), dx_acc.data(), dw_acc.data(), db_acc.data(),
                               col_saved.data(), batch, g, true);

  device_copy<T> gx(x), gw(w), gb(b), gdy(dy), gdw_acc(dw_before), gdb_acc(db_before);
  kiln::cuda::device_buffer<T> gy(batch * g.out_size()), gcol(col_count), gdx(x.size()), gdw(weights),
      gdb(g.out_channels);
  conv2d_forward<Policy>(gx.get(), gw.get(), gb.get(), gy.data(), gcol.data(), batch, g);
  conv2d_backward<Policy>(gx.get(), gw.get(), gdy.get(), gdx.data(), gdw.data(), gdb.data(), gcol.data(), batch, g,
                          false);
  // The accumulating backward needs the forward's column matrices again (the first backward overwrote them).
  conv2d_forward<Policy>(gx.get(), gw.get(), gb.get(), gy.data(), gcol.data(), batch, g);
  kiln::cuda::device_buffer<T> gdx_acc(x.size());
  conv2d_backward<Policy>(gx.get(), gw.get(), gdy.get(), gdx_acc.data(), gdw_acc.get(), gdb_acc.get(), gcol.data(),
                          batch, g, true);

  // y sums group_k products (+ the bias); dx sums at most out_channels / groups * kernel products; dweight sums
  // batch * plane products, dbias batch * plane values.
  const index_t y_terms = g.group_k() + 1, dx_terms = g.out_channels / g.groups * g.kernel_h * g.kernel_w;
  const index_t dw_terms = 2 * batch * g.out_plane();  // twice: the accumulated case adds the earlier value too
  check_sums(to_host(gy), y, y_terms, name + ": y");
  check_sums(to_host(gdx), dx, dx_terms, name + ": dx");
  check_sums(to_host(gdw), dw, dw_terms, name + ": dweight");
  check_sums(to_host(gdb), db, dw_terms, name + ": dbias");
  check_sums(to_host(gdx_acc), dx_acc, dx_terms, name + ": dx (accumulate)");
  check_sums(gdw_acc.host(), dw_acc, dw_terms, name + ": dweight (accumulate)");
  check_sums(gdb_acc.host(), db_acc, dw_terms, name + ": dbias (accumulate)");

  // Without bias and without dx (a first layer): still the same weight gradient.
  conv2d_forward<Policy>(gx.get(), gw.get(), static_cast<const T*>(nullptr), gy.data(), gcol.data(), batch, g);
  conv2d_backward<Policy>(gx.get(), gw.get(), gdy.get(), static_cast<T*>(nullptr), gdw.data(), static_cast<T*>(nullptr),
                          gcol.data(), batch, g, false);
  std::vector<T> y_nobias = y;
  for (index_t n = 0; n < batch; ++n)
    for (index_t o = 0; o < g.out_channels; ++o)
      for (index_t s = 0; s < g.out_plane(); ++s) y_nobias[(n * g.out_channels + o) * g.out_plane() + s] -= b[o];
  check_sums(to_host(gy), y_nobias, y_terms + 1, name + ": y without bias");
  check_sums(to_host(gdw), dw, dw_terms, name + ": dweight without dx");
}

template <class T>
void check_convolutions() {
  for (const auto& k : conv_cases) {
    check_convolution<policy::cuda, T>(k, "cuda");
    check_convolution<policy::cudnn, T>(k, "cudnn");
    const conv_geometry g =
        make_conv_geometry(k.channels, k.height, k.width, k.out_channels, k.kernel_h, k.kernel_w, k.stride, k.stride,
                           k.padding, k.padding, k.dilation, k.dilation, k.groups, k.same);
    CHECK_MESSAGE(kernels::cudnn::conv_kernels::cudnn_convolves<T>(k.batch, g) == k.cudnn_expected,
                  (std::string("cuDNN admissibility of ") + k.name));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("convolution: policy::cuda (im2col + cuBLAS) and policy::cudnn agree with the CPU", T, float,
                   double) {
  check_convolutions<T>();
}

TEST_CASE("im2col, col2im, channel bias and channel sums are the CPU's") {
  using T = float;
  for (const auto& k : conv_cases) {
    const conv_geometry g =
        make_conv_geometry(k.channels, k.height, k.width, k.out_channels, k.kernel_h, k.kernel_w, k.stride, k.stride,
                           k.padding, k.padding, k.dilation, k.dilation, k.groups, k.same);
    const auto x = random_values<T>(g.in_size(), 11);
    const auto col_in = random_values<T>(g.col_size(), 12);
    std::vector<T> col(g.col_size()), back(g.in_size());
    policy::cpu::im2col(x.data(), col.data(), g);
    policy::cpu::col2im(col_in.data(), back.data(), g);
    device_copy<T> gx(x), gcol_in(col_in);
    kiln::cuda::device_buffer<T> gcol(g.col_size()), gback(g.in_size());
    policy::cuda::im2col(gx.get(), gcol.data(), g);
    policy::cuda::col2im(gcol_in.get(), gback.data(), g);
    check_identical(to_host(gcol), col, std::string("im2col ") + k.name);
    check_identical(to_host(gback), back, std::string("col2im ") + k.name);
  }
  const index_t batch = 3, channels = 5, plane = 37;
  const auto y0 = random_values<T>(batch * channels * plane, 13);
  const auto bias = random_values<T>(channels, 14);
  std::vector<T> y = y0, sums = random_values<T>(channels, 15), sums_acc = sums;
  device_copy<T> gy(y0), gbias(bias), gsums(sums), gsums_acc(sums);
  policy::cpu::add_channel_bias(y.data(), bias.data(), batch, channels, plane);
  policy::cuda::add_channel_bias(gy.get(), gbias.get(), batch, channels, plane);
  check_identical(gy.host(), y, "add_channel_bias");
  policy::cpu::sum_channels(y0.data(), sums.data(), batch, channels, plane, false);
  policy::cpu::sum_channels(y0.data(), sums_acc.data(), batch, channels, plane, true);
  device_copy<T> gy0(y0);
  policy::cuda::sum_channels(gy0.get(), gsums.get(), batch, channels, plane, false);
  policy::cuda::sum_channels(gy0.get(), gsums_acc.get(), batch, channels, plane, true);
  // Summed in double on both sides (in another order): equal after rounding to float but for a rare last-bit tie.
  check_close(gsums.host(), sums, 2 * eps<T>, 0, "sum_channels");
  check_close(gsums_acc.host(), sums_acc, 2 * eps<T>, eps<T>, "sum_channels (accumulate)");
}

// ---- pooling -------------------------------------------------------------------------------------------------------

namespace {

struct pool_case {
  const char* name;
  index_t batch, channels, height, width, kernel, stride, padding, dilation;
  bool ceil_mode;
};

const pool_case pool_cases[] = {
    {"2x2 stride 2", 2, 3, 8, 8, 2, 2, 0, 1, false},
    {"2x2 stride 2, odd size", 2, 3, 7, 9, 2, 2, 0, 1, false},
    {"2x2 stride 2, odd size, ceil mode (an extra window)", 2, 3, 7, 9, 2, 2, 0, 1, true},
    {"3x3 stride 2 padding 1", 2, 2, 9, 8, 3, 2, 1, 1, false},
    {"3x3 stride 2 padding 1, ceil mode", 2, 2, 10, 8, 3, 2, 1, 1, true},
    {"3x3 stride 1 padding 1 (overlapping windows)", 1, 3, 6, 5, 3, 1, 1, 1, false},
    {"3x3 stride 1 dilation 2 (max only)", 2, 2, 9, 9, 3, 1, 1, 2, false},
};

// Values on a coarse grid (multiples of 1/4 in [-1, 1]), so that windows hold ties and the first-maximum rule and
// the gradient routing are exercised. Adding +0 turns the -0 that rounding gives small negatives into +0: -0 and +0
// compare equal, so a window holding both would have two maxima with different bits, and cuDNN's choice among equal
// maxima is its own.
template <class T>
std::vector<T> tied_values(index_t n, std::uint64_t seed) {
  auto v = random_values<T>(n, seed);
  for (auto& e : v) e = std::round(e * T(4)) / T(4) + T(0);
  return v;
}

template <class Policy>
void check_pooling(const pool_case& k, const char* policy) {
  using T = float;
  const conv_geometry g = make_pool_geometry(k.channels, k.height, k.width, k.kernel, k.kernel, k.stride, k.stride,
                                             k.padding, k.padding, k.ceil_mode, k.dilation, k.dilation);
  const index_t planes = k.batch * k.channels, in = planes * g.height * g.width, out = planes * g.out_plane();
  const std::string name = policy_label(policy, k.name);
  for (bool ties : {false, true}) {
    const auto x = ties ? tied_values<T>(in, 21) : random_values<T>(in, 21);
    const auto dy = random_values<T>(out, 22);
    const auto dx_before = random_values<T>(in, 23);
    device_copy<T> gx(x), gdy(dy), gdx_acc(dx_before);
    kiln::cuda::device_buffer<T> gy(out), gdx(in);
    const std::string label = name + (ties ? " (ties)" : "");

    std::vector<T> y(out), dx(in), dx_acc = dx_before;
    policy::cpu::max_pool_forward(x.data(), y.data(), planes, g);
    policy::cpu::max_pool_backward(x.data(), y.data(), dy.data(), dx.data(), planes, g, false);
    policy::cpu::max_pool_backward(x.data(), y.data(), dy.data(), dx_acc.data(), planes, g, true);
    Policy::max_pool_forward(gx.get(), gy.data(), planes, g);
    Policy::max_pool_backward(gx.get(), gy.data(), gdy.get(), gdx.data(), planes, g, false);
    Policy::max_pool_backward(gx.get(), gy.data(), gdy.get(), gdx_acc.get(), planes, g, true);
    check_identical(to_host(gy), y, label + ": max forward");
    check_identical(to_host(gdx), dx, label + ": max backward");
    check_identical(gdx_acc.host(), dx_acc, label + ": max backward (accumulate)");
    if (k.dilation != 1) continue;  // average pooling has no dilation

    for (bool include_pad : {true, false}) {
      const std::string avg = label + (include_pad ? ": avg (count_include_pad)" : ": avg");
      policy::cpu::avg_pool_forward(x.data(), y.data(), planes, g, include_pad);
      Policy::avg_pool_forward(gx.get(), gy.data(), planes, g, include_pad);
      // kiln's kernel sums in the CPU's order; cuDNN may sum (and divide) otherwise: kernel^2 terms.
      if constexpr (std::is_same_v<Policy, policy::cudnn>)
        check_sums(to_host(gy), y, k.kernel * k.kernel, avg + " forward");
      else
        check_identical(to_host(gy), y, avg + " forward");
      std::vector<T> adx(in), adx_acc = dx_before;
      device_copy<T> gadx_acc(dx_before);
      policy::cpu::avg_pool_backward(dy.data(), adx.data(), planes, g, include_pad, false);
      policy::cpu::avg_pool_backward(dy.data(), adx_acc.data(), planes, g, include_pad, true);
      Policy::avg_pool_backward(gdy.get(), gdx.data(), planes, g, include_pad, false);
      Policy::avg_pool_backward(gdy.get(), gadx_acc.get(), planes, g, include_pad, true);
      check_identical(to_host(gdx), adx, avg + " backward");
      check_identical(gadx_acc.host(), adx_acc, avg + " backward (accumulate)");
    }
  }
}

}  // namespace

TEST_CASE("pooling: max (first maximum, ties, dilation), average (padding rules, ceil mode), on both GPU policies") {
  for (const auto& k : pool_cases) {
    check_pooling<policy::cuda>(k, "cuda");
    check_pooling<policy::cudnn>(k, "cudnn");
  }
}

TEST_CASE("global average pooling") {
  using T = float;
  for (index_t plane : {1, 7, 49, 1000}) {
    const index_t planes = 6;
    const auto x = random_values<T>(planes * plane, 31);
    const auto dy = random_values<T>(planes, 32);
    const auto dx_before = random_values<T>(planes * plane, 33);
    std::vector<T> y(planes), dx(planes * plane), dx_acc = dx_before;
    policy::cpu::global_avg_pool_forward(x.data(), y.data(), planes, plane);
    policy::cpu::global_avg_pool_backward(dy.data(), dx.data(), planes, plane, false);
    policy::cpu::global_avg_pool_backward(dy.data(), dx_acc.data(), planes, plane, true);
    device_copy<T> gx(x), gdy(dy), gdx_acc(dx_before);
    kiln::cuda::device_buffer<T> gy(planes), gdx(planes * plane);
    policy::cuda::global_avg_pool_forward(gx.get(), gy.data(), planes, plane);
    policy::cuda::global_avg_pool_backward(gdy.get(), gdx.data(), planes, plane, false);
    policy::cuda::global_avg_pool_backward(gdy.get(), gdx_acc.get(), planes, plane, true);
    // Both sum in double, in different orders; the float results agree but for a rare last-bit tie.
    check_close(to_host(gy), y, 2 * eps<T>, 0, "global average pooling forward, plane " + std::to_string(plane));
    check_identical(to_host(gdx), dx, "global average pooling backward");
    check_identical(gdx_acc.host(), dx_acc, "global average pooling backward (accumulate)");
  }
}

// ---- batch norm ----------------------------------------------------------------------------------------------------

namespace {

struct norm_case {
  const char* name;
  index_t batch, channels, spatial;
};

const norm_case norm_cases[] = {
    {"BatchNorm2d (4, 3, 5x5)", 4, 3, 25},
    {"BatchNorm1d (8, 5): per activation", 8, 5, 1},
    {"BatchNorm1d (3, 4, 7): over batch and length", 3, 4, 7},
    {"BatchNorm2d (2, 6, 9x11), odd", 2, 6, 99},
    {"two values per channel", 2, 3, 1},
};

template <class T, class Policy>
struct norm_tolerance {
  // kiln's kernels: double statistics as on the CPU; cuDNN: float statistics (see the top).
  static constexpr bool cudnn = std::is_same_v<Policy, policy::cudnn>;
  static double value() { return cudnn ? (std::is_same_v<T, float> ? 1e-4 : 1e-10) : 16 * eps<T>; }
};

template <class Policy, class T>
void check_batch_norm(const norm_case& k, bool affine, const char* policy) {
  const index_t n = k.batch * k.channels * k.spatial, C = k.channels;
  const double tol = norm_tolerance<T, Policy>::value();
  const std::string name = policy_label(policy, k.name) + (affine ? "" : " (no affine)");
  const auto x = random_values<T>(n, 41, T(-2), T(3));
  const auto dy = random_values<T>(n, 42);
  const auto gamma = affine ? random_values<T>(C, 43, T(0.5), T(1.5)) : std::vector<T>{};
  const auto beta = affine ? random_values<T>(C, 44) : std::vector<T>{};
  const auto grad_before = random_values<T>(C, 45);
  const T eps_bn = T(1e-5), momentum = T(0.1);

  // Buffers (running_mean, running_var, num_batches_tracked) as the layers keep them: initial 0, 1, 0.
  std::vector<T> buffers(2 * C + 1);
  batch_norm_init_buffers(buffers.data(), C);
  device_copy<T> gbuffers(buffers), gx(x), gdy(dy), ggamma(gamma), gbeta(beta);
  std::vector<T> y(n), mean(C), invstd(C);
  kiln::cuda::device_buffer<T> gy(n), gmean(C), ginvstd(C);
  batch_norm_state<T> state{buffers.data(), buffers.data() + C, buffers.data() + 2 * C};
  batch_norm_state<T> gstate{gbuffers.get(), gbuffers.get() + C, gbuffers.get() + 2 * C};
  // Three training steps, so the running statistics move away from their initial values.
  for (int step = 0; step < 3; ++step) {
    batch_norm_forward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(),
                                    beta.empty() ? nullptr : beta.data(), y.data(), mean.data(), invstd.data(), state,
                                    k.batch, C, k.spatial, eps_bn, momentum, true);
    batch_norm_forward<Policy>(gx.get(), ggamma.get(), gbeta.get(), gy.data(), gmean.data(), ginvstd.data(), gstate,
                               k.batch, C, k.spatial, eps_bn, momentum, true);
  }
  check_close(to_host(gy), y, tol, tol, name + ": training y");
  check_close(to_host(gmean), mean, tol, tol, name + ": saved mean");
  check_close(to_host(ginvstd), invstd, tol, tol, name + ": saved invstd");
  // running_var takes the unbiased batch variance on the CPU (as PyTorch); this checks the GPU does the same.
  check_close(gbuffers.host(), buffers, tol, tol, name + ": running mean, running var, num_batches_tracked");

  // Backward with batch statistics, overwriting and accumulating, and without dx.
  for (bool accumulate : {false, true}) {
    std::vector<T> dx(n), dgamma = grad_before, dbeta = grad_before;
    device_copy<T> gdgamma(grad_before), gdbeta(grad_before);
    kiln::cuda::device_buffer<T> gdx(n);
    batch_norm_backward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(), dy.data(), dx.data(),
                                     dgamma.data(), dbeta.data(), mean.data(), invstd.data(), k.batch, C, k.spatial,
                                     true, accumulate);
    batch_norm_backward<Policy>(gx.get(), ggamma.get(), gdy.get(), gdx.data(), gdgamma.get(), gdbeta.get(),
                                gmean.data(), ginvstd.data(), k.batch, C, k.spatial, true, accumulate);
    const std::string label = name + (accumulate ? ": backward (accumulate)" : ": backward");
    const double sum_tol = tol * double(k.batch * k.spatial);  // dgamma / dbeta sum batch * spatial terms
    check_close(to_host(gdx), dx, tol, tol, label + " dx");
    check_close(gdgamma.host(), dgamma, tol, sum_tol, label + " dgamma");
    check_close(gdbeta.host(), dbeta, tol, sum_tol, label + " dbeta");
  }
  {
    std::vector<T> dgamma(C), dbeta(C);
    device_copy<T> gdgamma(dgamma), gdbeta(dbeta);
    batch_norm_backward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(), dy.data(),
                                     static_cast<T*>(nullptr), dgamma.data(), dbeta.data(), mean.data(),
                                     invstd.data(), k.batch, C, k.spatial, true, false);
    batch_norm_backward<Policy>(gx.get(), ggamma.get(), gdy.get(), static_cast<T*>(nullptr), gdgamma.get(),
                                gdbeta.get(), gmean.data(), ginvstd.data(), k.batch, C, k.spatial, true, false);
    const double sum_tol = tol * double(k.batch * k.spatial);
    check_close(gdgamma.host(), dgamma, tol, sum_tol, name + ": backward without dx, dgamma");
    check_close(gdbeta.host(), dbeta, tol, sum_tol, name + ": backward without dx, dbeta");
  }

  // Evaluation with the running statistics, and the backward through them (fixed statistics).
  batch_norm_forward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(),
                                  beta.empty() ? nullptr : beta.data(), y.data(), mean.data(), invstd.data(), state,
                                  k.batch, C, k.spatial, eps_bn, momentum, false);
  batch_norm_forward<Policy>(gx.get(), ggamma.get(), gbeta.get(), gy.data(), gmean.data(), ginvstd.data(), gstate,
                             k.batch, C, k.spatial, eps_bn, momentum, false);
  check_close(to_host(gy), y, tol, tol, name + ": evaluation y");
  check_close(to_host(gmean), mean, tol, tol, name + ": evaluation saved mean");
  check_close(to_host(ginvstd), invstd, tol, tol, name + ": evaluation saved invstd");
  std::vector<T> dx(n), dgamma(C), dbeta(C);
  device_copy<T> gdgamma(dgamma), gdbeta(dbeta);
  kiln::cuda::device_buffer<T> gdx(n);
  batch_norm_backward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(), dy.data(), dx.data(),
                                   dgamma.data(), dbeta.data(), mean.data(), invstd.data(), k.batch, C, k.spatial,
                                   false, false);
  batch_norm_backward<Policy>(gx.get(), ggamma.get(), gdy.get(), gdx.data(), gdgamma.get(), gdbeta.get(),
                              gmean.data(), ginvstd.data(), k.batch, C, k.spatial, false, false);
  check_close(to_host(gdx), dx, tol, tol, name + ": backward through fixed statistics, dx");
  check_close(gdgamma.host(), dgamma, tol, tol * double(k.batch * k.spatial), name + ": fixed statistics, dgamma");
}

}  // namespace

TEST_CASE_TEMPLATE("batch norm on both GPU policies: training, running statistics, evaluation, backward", T, float,
                   double) {
  for (const auto& k : norm_cases)
    for (bool affine : {true, false}) {
      check_batch_norm<policy::cuda, T>(k, affine, "cuda");
      check_batch_norm<policy::cudnn, T>(k, affine, "cudnn");
    }
}

TEST_CASE_TEMPLATE("layer norm forward and backward", T, float, double) {
  const double tol = 16 * eps<T>;
  for (auto [rows, cols] : {std::pair<index_t, index_t>{5, 17}, {3, 300}, {64, 1}, {2, 1025}}) {
    for (bool affine : {true, false}) {
      const index_t n = rows * cols;
      const std::string name = "layer norm " + std::to_string(rows) + "x" + std::to_string(cols) +
                               (affine ? "" : " (no affine)");
      const auto x = random_values<T>(n, 51, T(-2), T(3));
      const auto dy = random_values<T>(n, 52);
      const auto gamma = affine ? random_values<T>(cols, 53, T(0.5), T(1.5)) : std::vector<T>{};
      const auto beta = affine ? random_values<T>(cols, 54) : std::vector<T>{};
      const auto before = random_values<T>(cols, 55);
      std::vector<T> y(n), mean(rows), invstd(rows);
      device_copy<T> gx(x), gdy(dy), ggamma(gamma), gbeta(beta);
      kiln::cuda::device_buffer<T> gy(n), gmean(rows), ginvstd(rows);
      layer_norm_forward<policy::cpu>(x.data(), gamma.empty() ? nullptr : gamma.data(),
                                      beta.empty() ? nullptr : beta.data(), y.data(), mean.data(), invstd.data(),
                                      rows, cols, T(1e-5));
      layer_norm_forward<policy::cuda>(gx.get(), ggamma.get(), gbeta.get(), gy.data(), gmean.data(), ginvstd.data(),
                                       rows, cols, T(1e-5));
      check_close(to_host(gy), y, tol, tol, name + ": y");
      check_close(to_host(gmean), mean, tol, tol, name + ": mean");
      check_close(to_host(ginvstd), invstd, tol, tol, name + ": invstd");
      if (!affine) continue;
      for (bool accumulate : {false, true}) {
        std::vector<T> dx(n), dgamma = before, dbeta = before;
        device_copy<T> gdgamma(before), gdbeta(before);
        kiln::cuda::device_buffer<T> gdx(n);
        layer_norm_backward<policy::cpu>(x.data(), gamma.data(), dy.data(), dx.data(), dgamma.data(), dbeta.data(),
                                         mean.data(), invstd.data(), rows, cols, accumulate);
        layer_norm_backward<policy::cuda>(gx.get(), ggamma.get(), gdy.get(), gdx.data(), gdgamma.get(),
                                          gdbeta.get(), gmean.data(), ginvstd.data(), rows, cols, accumulate);
        // dgamma / dbeta add rows terms in the CPU's order (bit-equal but for contracted multiply-adds).
        check_close(to_host(gdx), dx, tol, tol * double(cols), name + ": dx");
        check_close(gdgamma.host(), dgamma, tol, tol * double(rows), name + ": dgamma");
        check_close(gdbeta.host(), dbeta, tol, tol * double(rows), name + ": dbeta");
      }
    }
  }
}

// ---- softmax through cuDNN ------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("softmax and log-softmax through cuDNN, along the last and a middle dimension", T, float, double) {
  const double tol = 64 * eps<T>;
  for (auto [outer, size, inner] : {std::tuple<index_t, index_t, index_t>{4, 10, 1}, {2, 5, 3}, {1, 1000, 1},
                                    {3, 1, 4}}) {
    for (bool log : {false, true}) {
      const index_t n = outer * size * inner;
      const std::string name = std::string(log ? "log-softmax " : "softmax ") + std::to_string(outer) + "x" +
                               std::to_string(size) + "x" + std::to_string(inner);
      const auto x = random_values<T>(n, 61, T(-4), T(4));
      const auto dy = random_values<T>(n, 62);
      const auto before = random_values<T>(n, 63);
      std::vector<T> y(n), dx(n), dx_acc = before;
      policy::cpu::softmax_forward(x.data(), y.data(), outer, size, inner, log);
      policy::cpu::softmax_backward(y.data(), dy.data(), dx.data(), outer, size, inner, log, false);
      policy::cpu::softmax_backward(y.data(), dy.data(), dx_acc.data(), outer, size, inner, log, true);
      device_copy<T> gx(x), gdy(dy), gdx_acc(before);
      kiln::cuda::device_buffer<T> gy(n), gdx(n);
      policy::cudnn::softmax_forward(gx.get(), gy.data(), outer, size, inner, log);
      policy::cudnn::softmax_backward(gy.data(), gdy.get(), gdx.data(), outer, size, inner, log, false);
      policy::cudnn::softmax_backward(gy.data(), gdy.get(), gdx_acc.get(), outer, size, inner, log, true);
      check_close(to_host(gy), y, tol, tol, name + ": y");
      check_close(to_host(gdx), dx, tol, tol * double(size), name + ": dx");
      check_close(gdx_acc.host(), dx_acc, tol, tol * double(size), name + ": dx (accumulate)");
      // In place (y aliasing x), which the CPU allows: policy::cudnn takes kiln's kernel then.
      device_copy<T> ginplace(x);
      policy::cudnn::softmax_forward(ginplace.get(), ginplace.get(), outer, size, inner, log);
      check_close(ginplace.host(), y, tol, tol, name + ": in place");
    }
  }
}

// ---- recurrent cells -----------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("LSTM and GRU cells, forward and backward, with strided rows and zero initial states", T, float,
                   double) {
  const double tol = 64 * eps<T>;
  const index_t batch = 3, H = 5, ld = 2 * H;  // ld: rows of a bidirectional output, two directions side by side
  for (bool first_step : {false, true}) {
    const std::string when = first_step ? " (first step: zero state)" : "";
    // LSTM
    const auto gates0 = random_values<T>(batch * 4 * H, 71, T(-2), T(2));
    const auto c_prev = random_values<T>(batch * ld, 72);
    const auto dy = random_values<T>(batch * ld, 73);
    const auto dh = random_values<T>(batch * H, 74);
    const auto dc0 = random_values<T>(batch * H, 75);
    std::vector<T> gates = gates0, c(batch * H), h(batch * ld), dc = dc0;
    device_copy<T> ggates(gates0), gc_prev(c_prev), gdy(dy), gdh(dh), gdc(dc0), gh(h);
    kiln::cuda::device_buffer<T> gc(batch * H);
    const T* cp = first_step ? nullptr : c_prev.data();
    const T* gcp = first_step ? nullptr : gc_prev.get();
    policy::cpu::lstm_cell_forward(batch, H, gates.data(), cp, ld, c.data(), h.data(), ld);
    policy::cuda::lstm_cell_forward(batch, H, ggates.get(), gcp, ld, gc.data(), gh.get(), ld);
    check_close(ggates.host(), gates, tol, tol, "lstm forward gates" + when);
    check_close(to_host(gc), c, tol, tol, "lstm forward c" + when);
    check_close(gh.host(), h, tol, tol, "lstm forward h" + when);
    policy::cpu::lstm_cell_backward(batch, H, gates.data(), cp, ld, c.data(), dy.data(), ld, dh.data(), dc.data());
    policy::cuda::lstm_cell_backward(batch, H, ggates.get(), gcp, ld, gc.data(), gdy.get(), ld, gdh.get(), gdc.get());
    check_close(ggates.host(), gates, tol, tol, "lstm backward gate gradients" + when);
    check_close(gdc.host(), dc, tol, tol, "lstm backward dc" + when);

    // GRU
    const auto gx0 = random_values<T>(batch * 3 * H, 81, T(-2), T(2));
    const auto ghh = random_values<T>(batch * 3 * H, 82, T(-2), T(2));
    const auto h_prev = random_values<T>(batch * ld, 83);
    std::vector<T> gx = gx0, hn(batch * H), h2(batch * ld), dh2 = dh, dgh(batch * 3 * H);
    device_copy<T> ggx(gx0), gghh(ghh), gh_prev(h_prev), gh2(h2), gdh2(dh);
    kiln::cuda::device_buffer<T> ghn(batch * H), gdgh(batch * 3 * H);
    const T* hp = first_step ? nullptr : h_prev.data();
    const T* ghp = first_step ? nullptr : gh_prev.get();
    policy::cpu::gru_cell_forward(batch, H, gx.data(), ghh.data(), hp, ld, hn.data(), h2.data(), ld);
    policy::cuda::gru_cell_forward(batch, H, ggx.get(), gghh.get(), ghp, ld, ghn.data(), gh2.get(), ld);
    check_close(ggx.host(), gx, tol, tol, "gru forward gates" + when);
    check_close(to_host(ghn), hn, tol, tol, "gru forward saved hn" + when);
    check_close(gh2.host(), h2, tol, tol, "gru forward h" + when);
    policy::cpu::gru_cell_backward(batch, H, gx.data(), hn.data(), hp, ld, dy.data(), ld, dh2.data(), dgh.data());
    policy::cuda::gru_cell_backward(batch, H, ggx.get(), ghn.data(), ghp, ld, gdy.get(), ld, gdh2.get(),
                                    gdgh.data());
    check_close(ggx.host(), gx, tol, tol, "gru backward input-side gradients" + when);
    check_close(to_host(gdgh), dgh, tol, tol, "gru backward recurrent-side gradients" + when);
    check_close(gdh2.host(), dh2, tol, tol, "gru backward dh" + when);
  }
}

TEST_CASE("swap_leading and the recurrent dropout mask are the CPU's, bit for bit") {
  const auto in = random_values<float>(4 * 7 * 3, 91);
  std::vector<float> out(in.size());
  device_copy<float> gin(in);
  kiln::cuda::device_buffer<float> gout(index_t(in.size()));
  policy::cpu::swap_leading(in.data(), out.data(), 4, 7, 3);
  policy::cuda::swap_leading(gin.get(), gout.data(), 4, 7, 3);
  check_identical(to_host(gout), out, "swap_leading");

  auto check_dropout = [](auto zero, index_t n, double p) {
    using T = decltype(zero);
    const auto x = random_values<T>(n, 92);
    std::vector<T> y(n), mask(n);
    random_generator cpu_rng(1234, 5), gpu_rng(1234, 5);
    cpu_rng.next_u32();  // start mid-block, so the GPU must honour the position
    gpu_rng.next_u32();
    device_copy<T> gx(x);
    kiln::cuda::device_buffer<T> gy(n), gmask(n);
    for (int call = 0; call < 2; ++call) {
      policy::cpu::recurrent_dropout_forward(x.data(), y.data(), mask.data(), n, T(p), cpu_rng);
      policy::cuda::recurrent_dropout_forward(gx.get(), gy.data(), gmask.data(), n, T(p), gpu_rng);
      const std::string name = std::string(sizeof(T) == 4 ? "float" : "double") + " dropout, call " +
                               std::to_string(call) + ", p " + std::to_string(p);
      check_identical(to_host(gmask), mask, name + ": mask");
      check_identical(to_host(gy), y, name + ": y");
      CHECK(gpu_rng.state().position == cpu_rng.state().position);
    }
  };
  for (double p : {0.0, 0.3, 1.0}) {
    check_dropout(0.0f, 1001, p);
    check_dropout(0.0, 1001, p);
  }
}
