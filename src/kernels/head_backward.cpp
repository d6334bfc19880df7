// kiln_kernels: static mode's one-pass head backward (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_HEAD_BACKWARD_KERNELS(KILN_INSTANTIATE_KERNEL)
