// The CUDA kernels behind convolutional networks, gathered into one base of the CUDA policies: convolution (im2col +
// the policy's GEMM), pooling, and batch / layer normalisation. (Dropout is with the element-wise CUDA kernels.)
#pragma once

#include "kiln/kernels/cuda/conv.cuh"
#include "kiln/kernels/cuda/normalization.cuh"
#include "kiln/kernels/cuda/pooling.cuh"

namespace kiln::kernels::cuda {

// The CUDA counterpart of kernels::cpu::cnn_kernels (without dropout).
struct cnn_kernels : conv_kernels, pooling_kernels, normalization_kernels {};

}  // namespace kiln::kernels::cuda
