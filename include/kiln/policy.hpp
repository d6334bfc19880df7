// Backend policies: the only switch between backends. Layers, both modes, losses and optimizers call kernels through
// a policy type, so adding a backend means adding a policy and its kernels, nothing else.
#pragma once

#include <algorithm>

#include "kiln/core/memory.hpp"
#include "kiln/kernels/cpu/cnn.hpp"
#include "kiln/kernels/cpu/dense_sparse_input.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/head_backward.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/parallel.hpp"
#include "kiln/kernels/cpu/recurrent.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cpu/softmax.hpp"
#include "kiln/kernels/cpu/tensor_ops.hpp"

#if defined(KILN_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace kiln::policy {

// kiln's own CPU kernels, including its blocked, vectorised GEMM. Its single-precision products take the precision
// set by kernels::cpu::set_default_product_precision (single unless set; see policy::cpu_bf16 and cpu_bf16x3).
struct cpu : kernels::cpu::elementwise_kernels,
             kernels::cpu::reduce_kernels,
             kernels::cpu::softmax_kernels,
             kernels::cpu::loss_kernels,
             kernels::cpu::optim_kernels,
             kernels::cpu::recurrent_kernels,
             kernels::cpu::cnn_kernels,
             kernels::cpu::sparse_input_kernels,
             kernels::cpu::tensor_kernels {
  static constexpr const char* name = "cpu";
  // Convolutions' forward (unit strides) and weight gradient read their input in place with the blocked GEMM's
  // arithmetic (conv_direct.hpp) instead of building im2col's column matrix for gemm: the same bits, where gemm would
  // run the product blocked.
  static constexpr bool direct_convolution = true;
  // Dense layers take the GEMM whatever their input; policy::cpu_sparse_input takes the sparse-input products.
  static constexpr bool sparse_input_products = false;
  // A Dense layer's backward over a Dense layer with a fused ReLU (static mode's Sequential with fused epilogues):
  // dW = dy^T x and dx = relu'(x) (dy W) in one pass over the batch (head_backward.hpp), where that pass has the bits
  // of the two products and the ReLU's backward and gemm would run both on the calling thread, and the sparse-input
  // products, where the policy takes them, do not take the weight gradient (dense_backward_through_relu_applies). The
  // gain: docs/benchmarks.md.
  static constexpr bool one_pass_relu_backward = true;
  static bool dense_backward_through_relu_applies(index_t batch, index_t in, index_t out,
                                                  kernels::cpu::product_precision precision) {
    return one_pass_relu_backward_applies(batch, in, out, precision, sparse_input_products);
  }
  static void dense_backward_through_relu(const float* dy, const float* x, const float* w, float* dw, float* dx,
                                          index_t batch, index_t in, index_t out) {
    kernels::cpu::head_backward_part(dy, x, w, dw, dx, nullptr, batch, in, out, 0, in);
  }

  // The memory contract every policy provides: where its buffers live and how data crosses to and from the host.
  // CPU memory is host memory, so staging is a plain copy and there is nothing to wait for. Callers test
  // host_accessible to skip the copies (and the staging buffers) entirely on the CPU.
  static constexpr bool host_accessible = true;
  template <class T>
  using buffer = aligned_buffer<T>;
  template <class T>
  static void upload(const T* host, T* dst, index_t n) {
    if (n > 0 && host != dst) std::copy_n(host, n, dst);
  }
  template <class T>
  static void download(const T* src, T* host, index_t n) {
    if (n > 0 && src != host) std::copy_n(src, n, host);
  }
  static void synchronize() {}

  template <class T>
  static void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc,
                   const kernels::cpu::epilogue<T>& ep = {}) {
    kernels::cpu::gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep,
                       kernels::cpu::default_product_precision());
  }
  // The precision its single-precision products take now (a convolution asks, to choose its path as gemm would).
  static kernels::cpu::product_precision gemm_precision() { return kernels::cpu::default_product_precision(); }

  // A right-hand side that many products use in turn (a recurrent layer's W_hh, at every time step), packed once into
  // the calling thread's scratch: valid until that thread's next prepack_b. Null where a policy does not pack.
  template <class T>
  static const T* prepack_b(bool transpose_b, index_t k, index_t n, const T* b, index_t ldb) {
    T* packed = kernels::cpu::packed_gemm_b_scratch<T>(k, n);
    kernels::cpu::pack_gemm_b(transpose_b, k, n, b, ldb, packed, kernels::cpu::default_product_precision());
    return packed;
  }
  // gemm with op(B) from prepack_b: the same bits as gemm on B itself.
  template <class T>
  static void gemm_prepacked_b(bool transpose_a, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                               const T* b_packed, T beta, T* c, index_t ldc, const kernels::cpu::epilogue<T>& ep = {}) {
    kernels::cpu::gemm_prepacked_b(transpose_a, m, n, k, alpha, a, lda, b_packed, beta, c, ldc, ep,
                                   kernels::cpu::default_product_precision());
  }

  // Runs body(begin, end) over slices of a batch whose rows stay independent through a whole job (a recurrent
  // layer's time loop), one slice per thread, when each row's work_per_row multiply-adds per step make that worth
  // a parallel region; the kernels inside then run single-threaded.
  template <class Body>
  static void for_batch_slices(index_t batch, index_t work_per_row, Body&& body) {
    batch_slices(batch, work_per_row, gemm_precision(), body);
  }
  // Runs body(begin, end) over slices of `count` independent jobs of work_per_job multiply-adds each (a convolution's
  // per-group weight gradients), one slice per thread when that is worth a parallel region.
  template <class Body>
  static void for_jobs(index_t count, index_t work_per_job, Body&& body) {
    slices_worth_a_thread(count, work_per_job, 1, body);
  }

 protected:
  static bool one_pass_relu_backward_applies(index_t batch, index_t in, index_t out,
                                             kernels::cpu::product_precision precision, bool sparse_input) {
    const bool serial = num_threads() == 1 || batch * in * out < kernels::cpu::gemm_detail::parallel_min_work;
    return serial && !(sparse_input && kernels::cpu::dense_sparse_input_applies<float>(batch, in, out)) &&
           kernels::cpu::head_backward_fusable(batch, in, out, precision);
  }

  // for_batch_slices for products of this precision. At least 16 rows a slice where they take the bfloat16 path
  // (AMX tiles, or AVX512-BF16 dot products): it takes a product by its shape above 16 rows only (see
  // amx_worthwhile), so every slice then runs the path the whole batch would, with the same bits.
  template <class Body>
  static void batch_slices(index_t batch, index_t work_per_row, kernels::cpu::product_precision precision,
                           Body&& body) {
    slices_worth_a_thread(batch, work_per_row, kernels::cpu::bfloat16_path_active(precision) ? 16 : 8, body);
  }

  // One slice per thread, each of at least `floor` items and of parallel_min_work multiply-adds.
  template <class Body>
  static void slices_worth_a_thread(index_t count, index_t work_per_item, index_t floor, Body&& body) {
    const index_t min_items =
        std::max<index_t>(floor, kernels::cpu::gemm_detail::parallel_min_work / std::max<index_t>(work_per_item, 1));
    kernels::cpu::parallel_row_slices(count, min_items, body);
  }
};

