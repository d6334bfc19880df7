# kiln_executable(name [HEADER_ONLY] source...): one of kiln's own programs, with the project's warnings and CPU
# options. It links kiln::kernels (the compiled mode) unless HEADER_ONLY is given: those programs compile every kernel
# themselves, as a program that only adds include/ to its path does, and keep the header-only mode tested.
function(kiln_executable name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "HEADER_ONLY" "" "")
  add_executable(${name} ${arg_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE kiln::kiln kiln_project_options)
  if(NOT arg_HEADER_ONLY)
    target_link_libraries(${name} PRIVATE kiln::kernels)
  endif()
  if(TARGET kiln::blas)
    target_link_libraries(${name} PRIVATE kiln::blas)
  endif()
endfunction()
