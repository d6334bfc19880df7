// The kernels behind convolutional networks, gathered into one base of the CPU policies: convolution helpers,
// pooling, batch / layer normalisation and dropout.
#pragma once

#include "kiln/kernels/cpu/conv.hpp"
#include "kiln/kernels/cpu/dropout.hpp"
#include "kiln/kernels/cpu/normalization.hpp"
#include "kiln/kernels/cpu/pooling.hpp"

namespace kiln::kernels::cpu {

struct cnn_kernels : conv_kernels, pooling_kernels, normalization_kernels, dropout_kernels {};

}  // namespace kiln::kernels::cpu