// policy::cpu plus the sparse-input products (kernels/cpu/dense_sparse_input.hpp): a Dense layer's input mostly of one
// value, its background (MNIST's blank pixels, one-hot or bag-of-words features), takes them for its forward and
// weight gradient, which then cost what the input's other elements cost; other inputs take the GEMM, as on policy::cpu.
// The results are the GEMM's within float rounding, not its bits. Each call lists its input afresh. An explicit choice
// for models whose first layer sees such inputs; KILN_SPARSE_INPUT=0 (core/switches.hpp) turns the products off.
//
//   Sequential<policy::cpu_sparse_input, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>> net(64);
//   #define KILN_DYNAMIC_POLICY ::kiln::policy::cpu_sparse_input   // dynamic mode: before including kiln
struct cpu_sparse_input : cpu {
  static constexpr const char* name = "cpu_sparse_input";
  static constexpr bool sparse_input_products = true;
  static bool dense_backward_through_relu_applies(index_t batch, index_t in, index_t out,
                                                  kernels::cpu::product_precision precision) {
    return one_pass_relu_backward_applies(batch, in, out, precision, sparse_input_products);
  }
};

// policy::cpu with its single-precision products fixed at one precision (product_precision.hpp) whatever
// set_default_product_precision says: the base of cpu_bf16 and cpu_bf16x3.
template <kernels::cpu::product_precision Precision>
struct cpu_fixed_precision : cpu {
  static constexpr auto precision = Precision;

