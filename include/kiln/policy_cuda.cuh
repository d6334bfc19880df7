// The GPU backend policies: policy::cuda (kiln's own CUDA kernels, cuBLAS and cuBLASLt for the matrix products),
// policy::cuda_tf32 (the same with TF32 tensor-core GEMMs) and policy::cudnn (policy::cuda with cuDNN for
// convolution, pooling, batch norm and softmax). Include this header from .cu files compiled by nvcc and link
// kiln::cuda; the kernel functions have exactly the names and signatures of policy::cpu's (kiln/policy.hpp), with
// device pointers in place of host pointers, so layers, both modes, losses and optimizers run on them unchanged.
//
// Memory: the data of these policies lives in device memory (host_accessible is false). buffer<T> is
// kiln::cuda::device_buffer<T>; upload / download copy between host and device through pinned staging buffers;
// functions that return a scalar (the losses, sum, sum_abs, sum_squares) wait for the GPU and return it on the host.
// Everything runs in order on the kiln stream (kiln::cuda::current_stream()).
#pragma once

#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/handles.cuh"
#include "kiln/core/cuda/pinned_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cuda/adam_capturable.cuh"
#include "kiln/kernels/cuda/attention.cuh"
#include "kiln/kernels/cuda/dropout.cuh"
#include "kiln/kernels/cuda/elementwise.cuh"
#include "kiln/kernels/cuda/gemm.cuh"
#include "kiln/kernels/cuda/loss.cuh"
#include "kiln/kernels/cuda/optim.cuh"
#include "kiln/kernels/cuda/reduce.cuh"
#include "kiln/kernels/cuda/softmax.cuh"
#include "kiln/kernels/cuda/tensor_ops.cuh"
#include "kiln/policy.hpp"
#include "kiln/kernels/cuda/cnn.cuh"
#include "kiln/kernels/cuda/recurrent.cuh"
#include "kiln/kernels/cudnn/cudnn.cuh"

namespace kiln::policy {

// The matrix products of the CUDA policies in one arithmetic (fp32 or tf32 for float; double is always FP64).
template <kernels::cuda::gemm_math Math>
struct cuda_gemm {
  // C = act(alpha op(A) op(B) + beta C + bias), row-major, as kernels::cpu::gemm.
  template <class T>
  static void gemm(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc,
                   const kernels::cpu::epilogue<T>& ep = {}) {
    kernels::cuda::gemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, Math);
  }
  // count products with operands strided in memory, in one launch (the convolution's per-sample products).
  template <class T>
  static void gemm_strided_batched(bool transpose_a, bool transpose_b, index_t m, index_t n, index_t k, T alpha,
                                   const T* a, index_t lda, index_t stride_a, const T* b, index_t ldb, index_t stride_b,
                                   T beta, T* c, index_t ldc, index_t stride_c, index_t count) {
    kernels::cuda::gemm_strided_batched(transpose_a, transpose_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                        beta, c, ldc, stride_c, count, Math);
  }
};

// kiln's CUDA kernels, with cuBLAS for plain matrix products and cuBLASLt where a fused epilogue (bias, ReLU) is asked.
struct cuda : kernels::cuda::elementwise_kernels,
              kernels::cuda::reduce_kernels,
              kernels::cuda::softmax_kernels,
              kernels::cuda::loss_kernels,
              kernels::cuda::optim_kernels,
              kernels::cuda::capturable_optim_kernels,  // Adam with adam_options::capturable
              kernels::cuda::dropout_kernels,
              // CNN and recurrent kernels (conv2d_forward / conv2d_backward: im2col + Policy::gemm)
              kernels::cuda::cnn_kernels,
              kernels::cuda::recurrent_kernels,
              kernels::cuda::tensor_kernels,  // dynamic mode's general tensor ops
              kernels::cuda::attention_kernels,  // attention without the score matrix (both modes)
              cuda_gemm<kernels::cuda::gemm_math::fp32> {  // FP32 products for float, no TF32
  static constexpr const char* name = "cuda";

  // ---- memory contract (see policy::cpu) ----------------------------------------------------------------------------
  static constexpr bool host_accessible = false;
  template <class T>
  using buffer = kiln::cuda::device_buffer<T>;

  // host -> device; returns as soon as `host` may be reused (the copy completes in stream order).
  template <class T>
  static void upload(const T* host, T* dst, index_t n) {
    kiln::cuda::copy_to_device(host, dst, n);
  }
  // device -> host; returns when `host` holds the values.
  template <class T>
  static void download(const T* src, T* host, index_t n) {
    kiln::cuda::copy_to_host(src, host, n);
  }
  // Waits for everything queued on the kiln stream.
  static void synchronize() { kiln::cuda::synchronize(); }
  // Untyped device memory from the caching allocator: dynamic mode's values and gradients (KILN_DYNAMIC_POLICY).
  static kiln::cuda::device_block allocate_bytes(std::size_t bytes) { return kiln::cuda::allocate_device(bytes); }
  static void free_bytes(void* data, std::size_t bytes) noexcept { kiln::cuda::free_device({data, bytes}); }
};

// policy::cuda with float GEMMs on the tensor cores in TF32 (10-bit mantissa inputs, FP32 accumulation), as PyTorch's
// allow_tf32: several times faster on large products, with errors around 1e-3 relative instead of 1e-6.
struct cuda_tf32 : cuda, cuda_gemm<kernels::cuda::gemm_math::tf32> {
  static constexpr const char* name = "cuda_tf32";
  // These names exist in both bases; the using-declarations make the TF32 ones hide policy::cuda's.
  // conv2d_forward / conv2d_backward take the policy as a template argument and call its gemm: TF32 here too.
  using cuda_gemm<kernels::cuda::gemm_math::tf32>::gemm;
  using cuda_gemm<kernels::cuda::gemm_math::tf32>::gemm_strided_batched;
};

// policy::cuda with cuDNN where cuDNN has the op: convolution, pooling, batch norm, softmax, and whole sequences of
// the stacked LSTM / GRU (cuDNN's RNN in place of kiln's step loop). Where kiln has its own CUDA kernel too, the two
// policies let a user compare them.
struct cudnn : cuda, kernels::cudnn::cudnn_kernels {
  static constexpr const char* name = "cudnn";

  // These names exist in both bases; the using-declarations make cuDNN's hide policy::cuda's. Each falls back to
  // kiln's CUDA kernel where cuDNN cannot do the CPU's semantics (kernels/cudnn/*.cuh say where).
  using kernels::cudnn::conv_kernels::conv2d_forward;
  using kernels::cudnn::conv_kernels::conv2d_backward;
  using kernels::cudnn::pooling_kernels::max_pool_forward;
  using kernels::cudnn::pooling_kernels::avg_pool_forward;
  using kernels::cudnn::batch_norm_kernels::batch_norm_forward_train;
  using kernels::cudnn::batch_norm_kernels::batch_norm_forward_eval;
  using kernels::cudnn::batch_norm_kernels::batch_norm_backward;
  using kernels::cudnn::softmax_kernels::softmax_forward;
  using kernels::cudnn::softmax_kernels::softmax_backward;
};

}  // namespace kiln::policy
