// kiln_kernels: the optimizers and gradient clipping on the CPU policy (include/kiln/optim/compiled_optimizers.hpp).
#include "kiln/optim/compiled_optimizers.hpp"

KILN_OPTIMIZER_CLASSES(KILN_INSTANTIATE_CLASS, float)
KILN_OPTIMIZER_CLASSES(KILN_INSTANTIATE_CLASS, double)
KILN_OPTIMIZER_FUNCTIONS(KILN_INSTANTIATE_KERNEL, float)
KILN_OPTIMIZER_FUNCTIONS(KILN_INSTANTIATE_KERNEL, double)
