# Compiles SOURCE (expected to fail) and checks that the compiler's message matches every regex in PATTERNS
# (separated by '|'s replaced with ';' by the caller). Used to test static-mode shape errors.
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must fail with a static_assert")
endif()
foreach(pattern ${PATTERNS})
  if(NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "compiler message for ${SOURCE} lacks '${pattern}':\n${err}")
  endif()
endforeach()
message(STATUS "${SOURCE} failed to compile as expected, naming: ${PATTERNS}")
