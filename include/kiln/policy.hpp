// Backend policies: the only switch between backends. Layers, both modes, losses and optimizers call kernels through
// a policy type, so adding a backend means adding a policy and its kernels, nothing else.
#pragma once

#include <algorithm>

#include "kiln/core/memory.hpp"
#include "kiln/kernels/cpu/cnn.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cpu/loss.hpp"
#include "kiln/kernels/cpu/optim.hpp"
#include "kiln/kernels/cpu/recurrent.hpp"
#include "kiln/kernels/cpu/reduce.hpp"
#include "kiln/kernels/cpu/softmax.hpp"

#if defined(KILN_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace kiln::policy {

// kiln's own CPU kernels, including its blocked, vectorised GEMM.
struct cpu : kernels::cpu::elementwise_kernels,
             kernels::cpu::reduce_kernels,
             kernels::cpu::softmax_kernels,
             kernels::cpu::loss_kernels,
             kernels::cpu::optim_kernels,
             kernels::cpu::recurrent_kernels,
             kernels::cpu::cnn_kernels {
  static constexpr const char* name = "cpu";

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
    kernels::cpu::gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep);
  }
};

#if defined(KILN_HAVE_CBLAS)
// The CPU kernels with OpenBLAS for the matrix products (link kiln::blas); the epilogue runs as a second pass.
struct cpu_blas : cpu {
  static constexpr const char* name = "cpu_blas";

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
