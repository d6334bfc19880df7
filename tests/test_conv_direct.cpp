// The direct convolution kernels (kernels/cpu/conv_direct.hpp), the forward and the weight gradient: the bits of im2col
// and the blocked GEMM for every geometry they take (padding, even "same" kernels, strides, dilation, groups, two k
// blocks, tiles cut short, float and double, one thread and two), and which geometries they leave to im2col. The input
// gradient of a unit-stride convolution (kernels/cpu/conv_direct_input_gradient.hpp): the bits of a forward
// convolution of dy, within rounding of gemm and col2im. Then the
// weight and input gradients from a sparse output gradient (kernels/cpu/conv_sparse_gradient.hpp): the same bits
// again.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

using namespace kiln;

namespace {

// policy::cpu with every convolution through im2col and gemm: the reference.
struct im2col_policy : policy::cpu {
  static constexpr bool direct_convolution = false;
};

// The AMX path takes the larger products where it is on, and the direct path then steps aside (conv_direct_applies):
// these tests turn it off so that the direct path runs on every machine.
struct without_amx {
  bool saved = kernels::cpu::amx_detail::amx_allowed().load();
  without_amx() { kernels::cpu::set_amx_gemm(false); }
  ~without_amx() { kernels::cpu::set_amx_gemm(saved); }
};

// A convolution the tests take, named in their output.
struct geometry_case {
  const char* name;
  conv_geometry g;
};

struct thread_count {
  int saved = num_threads();
  explicit thread_count(int threads) { set_num_threads(threads); }
  ~thread_count() { set_num_threads(saved); }
};

template <class T>
std::vector<T> normal_values(random_generator& rng, index_t count) {
  std::vector<T> values(static_cast<std::size_t>(count));
  for (auto& v : values) v = rng.normal<T>();
  return values;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// Within rounding: every element within a few units in the last place of the largest magnitude, as two orders of the
// same sums give.
template <class T>
bool close_to(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  T largest = 0;
  for (const T v : b) largest = std::max(largest, std::abs(v));
  const T bound = 64 * std::numeric_limits<T>::epsilon() * largest;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= bound)) return false;
  return true;
}

// conv2d_forward through the direct path and through im2col, on `threads` threads: the same bits.
template <class T>
void check_against_im2col(const conv_geometry& g, index_t batch, bool with_bias, activation act, int threads) {
  REQUIRE(kernels::cpu::conv_direct_applies<T>(g));
  random_generator rng(7);
  const auto x = normal_values<T>(rng, batch * g.in_size());
  const auto weight = normal_values<T>(rng, g.out_channels * g.group_k());
  const auto bias = normal_values<T>(rng, g.out_channels);
  const thread_count team(threads);
  std::vector<T> direct(static_cast<std::size_t>(batch * g.out_size())), reference(direct.size()),
      col(static_cast<std::size_t>(batch * g.col_size()));
  const T* b = with_bias ? bias.data() : nullptr;
  policy::cpu::conv2d_forward<policy::cpu>(x.data(), weight.data(), b, direct.data(), col.data(), batch, g, act,
                                           T(0.1));
  policy::cpu::conv2d_forward<im2col_policy>(x.data(), weight.data(), b, reference.data(), col.data(), batch, g, act,
                                             T(0.1));
  CHECK(same_bits(direct, reference));
}

