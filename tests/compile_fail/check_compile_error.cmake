# Compiles SOURCE (expected to fail) and checks that the compiler's message matches every regex in PATTERNS
# (separated by '|'s replaced with ';' by the caller). Used to test static-mode shape errors. FLAGS (a list) replaces
# the default -std=c++20 -fsyntax-only, for nvcc, which has no syntax-only mode.
if(NOT DEFINED FLAGS)
  set(FLAGS -std=c++20 -fsyntax-only)
endif()
execute_process(COMMAND ${CXX} ${FLAGS} -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(APPEND err "${out}")  # nvcc prints its front end's errors on standard output
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must fail with a static_assert")
endif()
foreach(pattern ${PATTERNS})
  if(NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "compiler message for ${SOURCE} lacks '${pattern}':\n${err}")
  endif()
endforeach()
message(STATUS "${SOURCE} failed to compile as expected, naming: ${PATTERNS}")
