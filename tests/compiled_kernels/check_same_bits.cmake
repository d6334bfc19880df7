# Runs the header-only and the compiled-kernels builds of training_bits.cpp (HEADER_ONLY, COMPILED) and requires the
# same output, bit for bit.
foreach(build HEADER_ONLY COMPILED)
  execute_process(COMMAND ${${build}} RESULT_VARIABLE r OUTPUT_VARIABLE out_${build} ERROR_VARIABLE err)
  if(NOT r EQUAL 0)
    message(FATAL_ERROR "${${build}} failed (${r}):\n${out_${build}}\n${err}")
  endif()
endforeach()
message(STATUS "header-only:\n${out_HEADER_ONLY}")
if(NOT out_HEADER_ONLY STREQUAL out_COMPILED)
  message(FATAL_ERROR "the two builds trained differently.\nheader-only:\n${out_HEADER_ONLY}\ncompiled kernels:\n"
                      "${out_COMPILED}")
endif()
message(STATUS "the same bits in both builds")