// conv2d_backward's weight gradient (overwritten, then accumulated onto the weights' values) through the direct path
// and through im2col: the same bits. The bias gradient is compared too (its path is shared, so it must not have
// moved), and the input gradient as its path allows (below).
template <class T>
void check_weight_gradient(const conv_geometry& g, index_t batch, int threads) {
  REQUIRE(kernels::cpu::conv_direct_weight_gradient_applies<T>(g));
  random_generator rng(11);
  const auto x = normal_values<T>(rng, batch * g.in_size());
  const auto weight = normal_values<T>(rng, g.out_channels * g.group_k());
  const auto dy = normal_values<T>(rng, batch * g.out_size());
  const thread_count team(threads);
  for (const bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    std::vector<T> col(static_cast<std::size_t>(batch * g.col_size()));
    std::vector<T> dweight = weight, reference_dweight = weight;
    std::vector<T> dbias(static_cast<std::size_t>(g.out_channels)), reference_dbias(dbias.size());
    std::vector<T> dx(x.size()), reference_dx(x.size());
    policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), dx.data(), dweight.data(),
                                              dbias.data(), col.data(), batch, g, accumulate);
    policy::cpu::conv2d_backward<im2col_policy>(x.data(), weight.data(), dy.data(), reference_dx.data(),
                                                reference_dweight.data(), reference_dbias.data(), col.data(), batch,
                                                g, accumulate);
    CHECK(same_bits(dweight, reference_dweight));
    CHECK(same_bits(dbias, reference_dbias));
    // A unit-stride convolution's input gradient takes the direct path too, in its own order of the sums (see
    // check_input_gradient); any other is shared.
    if (kernels::cpu::conv_direct_input_gradient_applies<T>(g)) CHECK(close_to(dx, reference_dx));
    else CHECK(same_bits(dx, reference_dx));
  }
}

// conv2d_backward's input gradient, on `threads` threads, on its own and through a ReLU's backward as a fused layer
// takes it: the bits of a forward convolution of dy with the flipped, transposed weights through im2col and the
// blocked GEMM (the weights flipped here, apart from the kernel's own packing), and within rounding of the im2col
// path's gemm and col2im.
template <class T>
void check_input_gradient(const conv_geometry& g, index_t batch, int threads) {
  REQUIRE(kernels::cpu::conv_direct_input_gradient_applies<T>(g));
  random_generator rng(17);
  const auto x = normal_values<T>(rng, batch * g.in_size());
  const auto weight = normal_values<T>(rng, g.out_channels * g.group_k());
  const auto dy = normal_values<T>(rng, batch * g.out_size());
  const thread_count team(threads);
  const index_t in_per_group = g.channels / g.groups, out_per_group = g.out_channels / g.groups;
  const index_t kh = g.kernel_h, kw = g.kernel_w;
  std::vector<T> flipped(weight.size());
  for (index_t grp = 0; grp < g.groups; ++grp)
    for (index_t c = 0; c < in_per_group; ++c)
      for (index_t o = 0; o < out_per_group; ++o)
        for (index_t i = 0; i < kh; ++i)
          for (index_t j = 0; j < kw; ++j)
            flipped[static_cast<std::size_t>(((((grp * in_per_group + c) * out_per_group + o) * kh + i) * kw) + j)] =
                weight[static_cast<std::size_t>(
                    (((grp * out_per_group + o) * in_per_group + c) * kh + (kh - 1 - i)) * kw + (kw - 1 - j))];
  const conv_geometry t = kernels::cpu::transposed_geometry(g);
  REQUIRE(t.out_height == g.height);
  REQUIRE(t.out_width == g.width);
  std::vector<T> col(static_cast<std::size_t>(batch * std::max(g.col_size(), t.col_size())));
  std::vector<T> forward_of_dy(x.size());
  const T* no_bias = nullptr;
  policy::cpu::conv2d_forward<im2col_policy>(dy.data(), flipped.data(), no_bias, forward_of_dy.data(), col.data(),
                                             batch, t);
  T* const none = nullptr;
  for (const activation act : {activation::identity, activation::relu}) {
    CAPTURE(static_cast<int>(act));
    std::vector<T> dx(x.size()), reference_dx(x.size());
    policy::cpu::conv2d_backward<policy::cpu>(x.data(), weight.data(), dy.data(), dx.data(), none, none, col.data(),
                                              batch, g, false, act, x.data());
    policy::cpu::conv2d_backward<im2col_policy>(x.data(), weight.data(), dy.data(), reference_dx.data(), none, none,
                                                col.data(), batch, g, false, act, x.data());
    CHECK(close_to(dx, reference_dx));
    if (act == activation::identity) CHECK(same_bits(dx, forward_of_dy));
  }
}

}  // namespace

