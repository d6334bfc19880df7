// kiln_kernels: convolution, pooling, normalisation and dropout for double (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_CNN_KERNELS(KILN_INSTANTIATE_KERNEL, double)
