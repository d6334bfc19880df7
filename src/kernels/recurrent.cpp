// kiln_kernels: the recurrent cells and the sparse-input products (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_RECURRENT_KERNELS(KILN_INSTANTIATE_KERNEL, float)
KILN_CPU_RECURRENT_KERNELS(KILN_INSTANTIATE_KERNEL, double)
KILN_CPU_SPARSE_INPUT_KERNELS(KILN_INSTANTIATE_KERNEL)