TEST_CASE("direct convolution forward: the bits of im2col and the blocked GEMM") {
  const without_amx no_amx;
  const geometry_case cases[] = {
      {"the MNIST CNN's second convolution", make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"the MNIST CNN's first convolution", make_conv_geometry(1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"padded, 10 output channels (a row tile cut short)",
       make_conv_geometry(5, 19, 21, 10, 3, 3, 1, 1, 1, 1, 1, 1, 1)},
      {"k = 576: two k blocks", make_conv_geometry(64, 18, 18, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1)},
      {"5 x 3, dilated, unequal padding, grouped", make_conv_geometry(6, 40, 37, 10, 5, 3, 1, 1, 2, 1, 2, 2, 2)},
      {"even kernel, same padding (one more after the end)",
       make_conv_geometry(4, 32, 32, 6, 2, 2, 1, 1, 0, 0, 1, 1, 1, true)},
      {"same padding, 4 x 4 dilated", make_conv_geometry(3, 33, 60, 7, 4, 4, 1, 1, 0, 0, 2, 2, 1, true)},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      check_against_im2col<float>(c.g, 9, true, activation::identity, threads);
      check_against_im2col<float>(c.g, 9, false, activation::relu, threads);
      check_against_im2col<float>(c.g, 5, true, activation::gelu, threads);
      check_against_im2col<double>(c.g, 5, true, activation::leaky_relu, threads);
    }
  }
}

