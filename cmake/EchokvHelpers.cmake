# Helpers shared by every folder's CMakeLists.txt.

# echokv_library(NAME <name> SRCS ... DEPS ... [PRIVATE_DEPS ...])
# Builds library echokv_<name> with alias echokv::<name>; the repo root is the include root.
function(echokv_library)
  cmake_parse_arguments(L "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(echokv_${L_NAME} ${L_SRCS})
  add_library(echokv::${L_NAME} ALIAS echokv_${L_NAME})
  target_include_directories(echokv_${L_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(echokv_${L_NAME} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  target_compile_options(echokv_${L_NAME} PRIVATE ${ECHOKV_WARNINGS})
endfunction()

# echokv_cc_binary(NAME <name> SRCS ... DEPS ...): an executable in build/bin.
function(echokv_cc_binary)
  cmake_parse_arguments(B "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${B_NAME} ${B_SRCS})
  target_include_directories(${B_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${B_NAME} PRIVATE ${B_DEPS})
  target_compile_options(${B_NAME} PRIVATE ${ECHOKV_WARNINGS})
endfunction()

# echokv_cc_test(NAME <name> SRCS ... DEPS ... LABELS ... [TIMEOUT s])
# A GoogleTest binary registered with ctest under the given labels
# (unit, integration, model, slow, cuda). Tests needing real data read
# $ECHOKV_TEST_DATA and GTEST_SKIP() with a clear message when it is unset.
# The verdict is the exit code of tests/testing/gtest_main.cc alone: 0 passed, 77
# skipped (nothing failed, something skipped, each reason printed), anything else failed.
set(ECHOKV_TEST_SKIP_RETURN_CODE 77)
function(echokv_cc_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} echokv::testing GTest::gtest GTest::gmock echokv_gtest_main)
  target_compile_options(${T_NAME} PRIVATE ${ECHOKV_WARNINGS})
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  # A skipped case makes the binary report "skipped", never "passed"; a failed case
  # makes it "failed" whatever was skipped beside it (tests/testing/harness_test.sh).
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       SKIP_RETURN_CODE ${ECHOKV_TEST_SKIP_RETURN_CODE})
endfunction()
