// Row-major GEMM with a fused epilogue: C = act(alpha * op(A) * op(B) + beta * C + bias), bias indexed by column.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::kernels::cpu {

// What a GEMM does to each output element after the product: add a per-column bias, then apply an activation.
template <class T>
struct epilogue {
  const T* bias = nullptr;  // length n, or null
  activation act = activation::identity;
  T slope = T(0.01);  // LeakyReLU's negative slope
};

// op(A) is m x k, op(B) is k x n, C is m x n; all row-major with leading dimensions lda, ldb, ldc.
// beta == 0 overwrites C without reading it (C may hold NaN). Deterministic: every element's sum over k runs in
// the same order whatever the thread count.
template <class T>
void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
          const T* b, index_t ldb, T beta, T* c, index_t ldc, const epilogue<T>& ep = {}) {
  for (index_t i = 0; i < m; ++i) {
    for (index_t j = 0; j < n; ++j) {
      T sum = T(0);
      for (index_t p = 0; p < k; ++p) {
        T av = transpose_a ? a[p * lda + i] : a[i * lda + p];
        T bv = transpose_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += av * bv;
      }
      T v = alpha * sum;
      if (beta != T(0)) v += beta * c[i * ldc + j];
      if (ep.bias) v += ep.bias[j];
      c[i * ldc + j] = activate(ep.act, v, ep.slope);
    }
  }
}

}  // namespace kiln::kernels::cpu
