# The optional CUDA / cuDNN backend (policy::cuda, policy::cudnn in kiln/policy_cuda.cuh).
#
#   KILN_CUDA=AUTO (default)  built when nvcc, the CUDA toolkit and cuDNN are found, skipped with a message otherwise
#   KILN_CUDA=ON              required: configuring fails if any of them is missing
#   KILN_CUDA=OFF             never built
#
# It is never built with KILN_SANITIZE (nvcc's host code and the CUDA runtime do not mix with the sanitizers).
# On success: KILN_HAVE_CUDA is ON, the INTERFACE target kiln::cuda (kiln + cudart, cuBLAS, cuBLASLt, cuDNN) exists, and
# kiln_cuda_executable(name source...) builds one of kiln's own .cu programs with the project's warnings.
set(KILN_CUDA AUTO CACHE STRING "Build the CUDA/cuDNN backend: AUTO (when nvcc is found), ON (required) or OFF")
set_property(CACHE KILN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(KILN_HAVE_CUDA OFF)

# Stops with an error when the backend was required, otherwise says in one line why it is not built.
function(kiln_cuda_unavailable why)
  if(KILN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_CUDA=ON but the CUDA backend cannot be built: ${why}")
  endif()
  message(STATUS "kiln: CUDA backend not built: ${why}")
endfunction()

function(kiln_find_cuda)
  string(TOUPPER "${KILN_CUDA}" mode)
  if(mode STREQUAL "OFF")
    message(STATUS "kiln: CUDA backend not built: KILN_CUDA=OFF")
    return()
  endif()
  if(KILN_SANITIZE)
    kiln_cuda_unavailable("sanitizer build (KILN_SANITIZE=${KILN_SANITIZE})")
    return()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    kiln_cuda_unavailable("no CUDA compiler (nvcc) found; put it on PATH or set CMAKE_CUDA_COMPILER")
    return()
  endif()
  set(KILN_CUDA_COMPILER_FOUND ON PARENT_SCOPE)
endfunction()
kiln_find_cuda()

if(KILN_CUDA_COMPILER_FOUND)
  # H100 / H200 unless the user chose; must be set before the language is enabled.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to compile for")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit)
  # cuDNN ships with the toolkit on some systems (include/, lib/ or lib64/) and as a distribution package on others.
  find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
            PATHS /usr/include /usr/local/cuda/include /usr/include/x86_64-linux-gnu)
  find_library(KILN_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
               PATHS /usr/lib/x86_64-linux-gnu /usr/local/cuda PATH_SUFFIXES lib64 lib)
  if(NOT CUDAToolkit_FOUND)
    kiln_cuda_unavailable("nvcc found but not the CUDA toolkit libraries")
  elseif(NOT TARGET CUDA::cublasLt)
    kiln_cuda_unavailable("cuBLASLt not found in the CUDA toolkit")
  elseif(NOT KILN_CUDNN_INCLUDE_DIR OR NOT KILN_CUDNN_LIBRARY)
    kiln_cuda_unavailable("cuDNN not found (cudnn.h: ${KILN_CUDNN_INCLUDE_DIR}, libcudnn: ${KILN_CUDNN_LIBRARY})")
  else()
    set(KILN_HAVE_CUDA ON)
  endif()
endif()

if(KILN_HAVE_CUDA)
  message(STATUS "kiln: CUDA backend built with nvcc ${CMAKE_CUDA_COMPILER_VERSION} for sm_${CMAKE_CUDA_ARCHITECTURES}, "
                 "cuDNN ${KILN_CUDNN_LIBRARY}")
  add_library(kiln_cuda INTERFACE)
  add_library(kiln::cuda ALIAS kiln_cuda)
  target_link_libraries(kiln_cuda INTERFACE kiln CUDA::cudart CUDA::cublas CUDA::cublasLt ${KILN_CUDNN_LIBRARY})
  target_include_directories(kiln_cuda INTERFACE ${KILN_CUDNN_INCLUDE_DIR})
  # CMake 3.25's feature table predates nvcc 13, so cuda_std_20 would be refused there: ask for C++20 by flag.
  target_compile_options(kiln_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  # The host half of .cu files gets the CPU kernels' -fno-math-errno and -ffp-contract=off too (see the top-level
  # CMakeLists.txt).
  target_compile_options(kiln_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-math-errno>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-ffp-contract=off>)
  # The device half likewise: nvcc fuses a * b + c into one FMA by default, which rounds once where the CPU rounds
  # twice. The kernels then disagree with the CPU's in the last bits, and where a formula cancels (1 - y * y for
  # tanh's derivative near |y| = 1, g - mean(g) in layer norm's backward over one column) in far more. kiln's own
  # kernels are bound by memory, so the extra rounding step costs nothing measurable; cuBLAS and cuDNN are not
  # affected.
  target_compile_options(kiln_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false>)
  # The CPU kernels' `#pragma GCC unroll` is for the host compiler, which still receives it; nvcc's own front end does
  # not know it (diagnostic 1675) and would otherwise warn once per pragma in every .cu file that includes them.
  target_compile_options(kiln_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=1675>)
  # OpenMP reaches CUDA sources only through the host compiler (FindOpenMP's flag is for CXX sources); without it the
  # host compiler would warn about the CPU kernels' pragmas.
  if(OpenMP_CXX_FOUND)
    target_compile_options(kiln_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fopenmp>)
  endif()

  # Warnings of kiln's own .cu programs: the project's host-compiler warnings through -Xcompiler, nvcc's own
  # diagnostics, and both as errors with KILN_WERROR. -Wpedantic is left to the C++ builds: nvcc hands the host
  # compiler code with GCC-style line markers, which -Wpedantic reports on every line.
  add_library(kiln_cuda_options INTERFACE)
  target_compile_options(kiln_cuda_options INTERFACE
                         $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(KILN_WERROR)
    target_compile_options(kiln_cuda_options INTERFACE
                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror --Werror=all-warnings>)
  endif()
  if(KILN_NATIVE)
    target_compile_options(kiln_cuda_options INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-march=native>)
  endif()
endif()

# kiln_cuda_executable(name source...): one of kiln's own CUDA programs (tests/cuda, bench/cuda), linked to kiln::cuda
# and its CPU kernels compiled once (kiln::kernels), with the project's warnings. Call it only when KILN_HAVE_CUDA is ON.
function(kiln_cuda_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE kiln::cuda kiln::kernels kiln_cuda_options)
  if(TARGET kiln::blas)
    target_link_libraries(${name} PRIVATE kiln::blas)
  endif()
endfunction()
