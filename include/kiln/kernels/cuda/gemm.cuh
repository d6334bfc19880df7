// Row-major GEMM on the GPU: C = act(alpha op(A) op(B) + beta C + bias), the contract of kernels::cpu::gemm, through
// cuBLAS (plain products) and cuBLASLt (products with a fused epilogue, static mode's Dense).
//
// cuBLAS and cuBLASLt are column-major. A row-major matrix read as column-major is its transpose, so kiln computes
// C^T = op(B)^T op(A)^T: the column-major call gets B first, A second, n and m swapped, and the same transpose flags;
// no data moves. The bias, indexed by C's column, is then indexed by the row of the column-major result, which is
// what cuBLASLt's bias epilogue broadcasts along.
//
// Epilogues: cuBLASLt fuses bias and ReLU into the product. Its GELU epilogue is not used: kiln's GELU is the exact
// one (erf), while cuBLASLt's follows the tanh approximation (PyTorch too fuses it only for approximate='tanh'), so
// GELU, like the sigmoid, tanh and leaky ReLU that cuBLASLt lacks, runs as a second kernel after a bias epilogue, with
// the formulas of kernels/activation.hpp. gemm_cublaslt_raw lets a test probe any cuBLASLt epilogue directly.
//
// cuBLASLt plans (descriptors, layouts and the algorithm its heuristic picks) are made once per shape, transpose,
// epilogue and pointer alignment, and cached: after the first step a training step only looks them up.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <compare>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/handles.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/activation.hpp"
#include "kiln/kernels/cpu/elementwise.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/kernels/cuda/launch.cuh"

namespace kiln::kernels::cuda {

using cpu::epilogue;

// The arithmetic of float products: fp32 (exact FP32 FMAs, no tensor cores) or tf32 (tensor cores with inputs rounded
// to TF32's 10-bit mantissa, FP32 accumulation: PyTorch's allow_tf32). Double products are always FP64.
enum class gemm_math { fp32, tf32 };

namespace detail {

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "kiln's CUDA GEMM takes float or double");
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
}
template <class T>
constexpr cublasComputeType_t compute_type(gemm_math math) {
  if constexpr (std::is_same_v<T, double>) return CUBLAS_COMPUTE_64F;
  return math == gemm_math::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

inline int checked_int(index_t value, const char* what) {
  if (value < 0 || value > INT_MAX) fail("gemm: ", what, " = ", value, " is out of cuBLAS's int range");
  return static_cast<int>(value);
}

// c = act(beta c + bias) (read_c) or act(bias) (!read_c): the epilogue as a second pass, and the whole product when
// k = 0. Threads run along the columns, blocks stride over the rows.
template <class T, activation A>
__global__ void gemm_epilogue_kernel(T* c, index_t ldc, index_t m, index_t n, bool read_c, T beta, const T* bias,
                                     T slope) {
  for (index_t j = index_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += index_t(gridDim.x) * blockDim.x) {
    const T b = bias ? bias[j] : T(0);
    for (index_t i = blockIdx.y; i < m; i += gridDim.y) {
      T v = read_c ? beta * c[i * ldc + j] : T(0);
      if (bias) v += b;
      c[i * ldc + j] = activate(A, v, slope);
    }
  }
}

template <class T>
void gemm_epilogue(T* c, index_t ldc, index_t m, index_t n, bool read_c, T beta, const T* bias, activation act,
                   T slope) {
  if (m <= 0 || n <= 0) return;
  cpu::with_activation(act, [&](auto a) {
    gemm_epilogue_kernel<T, decltype(a)::value><<<matrix_grid(m, n), block_threads, 0,
                                                  kiln::cuda::current_stream()>>>(c, ldc, m, n, read_c, beta, bias,
                                                                                  slope);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- cuBLASLt plans -------------------------------------------------------------------------------------------------

// The largest power of two (at most 256) that divides the address: what cuBLASLt's heuristic may assume.
inline std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  if (address == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(256, address & (~address + 1)));
}

// Everything a cuBLASLt plan depends on.
struct lt_key {
  int dtype, math;
  bool transpose_a, transpose_b;
  index_t m, n, k, lda, ldb, ldc;
  int epilogue;
  std::uint32_t align_a, align_b, align_c, align_bias;
  auto operator<=>(const lt_key&) const = default;
};

// A matmul descriptor, the layouts of its operands and the algorithm chosen for them (usable = false when the
// heuristic found none: the caller falls back to cuBLAS).
struct lt_plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
};

class lt_plan_cache {
 public:
  static lt_plan_cache& instance() {
    static lt_plan_cache* cache = new lt_plan_cache;  // never destroyed: see the caching allocator
    return *cache;
  }
  std::mutex& mutex() { return mutex_; }
  // The plan for key, made on first use. `bias` is set on the descriptor before the heuristic runs (it reads the
  // pointer's alignment).
  template <class T>
  lt_plan& get(const lt_key& key, const T* bias) {
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    return plans_.emplace(key, make<T>(key, bias)).first->second;
  }
  std::size_t size() const { return plans_.size(); }

 private:
  template <class T>
  static lt_plan make(const lt_key& key, const T* bias) {
    lt_plan plan;
    constexpr cudaDataType_t type = cuda_data_type<T>();
    const auto math = static_cast<gemm_math>(key.math);
    KILN_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute_type<T>(math), type));
    // Operand "A" of the column-major call is kiln's B, operand "B" is kiln's A (see the top of this file).
    const cublasOperation_t op_a = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto epi = static_cast<cublasLtEpilogue_t>(key.epilogue);
    KILN_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    KILN_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    KILN_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias)
      KILN_CUBLASLT_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const auto u = [](index_t v) { return static_cast<std::uint64_t>(v); };
    KILN_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_a, type, key.transpose_b ? u(key.k) : u(key.n),
                                                   key.transpose_b ? u(key.n) : u(key.k), key.ldb));
    KILN_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_b, type, key.transpose_a ? u(key.m) : u(key.k),
                                                   key.transpose_a ? u(key.k) : u(key.m), key.lda));
    KILN_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_c, type, u(key.n), u(key.m), key.ldc));

    cublasLtMatmulPreference_t preference = nullptr;
    KILN_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::uint64_t workspace = kiln::cuda::cublaslt_workspace().bytes;
    KILN_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof workspace));
    // Our A is its B and vice versa; C and D are the same matrix.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attribute, bytes] : alignments)
      KILN_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(kiln::cuda::cublaslt_handle(), plan.desc, plan.layout_a, plan.layout_b,
                                       plan.layout_c, plan.layout_c, preference, 1, &result, &returned);
    (void)cublasLtMatmulPreferenceDestroy(preference);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan.algo = result.algo;
      plan.usable = true;
    }
    return plan;
  }

  std::mutex mutex_;
  std::map<lt_key, lt_plan> plans_;
};

}  // namespace detail