  template <class T>
  static void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc,
                   const kernels::cpu::epilogue<T>& ep = {}) {
    kernels::cpu::gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, precision);
  }
  static constexpr kernels::cpu::product_precision gemm_precision() { return Precision; }
  template <class Body>
  static void for_batch_slices(index_t batch, index_t work_per_row, Body&& body) {
    batch_slices(batch, work_per_row, Precision, body);
  }
  template <class T>
  static const T* prepack_b(bool transpose_b, index_t k, index_t n, const T* b, index_t ldb) {
    T* packed = kernels::cpu::packed_gemm_b_scratch<T>(k, n);
    kernels::cpu::pack_gemm_b(transpose_b, k, n, b, ldb, packed, precision);
    return packed;
  }
  template <class T>
  static void gemm_prepacked_b(bool transpose_a, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                               const T* b_packed, T beta, T* c, index_t ldc, const kernels::cpu::epilogue<T>& ep = {}) {
    kernels::cpu::gemm_prepacked_b(transpose_a, m, n, k, alpha, a, lda, b_packed, beta, c, ldc, ep, precision);
  }
};

// policy::cpu with bfloat16 allowed in its single-precision products, as torch.set_float32_matmul_precision("medium")
// allows PyTorch's: every product that runs on AMX tiles (Dense, Conv2D, the recurrent layers' gates, in both modes)
// rounds its operands to bfloat16 and keeps its sums in float, one tile product where float operands take six; on
// CPUs with AVX512-BF16 but no AMX the same products run on its dot products, twice the float FMAs' rate. Smaller
// products, and all of them on CPUs with neither, stay single precision (product_precision.hpp). Everything
// else (activations, losses, the optimizers' updates, the parameters themselves) stays float. An operand rounded to
// bfloat16 carries a relative error of up to 2^-8 (0.4%) instead of float's 2^-24. policy::cpu takes the same
// arithmetic from set_default_product_precision; this type fixes it for one model.
struct cpu_bf16 : cpu_fixed_precision<kernels::cpu::product_precision::bfloat16> {
  static constexpr const char* name = "cpu_bf16";
};

// policy::cpu with products of bfloat16x3, as torch.set_float32_matmul_precision("high") allows PyTorch's: each
// operand of a product on AMX tiles split into two bfloat16 values, x = hi + lo (within 2^-16 of x), and
// three tile products (hi*hi + lo*hi + hi*lo) where float operands take six. Where policy::cpu_bf16 is too coarse for
// a model, this keeps most of float's accuracy at half its tile work.
struct cpu_bf16x3 : cpu_fixed_precision<kernels::cpu::product_precision::bfloat16x3> {
  static constexpr const char* name = "cpu_bf16x3";
};

#if defined(KILN_HAVE_CBLAS)
// The CPU kernels with OpenBLAS for the matrix products (link kiln::blas); the epilogue runs as a second pass.
struct cpu_blas : cpu {
  static constexpr const char* name = "cpu_blas";
  static constexpr bool direct_convolution = false;  // every product, a convolution's included, is OpenBLAS's
  static constexpr bool sparse_input_products = false;  // and a Dense layer's, whatever its input
  static constexpr bool one_pass_relu_backward = false;  // OpenBLAS's products have other bits

  // Every product goes to OpenBLAS, which packs for itself and threads on its own.
  template <class T>
  static const T* prepack_b(bool, index_t, index_t, const T*, index_t) {
    return nullptr;
  }
  template <class Body>
  static void for_batch_slices(index_t batch, index_t, Body&& body) {
    body(index_t{0}, batch);
  }
  template <class Body>
  static void for_jobs(index_t count, index_t, Body&& body) {
    body(index_t{0}, count);
  }

  template <class T>
  static void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc,
                   const kernels::cpu::epilogue<T>& ep = {}) {
    if (m == 0 || n == 0) return;
    auto ta = transpose_a ? CblasTrans : CblasNoTrans;
    auto tb = transpose_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    else
      cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    if (ep.bias || ep.act != activation::identity) {
      for (index_t i = 0; i < m; ++i) {
        T* row = c + i * ldc;
        if (ep.bias) add_row_bias(row, ep.bias, 1, n);
        activation_forward(ep.act, row, row, n, ep.slope);
      }
    }
  }
};
#endif

// A policy is a type with the kernel interface above; the concept keeps errors to one readable line.
template <class P>
concept backend_policy = requires { P::name; };

}  // namespace kiln::policy

// In compiled mode (KILN_COMPILED_KERNELS), the kernels behind these policies are declared kept in kiln_kernels.
#include "kiln/kernels/cpu/compiled_kernels.hpp"
