# Installs this build into a fresh prefix, then configures, builds and runs examples/consumer
# against it (ctest: consumer_example). CONSUMER_FLAGS: compile and link flags the consumer needs
# (the sanitizer flags when this tree is built with LOCKSTEP_SANITIZE: an instrumented library
# needs an instrumented executable).
set(prefix ${BINARY_DIR}/consumer-install)
file(REMOVE_RECURSE ${prefix} ${BINARY_DIR}/consumer-build)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${BINARY_DIR}/consumer-build
                        -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                        "-DCMAKE_CXX_FLAGS=${CONSUMER_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_FLAGS}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR}/consumer-build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${BINARY_DIR}/consumer-build/consumer cpu RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${BINARY_DIR}/consumer-build/consumer auto RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer (auto) failed: ${rc}")
endif()
