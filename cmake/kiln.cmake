# kiln_cc_library(NAME <folder> SRCS ... DEPS ...)
#   One target per folder under src/kiln/, named kiln_<name>, aliased kiln::<name>. DEPS must follow
#   the layer order in DESIGN.md §1 (a layer links only layers above it).
# kiln_cc_test(NAME <name> SRCS ... DEPS ... [LABELS ...] [ISA])
#   A GoogleTest binary registered with CTest. Label "slow" keeps it out of `make test`. ISA: the
#   binary's main caps the CPU ISA level at $KILN_CPU_ISA (tests/support/isa_test_main.cc) and
#   CTest runs it again at every level below the host's (kiln_isa_tests, label "isa").
# kiln_isa_tests(NAME <name> COMMAND ... [ENVIRONMENT ...])
#   <name>_isa_<level> for sse41, avx2 and avx512: COMMAND with KILN_CPU_ISA=<level>, skipped (77)
#   where the host runs at that level or below it (tests/support/isa_check.cc). @ISA@ in COMMAND
#   becomes the level (for output folders of their own).
function(kiln_cc_library)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(kiln_${K_NAME} STATIC ${K_SRCS})
  add_library(kiln::${K_NAME} ALIAS kiln_${K_NAME})
  target_include_directories(kiln_${K_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(kiln_${K_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare)
  target_link_libraries(kiln_${K_NAME} PUBLIC ${K_DEPS})
endfunction()

function(kiln_cc_test)
  cmake_parse_arguments(K "ISA" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  if(K_ISA)
    add_executable(${K_NAME} ${K_SRCS} $<TARGET_OBJECTS:kiln_isa_test_main>)
    target_link_libraries(${K_NAME} PRIVATE kiln::base)
  else()
    add_executable(${K_NAME} ${K_SRCS})
    target_link_libraries(${K_NAME} PRIVATE GTest::gtest_main)
  endif()
  target_compile_options(${K_NAME} PRIVATE -Wall -Wno-sign-compare)
  target_compile_definitions(${K_NAME} PRIVATE KILN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # Header-only test helpers: #include "tests/support/temp_dir.h".
  target_include_directories(${K_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} GTest::gtest GTest::gmock)
  add_test(NAME ${K_NAME} COMMAND ${K_NAME})
  if(K_LABELS)
    set_tests_properties(${K_NAME} PROPERTIES LABELS "${K_LABELS}")
  endif()
  set_tests_properties(${K_NAME} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
  if(K_ISA)
    set_tests_properties(${K_NAME} PROPERTIES SKIP_RETURN_CODE 77)
    kiln_isa_tests(NAME ${K_NAME} COMMAND $<TARGET_FILE:${K_NAME}>
      ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
  endif()
endfunction()

# The levels below the top ones that CPUs of users run (base/cpu_isa.h); the native run covers
# the host's own level.
set(KILN_TEST_ISAS sse41 avx2 avx512)
function(kiln_isa_tests)
  cmake_parse_arguments(K "" "NAME" "COMMAND;ENVIRONMENT;LABELS" ${ARGN})
  foreach(isa ${KILN_TEST_ISAS})
    string(REPLACE "@ISA@" "${isa}" command "${K_COMMAND}")
    add_test(NAME ${K_NAME}_isa_${isa}
      COMMAND sh -c "\"$0\" ${isa} || exit $?; exec \"$@\"" $<TARGET_FILE:kiln_isa_check>
              ${command})
    set_tests_properties(${K_NAME}_isa_${isa} PROPERTIES
      ENVIRONMENT "${K_ENVIRONMENT};KILN_CPU_ISA=${isa}" LABELS "isa;${K_LABELS}"
      SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
