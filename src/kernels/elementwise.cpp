// kiln_kernels: element-wise kernels, reductions, softmax, losses and optimizer updates (include/kiln/kernels/cpu/compiled_kernels.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"

KILN_CPU_ELEMENTWISE_KERNELS(KILN_INSTANTIATE_KERNEL, float)
KILN_CPU_ELEMENTWISE_KERNELS(KILN_INSTANTIATE_KERNEL, double)
KILN_CPU_OVERLOADED_KERNELS(KILN_INSTANTIATE_OVERLOAD, float)
KILN_CPU_OVERLOADED_KERNELS(KILN_INSTANTIATE_OVERLOAD, double)