// C = alpha op(A) op(B) + beta C through cuBLAS, then the epilogue (bias, activation) as a second kernel if one is
// asked. k = 0 gives C = act(beta C + bias) (C is not read when beta = 0).
template <class T>
void gemm_cublas(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                 index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc, const epilogue<T>& ep = {},
                 gemm_math math = gemm_math::fp32) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    detail::gemm_epilogue(c, ldc, m, n, beta != T(0), beta, ep.bias, ep.act, ep.slope);
    return;
  }
  constexpr cudaDataType_t type = detail::cuda_data_type<T>();
  KILN_CUBLAS_CHECK(cublasGemmEx(kiln::cuda::cublas_handle(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, detail::checked_int(n, "n"),
                                 detail::checked_int(m, "m"), detail::checked_int(k, "k"), &alpha, b, type,
                                 detail::checked_int(ldb, "ldb"), a, type, detail::checked_int(lda, "lda"), &beta, c,
                                 type, detail::checked_int(ldc, "ldc"), detail::compute_type<T>(math),
                                 CUBLAS_GEMM_DEFAULT));
  if (ep.bias || ep.act != activation::identity)
    detail::gemm_epilogue(c, ldc, m, n, true, T(1), ep.bias, ep.act, ep.slope);
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, A_i = a + i * stride_a (likewise B, C; a stride of 0 shares
// the operand), row-major as gemm, in one cuBLAS launch: a convolution's per-sample products.
template <class T>
void gemm_strided_batched(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                          index_t lda, index_t stride_a, const T* b, index_t ldb, index_t stride_b, T beta, T* c,
                          index_t ldc, index_t stride_c, index_t count, gemm_math math = gemm_math::fp32) {
  if (m <= 0 || n <= 0 || count <= 0) return;
  if (k <= 0) {
    for (index_t i = 0; i < count; ++i)
      detail::gemm_epilogue(c + i * stride_c, ldc, m, n, beta != T(0), beta, static_cast<const T*>(nullptr),
                            activation::identity, T(0));
    return;
  }
  constexpr cudaDataType_t type = detail::cuda_data_type<T>();
  // Column-major C^T = op(B)^T op(A)^T, as gemm_cublas.
  KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      kiln::cuda::cublas_handle(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      detail::checked_int(n, "n"), detail::checked_int(m, "m"), detail::checked_int(k, "k"), &alpha, b, type,
      detail::checked_int(ldb, "ldb"), static_cast<long long>(stride_b), a, type, detail::checked_int(lda, "lda"),
      static_cast<long long>(stride_a), &beta, c, type, detail::checked_int(ldc, "ldc"),
      static_cast<long long>(stride_c), detail::checked_int(count, "batch count"), detail::compute_type<T>(math),
      CUBLAS_GEMM_DEFAULT));
}

// C = epi(alpha op(A) op(B) + beta C) through one cuBLASLt matmul with epilogue `epi` (CUBLASLT_EPILOGUE_DEFAULT,
// _BIAS, _RELU, _RELU_BIAS, _GELU, ...; bias must be set for the _BIAS ones). Returns false, having done nothing, when
// cuBLASLt has no algorithm for the problem. Requires m, n, k > 0.
template <class T>
bool gemm_cublaslt_raw(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                       index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc, cublasLtEpilogue_t epi,
                       const T* bias, gemm_math math = gemm_math::fp32) {
  const detail::lt_key key{int(detail::cuda_data_type<T>()),
                           std::is_same_v<T, float> ? int(math) : 0,
                           transpose_a,
                           transpose_b,
                           m,
                           n,
                           k,
                           lda,
                           ldb,
                           ldc,
                           int(epi),
                           detail::alignment_of(a),
                           detail::alignment_of(b),
                           detail::alignment_of(c),
                           detail::alignment_of(bias)};
  auto& cache = detail::lt_plan_cache::instance();
  std::lock_guard lock(cache.mutex());
  detail::lt_plan& plan = cache.get(key, bias);
  if (!plan.usable) return false;
  if (bias)  // the plan may have been made for another bias vector of the same alignment
    KILN_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const kiln::cuda::device_block workspace = kiln::cuda::cublaslt_workspace();
  KILN_CUBLASLT_CHECK(cublasLtMatmul(kiln::cuda::cublaslt_handle(), plan.desc, &alpha, b, plan.layout_a, a,
                                     plan.layout_b, &beta, c, plan.layout_c, c, plan.layout_c, &plan.algo,
                                     workspace.data, workspace.bytes, kiln::cuda::current_stream()));
  return true;
}

// The full epilogue contract through cuBLASLt: bias and ReLU fused into the matmul, any other activation (GELU,
// sigmoid, tanh, leaky ReLU) as a second kernel. Falls back to gemm_cublas when cuBLASLt has no algorithm.
template <class T>
void gemm_cublaslt(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc, const epilogue<T>& ep = {},
                   gemm_math math = gemm_math::fp32) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    detail::gemm_epilogue(c, ldc, m, n, beta != T(0), beta, ep.bias, ep.act, ep.slope);
    return;
  }
  const bool relu = ep.act == activation::relu;
  const cublasLtEpilogue_t epi = ep.bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                         : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  if (!gemm_cublaslt_raw(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, epi, ep.bias,
                         math)) {
    gemm_cublas(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, math);
    return;
  }
  if (!relu && ep.act != activation::identity)
    detail::gemm_epilogue(c, ldc, m, n, true, T(1), static_cast<const T*>(nullptr), ep.act, ep.slope);
}

// What the CUDA policies call: cuBLAS for a plain product (its kernels need no plan), cuBLASLt when there is an
// epilogue to fuse.
template <class T>
void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
          const T* b, index_t ldb, T beta, T* c, index_t ldc, const epilogue<T>& ep = {},
          gemm_math math = gemm_math::fp32) {
  if (ep.bias || ep.act != activation::identity)
    gemm_cublaslt(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, math);
  else
    gemm_cublas(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, math);
}

}  // namespace kiln::kernels::cuda
