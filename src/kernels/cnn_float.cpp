// kiln_kernels: convolution, pooling, normalisation and dropout for float (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_CNN_KERNELS(KILN_INSTANTIATE_KERNEL, float)
KILN_CPU_FIXED_PRECISION_CNN_KERNELS(KILN_INSTANTIATE_KERNEL)