TEST_CASE("direct convolution weight gradient: the bits of im2col and the blocked GEMM") {
  const without_amx no_amx;
  const geometry_case cases[] = {
      {"the MNIST CNN's second convolution (two k blocks of 12 output rows)",
       make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"the MNIST CNN's first convolution", make_conv_geometry(1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"20 output channels (a masked vector), k blocks cut mid-row",
       make_conv_geometry(3, 27, 27, 20, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"strided and padded, 40 output channels", make_conv_geometry(8, 16, 16, 40, 3, 3, 2, 2, 1, 1, 1, 1, 1)},
      {"2 x 1 strides, 1 x 2 dilation, grouped", make_conv_geometry(6, 61, 50, 36, 3, 3, 2, 1, 1, 1, 1, 2, 2)},
      {"even kernel, same padding", make_conv_geometry(4, 32, 32, 24, 2, 2, 1, 1, 0, 0, 1, 1, 1, true)},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      // 37 samples: groups of 16, 16 and 5 partial sums.
      check_weight_gradient<float>(c.g, 37, threads);
      check_weight_gradient<double>(c.g, 5, threads);
    }
  }
}

TEST_CASE("direct convolution input gradient: a forward convolution of the output gradient") {
  const without_amx no_amx;
  const geometry_case cases[] = {
      {"the MNIST CNN's second convolution", make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"the ResNet's first stage (padded, 16 channels)", make_conv_geometry(16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1)},
      {"padded, 10 input channels (a row tile cut short)", make_conv_geometry(10, 19, 21, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1)},
      {"k = 576: two k blocks", make_conv_geometry(9, 18, 18, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)},
      {"5 x 3, dilated, unequal padding, grouped", make_conv_geometry(6, 40, 37, 10, 5, 3, 1, 1, 2, 1, 2, 2, 2)},
      {"even kernel, same padding (one more after the end)",
       make_conv_geometry(6, 32, 32, 4, 2, 2, 1, 1, 0, 0, 1, 1, 1, true)},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      check_input_gradient<float>(c.g, 9, threads);
      check_input_gradient<double>(c.g, 5, threads);
    }
  }
  using kernels::cpu::conv_direct_input_gradient_applies;
  // Strided: the gradient is not a unit-stride forward convolution.
  CHECK_FALSE(conv_direct_input_gradient_applies<float>(make_conv_geometry(16, 28, 28, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1)));
  // Padding past the window's reach would need a negative padding in the transposed convolution.
  CHECK_FALSE(conv_direct_input_gradient_applies<float>(make_conv_geometry(16, 28, 28, 16, 3, 3, 1, 1, 3, 3, 1, 1, 1)));
  // Pointwise: gemm reads dy in place already, with no col2im.
  CHECK_FALSE(conv_direct_input_gradient_applies<float>(make_conv_geometry(16, 28, 28, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
}

TEST_CASE("direct convolution: which geometries it leaves to im2col") {
  const without_amx no_amx;
  using kernels::cpu::conv_direct_applies;
  CHECK(conv_direct_applies<float>(make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)));
  // Strided: output positions do not sit at a fixed offset from their windows' input.
  CHECK_FALSE(conv_direct_applies<float>(make_conv_geometry(32, 26, 26, 64, 3, 3, 2, 2, 0, 0, 1, 1, 1)));
  CHECK_FALSE(conv_direct_applies<float>(make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 2, 0, 0, 1, 1, 1)));
  // Pointwise: the GEMM reads the input in place already.
  CHECK_FALSE(conv_direct_applies<float>(make_conv_geometry(32, 26, 26, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
  // Narrow planes: 2 of every 8 positions computed would be thrown away (a 1 x 3 kernel on the same plane throws
  // none: taken).
  CHECK_FALSE(conv_direct_applies<float>(make_conv_geometry(32, 8, 8, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)));
  CHECK(conv_direct_applies<float>(make_conv_geometry(32, 8, 8, 64, 3, 1, 1, 1, 0, 0, 1, 1, 1)));
  // Products small enough for gemm's direct loop.
  CHECK_FALSE(conv_direct_applies<float>(make_conv_geometry(1, 6, 20, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1)));

  // The weight gradient sums real positions only: strides and narrow planes are taken, pointwise kernels are not.
  using kernels::cpu::conv_direct_weight_gradient_applies;
  CHECK(conv_direct_weight_gradient_applies<float>(make_conv_geometry(32, 26, 26, 64, 3, 3, 2, 2, 0, 0, 1, 1, 1)));
  CHECK(conv_direct_weight_gradient_applies<float>(make_conv_geometry(32, 8, 8, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1)));
  CHECK_FALSE(
      conv_direct_weight_gradient_applies<float>(make_conv_geometry(32, 26, 26, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
}

namespace {

// An output gradient as a max pool and a ReLU leave it: in each 2 x 2 window of each channel one position (chosen at
// random) keeps a value, and a third of those are zeroed again; the zeros alternate in sign, as a ReLU's backward
// gives both.
std::vector<float> pooled_gradient(random_generator& rng, index_t batch, const conv_geometry& g) {
  std::vector<float> dy(static_cast<std::size_t>(batch * g.out_size()));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = i % 2 ? -0.0f : 0.0f;
  for (index_t plane = 0; plane < batch * g.out_channels; ++plane)
    for (index_t h = 0; h < g.out_height; h += 2)
      for (index_t w = 0; w < g.out_width; w += 2) {
        const index_t dh = std::min<index_t>(g.out_height - h - 1, index_t(rng.below(2)));
        const index_t dw = std::min<index_t>(g.out_width - w - 1, index_t(rng.below(2)));
        if (rng.below(3) != 0) dy[plane * g.out_plane() + (h + dh) * g.out_width + w + dw] = rng.normal<float>();
      }
  return dy;
}

// The sparse weight gradient of one sample against the direct kernel, overwriting and then adding to what dweight_t
// holds, and the sparse input gradient against gemm and col2im (conv2d_backward through im2col): the same bits.
// Returns whether the sparse kernels took the sample.
bool sparse_sample_matches_dense(const conv_geometry& g, const std::vector<float>& x, const std::vector<float>& dy,
                                 random_generator& rng) {
  const auto start = normal_values<float>(rng, g.group_k() * g.out_channels);
  bool took = true;
  for (const bool overwrite : {true, false}) {
    CAPTURE(overwrite);
    std::vector<float> sparse = start, dense = start;
    took &= kernels::cpu::conv2d_sparse_weight_gradient(x.data(), dy.data(), sparse.data(), g, overwrite);
    kernels::cpu::conv2d_direct_weight_gradient(x.data(), dy.data(), dense.data(), g, overwrite);
    if (took) CHECK(same_bits(sparse, dense));
  }
  const auto weight = normal_values<float>(rng, g.group_k() * g.out_channels);
  std::vector<float> sparse_dx(x.size()), dense_dx(x.size()), col(static_cast<std::size_t>(g.col_size()));
  float* const none = nullptr;
  const bool took_dx = kernels::cpu::conv2d_sparse_input_gradient(
      kernels::cpu::conv_sparse_input_gradient_weights(weight.data(), g), dy.data(), sparse_dx.data(), g);
  policy::cpu::conv2d_backward<im2col_policy>(x.data(), weight.data(), dy.data(), dense_dx.data(), none, none,
                                              col.data(), 1, g, false);
  if (took_dx) CHECK(same_bits(sparse_dx, dense_dx));
  CHECK(took == took_dx);
  return took && took_dx;
}

}  // namespace

TEST_CASE("sparse convolution gradients: the dense kernels' bits from the nonzeros alone") {
  const without_amx no_amx;
  const auto mnist = make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1);
  if (!kernels::cpu::conv_sparse_weight_gradient_applies<float>(mnist)) {
    MESSAGE("skipped: the sparse gradients need AVX-512 (or KILN_SPARSE_GRADIENT=0 turned them off)");
    return;
  }
  const geometry_case cases[] = {
      {"the MNIST CNN's second convolution (two k blocks of 12 output rows)", mnist},
      {"k blocks cut mid-row, 20 output channels", make_conv_geometry(16, 27, 27, 20, 3, 3, 1, 1, 0, 0, 1, 1, 1)},
      {"strided and padded, 40 output channels", make_conv_geometry(16, 16, 16, 40, 3, 3, 2, 2, 1, 1, 1, 1, 1)},
      {"2 x 1 strides, 1 x 2 dilation", make_conv_geometry(32, 41, 30, 24, 3, 3, 2, 1, 1, 1, 1, 2, 1)},
      {"5 x 5, 80 channels: window vectors in chunks of 24, channel vectors in chunks of 4",
       make_conv_geometry(80, 14, 14, 33, 5, 5, 1, 1, 2, 2, 1, 1, 1)},
      {"even kernel, same padding", make_conv_geometry(16, 32, 32, 24, 2, 2, 1, 1, 0, 0, 1, 1, 1, true)},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    REQUIRE(kernels::cpu::conv_sparse_weight_gradient_applies<float>(c.g));
    REQUIRE(kernels::cpu::conv_sparse_input_gradient_applies<float>(c.g));
    random_generator rng(13);
    const auto x = normal_values<float>(rng, c.g.in_size());
    auto dy = pooled_gradient(rng, 1, c.g);
    CHECK(sparse_sample_matches_dense(c.g, x, dy, rng));
    // A NaN in the output gradient is summed, as the dense kernels sum it.
    dy[dy.size() / 3] = std::numeric_limits<float>::quiet_NaN();
    CHECK(sparse_sample_matches_dense(c.g, x, dy, rng));
    // An output gradient with no zeros is left to the dense kernels.
    CHECK_FALSE(sparse_sample_matches_dense(c.g, x, normal_values<float>(rng, c.g.out_size()), rng));

    // Through conv2d_backward, whose samples take the sparse kernels or the dense ones by their density: the bits of
    // im2col and the blocked GEMM for every gradient, on one thread and two, overwriting and accumulating, with the
    // input gradient through a ReLU's backward as a fused layer takes it.
    const index_t batch = 37;
    const auto xs = normal_values<float>(rng, batch * c.g.in_size());
    auto dys = pooled_gradient(rng, batch, c.g);
    for (const index_t n : {3, 20})  // two samples dense
      for (index_t i = 0; i < c.g.out_size(); ++i) dys[n * c.g.out_size() + i] = rng.normal<float>();
    const auto weight = normal_values<float>(rng, c.g.out_channels * c.g.group_k());
    for (const int threads : {1, 2}) {
      const thread_count team(threads);
      for (const bool accumulate : {false, true}) {
        CAPTURE(threads);
        CAPTURE(accumulate);
        std::vector<float> col(static_cast<std::size_t>(batch * c.g.col_size()));
        std::vector<float> dweight = weight, reference_dweight = weight;
        std::vector<float> dbias(static_cast<std::size_t>(c.g.out_channels), 1.0f), reference_dbias = dbias;
        std::vector<float> dx(xs.size()), reference_dx(xs.size());
        policy::cpu::conv2d_backward<policy::cpu>(xs.data(), weight.data(), dys.data(), dx.data(), dweight.data(),
                                                  dbias.data(), col.data(), batch, c.g, accumulate, activation::relu,
                                                  xs.data());
        policy::cpu::conv2d_backward<im2col_policy>(xs.data(), weight.data(), dys.data(), reference_dx.data(),
                                                    reference_dweight.data(), reference_dbias.data(), col.data(),
                                                    batch, c.g, accumulate, activation::relu, xs.data());
        CHECK(same_bits(dweight, reference_dweight));
        CHECK(same_bits(dbias, reference_dbias));
        CHECK(same_bits(dx, reference_dx));
      }
    }
    // Under bfloat16 products the sparse kernels still multiply in single precision: a batch they take whole gets
    // single precision's bits, where the dense bfloat16 path would round the operands.
    const auto sparse_dys = pooled_gradient(rng, batch, c.g);
    std::vector<float> col(static_cast<std::size_t>(batch * c.g.col_size()));
    std::vector<float> dweight(weight.size()), reference_dweight(weight.size()), dx(xs.size()), reference_dx(xs.size());
    float* const no_bias_gradient = nullptr;
    policy::cpu_bf16::conv2d_backward<policy::cpu_bf16>(xs.data(), weight.data(), sparse_dys.data(), dx.data(),
                                                        dweight.data(), no_bias_gradient, col.data(), batch, c.g,
                                                        false);
    policy::cpu::conv2d_backward<im2col_policy>(xs.data(), weight.data(), sparse_dys.data(), reference_dx.data(),
                                                reference_dweight.data(), no_bias_gradient, col.data(), batch, c.g,
                                                false);
    CHECK(same_bits(dweight, reference_dweight));
    CHECK(same_bits(dx, reference_dx));
  }
}

TEST_CASE("sparse convolution gradients: which convolutions they take") {
  const without_amx no_amx;
  using kernels::cpu::conv_sparse_input_gradient_applies;
  using kernels::cpu::conv_sparse_weight_gradient_applies;
  const auto mnist = make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1);
#if defined(__AVX512F__)
  if (kiln::switch_on(kiln::run_switch::sparse_gradient)) {
    CHECK(conv_sparse_weight_gradient_applies<float>(mnist));
    CHECK(conv_sparse_input_gradient_applies<float>(mnist));
  }
#else
  CHECK_FALSE(conv_sparse_weight_gradient_applies<float>(mnist));
  CHECK_FALSE(conv_sparse_input_gradient_applies<float>(mnist));
#endif
  // Doubles, channels that are not whole vectors, and groups stay dense; so does the MNIST CNN's first convolution,
  // of one input channel.
  const conv_geometry dense_ones[] = {make_conv_geometry(20, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1),
                                      make_conv_geometry(32, 26, 26, 64, 3, 3, 1, 1, 0, 0, 1, 1, 2),
                                      make_conv_geometry(1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 1, 1, 1)};
  CHECK_FALSE(conv_sparse_weight_gradient_applies<double>(mnist));
  CHECK_FALSE(conv_sparse_input_gradient_applies<double>(mnist));
  for (const auto& g : dense_ones) {
    CHECK_FALSE(conv_sparse_weight_gradient_applies<float>(g));
    CHECK_FALSE(conv_sparse_input_gradient_applies<float>(g));
  }
  // The input gradient's sum over more than one k block of output channels stays dense.
  const auto wide = make_conv_geometry(32, 12, 12, 640, 3, 3, 1, 1, 0, 0, 1, 1, 1);
  CHECK_FALSE(conv_sparse_input_gradient_applies<float>(wide));
  // Turned off, neither runs.
  const bool was_on = kernels::cpu::sparse_conv_gradients_enabled();
  kernels::cpu::set_sparse_conv_gradients(false);
  CHECK_FALSE(conv_sparse_weight_gradient_applies<float>(mnist));
  CHECK_FALSE(conv_sparse_input_gradient_applies<float>(mnist));
  kernels::cpu::set_sparse_conv_gradients(was_on);
}
