// The cuDNN kernels of policy::cudnn: convolution, pooling (forward), batch normalisation, softmax, and the stacked
// LSTM / GRU over whole sequences. Each falls back to kiln's CUDA kernel for what cuDNN cannot do the CPU's way (see
// each header); policy::cudnn names these with using-declarations so that they replace policy::cuda's kernels of the
// same names (the sequence kernels have no namesake: the recurrent layers look for them).
#pragma once

#include "kiln/kernels/cudnn/batchnorm.cuh"
#include "kiln/kernels/cudnn/conv.cuh"
#include "kiln/kernels/cudnn/pooling.cuh"
#include "kiln/kernels/cudnn/rnn.cuh"
#include "kiln/kernels/cudnn/softmax.cuh"

namespace kiln::kernels::cudnn {

// All of them, one base of policy::cudnn.
struct cudnn_kernels : conv_kernels, pooling_kernels, batch_norm_kernels, softmax_kernels, rnn_kernels {};

}  // namespace kiln::kernels::cudnn
