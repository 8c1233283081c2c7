# kiln_cc_library(NAME <folder> SRCS ... DEPS ...)
#   One target per folder under src/kiln/, named kiln_<name>, aliased kiln::<name>. DEPS must follow
#   the layer order in DESIGN.md §1 (a layer links only layers above it).
# kiln_cc_test(NAME <name> SRCS ... DEPS ... [LABELS ...])
#   A GoogleTest binary registered with CTest. Label "slow" keeps it out of `make test`.
function(kiln_cc_library)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(kiln_${K_NAME} STATIC ${K_SRCS})
  add_library(kiln::${K_NAME} ALIAS kiln_${K_NAME})
  target_include_directories(kiln_${K_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(kiln_${K_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare)
  target_link_libraries(kiln_${K_NAME} PUBLIC ${K_DEPS})
endfunction()

function(kiln_cc_test)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${K_NAME} ${K_SRCS})
  target_compile_options(${K_NAME} PRIVATE -Wall -Wno-sign-compare)
  target_compile_definitions(${K_NAME} PRIVATE KILN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # Header-only test helpers: #include "tests/support/temp_dir.h".
  target_include_directories(${K_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  add_test(NAME ${K_NAME} COMMAND ${K_NAME})
  if(K_LABELS)
    set_tests_properties(${K_NAME} PROPERTIES LABELS "${K_LABELS}")
  endif()
  set_tests_properties(${K_NAME} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
endfunction()
