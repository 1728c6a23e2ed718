# Tests of the Python client package (client/python/echokv), included from
# tests/client/CMakeLists.txt. They run with Debian's /usr/bin/python3
# (python3-grpcio, python3-protobuf; pip/setuptools/wheel/venv for the install test),
# not a python3 earlier on PATH.
#   python_client_stubs_fresh   the committed stubs equal what protoc generates now
#   python_client_fake_test     the whole client against in-process fake servers
#   python_client_server_test   against the real echokv-server on stories260K
#   python_client_pip_install   offline `pip install` into a fresh venv, then calls
find_program(ECHOKV_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT ECHOKV_SYSTEM_PYTHON3)
  message(WARNING "no /usr/bin/python3: the Python client tests are not registered")
  return()
endif()
find_program(ECHOKV_PROTOC protoc REQUIRED)
find_program(ECHOKV_GRPC_PYTHON_PLUGIN grpc_python_plugin REQUIRED)

set(_py_tests ${CMAKE_CURRENT_SOURCE_DIR}/python)
set(_py_client ${PROJECT_SOURCE_DIR}/client/python)

add_test(NAME python_client_stubs_fresh
  COMMAND ${ECHOKV_SYSTEM_PYTHON3} ${_py_client}/tools/generate_stubs.py --check
          --protoc ${ECHOKV_PROTOC} --plugin ${ECHOKV_GRPC_PYTHON_PLUGIN}
          --proto-root ${PROJECT_SOURCE_DIR}/proto)
set_tests_properties(python_client_stubs_fresh PROPERTIES LABELS "unit" TIMEOUT 60)

add_test(NAME python_client_fake_test
  COMMAND ${ECHOKV_SYSTEM_PYTHON3} ${_py_tests}/client_fake_test.py --client ${_py_client})
set_tests_properties(python_client_fake_test PROPERTIES LABELS "integration" TIMEOUT 300)

add_test(NAME python_client_server_test
  COMMAND ${ECHOKV_SYSTEM_PYTHON3} ${_py_tests}/client_server_test.py
          --server-binary $<TARGET_FILE:echokv-server> --client ${_py_client}
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(python_client_server_test PROPERTIES
  LABELS "integration;model" TIMEOUT 600 SKIP_RETURN_CODE 77)

add_test(NAME python_client_pip_install
  COMMAND ${ECHOKV_SYSTEM_PYTHON3} ${_py_tests}/pip_install_test.py --client ${_py_client})
set_tests_properties(python_client_pip_install PROPERTIES LABELS "integration" TIMEOUT 900)
