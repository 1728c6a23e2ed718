# The Python client integration test, included from tests/server/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/python.cmake)
# Runs with Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf), not a python3
# earlier on PATH. Exit code 77 = skipped ($ECHOKV_TEST_DATA unset).
find_program(ECHOKV_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT ECHOKV_SYSTEM_PYTHON3)
  message(WARNING "no /usr/bin/python3: python_client_test is not registered")
  return()
endif()
add_test(NAME python_client_test
  COMMAND ${ECHOKV_SYSTEM_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python_client_test.py
          --server-binary $<TARGET_FILE:echokv-server>
          --stubs ${PROJECT_BINARY_DIR}/python
          --client ${PROJECT_SOURCE_DIR}/client/python
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(python_client_test PROPERTIES
  LABELS "integration;model"
  TIMEOUT 300
  SKIP_RETURN_CODE 77)
