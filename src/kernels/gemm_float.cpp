// kiln_kernels: the GEMM's entries for float (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_GEMM_KERNELS(KILN_INSTANTIATE_KERNEL, float)
