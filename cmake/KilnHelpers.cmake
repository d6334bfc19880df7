# kiln_executable(name source...): one of kiln's own programs, with the project's warnings and CPU options.
function(kiln_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE kiln::kiln kiln_project_options)
  if(TARGET kiln::blas)
    target_link_libraries(${name} PRIVATE kiln::blas)
  endif()
endfunction()
