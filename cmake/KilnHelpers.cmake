# kiln_executable(name [HEADER_ONLY] [PRECOMPILED pch-target] source...): one of kiln's own programs, with the
# project's warnings and CPU options. It links kiln::kernels (the compiled mode) unless HEADER_ONLY is given: those
# programs compile every kernel themselves, as a program that only adds include/ to its path does, and keep the
# header-only mode tested. PRECOMPILED names a kiln_precompiled_headers target whose header it reuses.
function(kiln_executable name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "HEADER_ONLY" "PRECOMPILED" "")
  add_executable(${name} ${arg_UNPARSED_ARGUMENTS})
  kiln_program_settings(${name} ${arg_HEADER_ONLY})
  if(arg_PRECOMPILED AND KILN_PRECOMPILE_HEADERS)
    target_precompile_headers(${name} REUSE_FROM ${arg_PRECOMPILED})
  endif()
endfunction()

# What every C++ program of kiln's own links: the headers, the project's options, the kernels unless header-only.
function(kiln_program_settings name header_only)
  target_link_libraries(${name} PRIVATE kiln::kiln kiln_project_options)
  if(NOT header_only)
    target_link_libraries(${name} PRIVATE kiln::kernels)
  endif()
  if(TARGET kiln::blas)
    target_link_libraries(${name} PRIVATE kiln::blas)
  endif()
endfunction()

# kiln_precompiled_headers(name [DEFINITIONS def...] HEADERS header...): a precompiled header of kiln's public headers
# (and any others) for kiln's own programs in the compiled mode, built once and reused by kiln_executable(... PRECOMPILED
# name). A program that reuses it sees those headers included before its first line, so it must not define a macro
# that changes them (KILN_DYNAMIC_POLICY): such programs do not take PRECOMPILED. The definitions must be those of the
# programs that reuse it where the headers read them (KILN_SOURCE_DIR in data/find_data.hpp).
function(kiln_precompiled_headers name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DEFINITIONS;HEADERS;LIBRARIES")
  if(NOT KILN_PRECOMPILE_HEADERS)
    return()
  endif()
  set(source ${CMAKE_CURRENT_BINARY_DIR}/${name}.cpp)
  file(CONFIGURE OUTPUT ${source} CONTENT "// Generated: the object of the precompiled header ${name}.\n")
  add_library(${name} OBJECT ${source})
  kiln_program_settings(${name} OFF)
  target_link_libraries(${name} PRIVATE ${arg_LIBRARIES})
  target_compile_definitions(${name} PRIVATE ${arg_DEFINITIONS})
  target_precompile_headers(${name} PRIVATE ${arg_HEADERS})
endfunction()
