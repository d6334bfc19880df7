// The optional compiled mode, as in fmt and spdlog: the same headers, with the kernels compiled once into a library.
//
// kiln is header-only by default: a program that adds include/ to its include path compiles every kernel it calls
// (the GEMM routes, convolution, pooling, normalisation, recurrent cells, losses, optimizer updates) in each of its
// translation units. With KILN_COMPILED_KERNELS defined (CMake: link kiln::kernels, which defines it), those kernels
// are declared here as explicit instantiations kept elsewhere (`extern template`), and the library kiln_kernels holds
// their one copy. What depends on a model's types (layers, Sequential, the modules) is still compiled in the program.
//
// The kernels are the same source in both modes and the library is built with the program's flags, so both modes give
// the same bits (tests/test_compiled_kernels.cpp trains one model each way).
//
// Contract of a kernel entry (an element of a KILN_*_KERNELS list below):
//   requires: a function template whose template arguments, given in the list, name exactly one specialisation, and
//             which is not implicitly inline, or is marked KILN_KERNEL (a member defined in its class is inline,
//             and an inline function is instantiated wherever it is called, extern or not);
//   ensures:  in compiled mode every call to that specialisation is a call into kiln_kernels, and its definition is
//             never instantiated in the program; in header-only mode nothing changes.
#pragma once

#if defined(KILN_COMPILED_KERNELS)
// Out of line in compiled mode, so that the explicit instantiation declaration holds for members defined in a class.
#define KILN_KERNEL __attribute__((noinline))
#else
#define KILN_KERNEL
#endif

// X-macro callbacks: one entry is (function, template arguments...).
#define KILN_EXTERN_KERNEL(function, ...) extern template decltype(function<__VA_ARGS__>) function<__VA_ARGS__>;
#define KILN_INSTANTIATE_KERNEL(function, ...) template decltype(function<__VA_ARGS__>) function<__VA_ARGS__>;
// An overloaded function template, which decltype cannot name: one entry is (return type, function, template argument,
// parenthesised parameter types).
#define KILN_EXTERN_OVERLOAD(result, function, argument, parameters) extern template result function<argument> parameters;
#define KILN_INSTANTIATE_OVERLOAD(result, function, argument, parameters) template result function<argument> parameters;
// One entry is (class template, template arguments...): every member of that specialisation is in the library.
#define KILN_EXTERN_CLASS(class_template, ...) extern template class class_template<__VA_ARGS__>;
#define KILN_INSTANTIATE_CLASS(class_template, ...) template class class_template<__VA_ARGS__>;

// A function that is not a template (a reader, the CPU's thread balance, a fused kernel's step) is compiled once in
// the same way. Its header declares it KILN_LIBRARY_FUNCTION and defines it under
// `#if defined(KILN_LIBRARY_DEFINITIONS)`:
//   header-only mode: the definition is inline in every translation unit, as any function of a header-only library;
//   compiled mode:    the header declares it only, and src/kernels/library_functions.cpp, which defines
//                     KILN_LIBRARY_DEFINITIONS before including the headers, holds its one definition.
#if defined(KILN_COMPILED_KERNELS)
#define KILN_LIBRARY_FUNCTION
#else
#define KILN_LIBRARY_FUNCTION inline
#if !defined(KILN_LIBRARY_DEFINITIONS)
#define KILN_LIBRARY_DEFINITIONS
#endif
#endif
