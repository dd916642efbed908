# Runs COMMAND (a ;-list) and fails unless it exits with EXPECT_RC and its output matches
# EXPECT_REGEX (ctest: a check that a tool reports a failure as a failure, which neither
# PASS_REGULAR_EXPRESSION, blind to the exit code, nor WILL_FAIL, blind to the output, can say).
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match: ${EXPECT_REGEX}")
endif()
