// kiln_kernels: dynamic mode's modules, tape and functional ops for double (include/kiln/dynamic/compiled_modules.hpp).
#include "kiln/dynamic/compiled_modules.hpp"

KILN_DYNAMIC_CLASSES(KILN_INSTANTIATE_CLASS, double)
KILN_DYNAMIC_FUNCTIONS(KILN_INSTANTIATE_KERNEL, double)
KILN_DYNAMIC_MEMBER_TEMPLATES(KILN_INSTANTIATE_OVERLOAD, double)
