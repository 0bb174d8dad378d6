# Target helpers: one library per folder, tests per file, tools as executables.
include(GoogleTest OPTIONAL)

# Layer dependencies declared here are written to ${CMAKE_BINARY_DIR}/tessel_layers.txt, which
# the layering test compares against the graph of docs/architecture.md.
set_property(GLOBAL PROPERTY TESSEL_LAYERS "")

# tessel_add_library(<folder> [SOURCES ...] [DEPS <tessel folders>...]
#                    [PUBLIC_LIBS ...] [PRIVATE_LIBS ...])
# Makes target tessel_<folder> with alias tessel::<folder>. With no sources it is an INTERFACE
# library (a layer whose code has not landed yet still has its place in the graph).
function(tessel_add_library folder)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  set(target tessel_${folder})
  set(dep_targets "")
  foreach(dep IN LISTS ARG_DEPS)
    list(APPEND dep_targets tessel::${dep})
  endforeach()
  if(ARG_SOURCES)
    add_library(${target} ${ARG_SOURCES})
    target_include_directories(${target} PUBLIC
      $<BUILD_INTERFACE:${TESSEL_BUILD_INCLUDE_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${target} PUBLIC ${dep_targets} ${ARG_PUBLIC_LIBS}
                                    PRIVATE ${ARG_PRIVATE_LIBS})
    set_target_properties(${target} PROPERTIES OUTPUT_NAME tessel_${folder}
                                               EXPORT_NAME ${folder})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE
      $<BUILD_INTERFACE:${TESSEL_BUILD_INCLUDE_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${target} INTERFACE ${dep_targets} ${ARG_PUBLIC_LIBS})
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder})
  endif()
  add_library(tessel::${folder} ALIAS ${target})
  set_property(GLOBAL APPEND PROPERTY TESSEL_LIBRARIES ${target})
  string(JOIN " " deps_line ${ARG_DEPS})
  set_property(GLOBAL APPEND PROPERTY TESSEL_LAYERS "${folder}: ${deps_line}")
endfunction()

# tessel_link_into_bin(<target>): after each link, ${CMAKE_BINARY_DIR}/bin/<name> points at the
# program, so one folder on PATH holds every tool and example (build/<preset>/bin) while the
# program itself stays beside its sources' build folder (the paths tests and scripts use).
function(tessel_link_into_bin target)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/bin
    COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_FILE:${target}>
            ${CMAKE_BINARY_DIR}/bin/$<TARGET_FILE_NAME:${target}>
    VERBATIM)
endfunction()

# tessel_add_tool(<name> SOURCES ... LIBS ...): an installed executable, also linked into
# build/<preset>/bin.
function(tessel_add_tool name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
  set_property(GLOBAL APPEND PROPERTY TESSEL_TOOLS ${name})
  tessel_link_into_bin(${name})
endfunction()

# One precompiled header for every test's C++ sources: GoogleTest, fmt, the standard headers the
# tests use most and tessel/base/error.h (nothing above base, so no test sees a layer it does not
# link). Compiled once for a small executable whose flags are the tests' own (-fPIE, the same
# options), then reused by each test: about a fifth of the tests' compile time, which is half of
# a clean build (docs/architecture.md, "Build time"). -DTESSEL_TEST_PCH=OFF compiles without it.
option(TESSEL_TEST_PCH "Precompile the common headers of the tests" ON)
function(tessel_use_test_pch target)
  if(NOT TESSEL_TEST_PCH)
    return()
  endif()
  if(NOT TARGET tessel_test_pch)
    set(main ${PROJECT_BINARY_DIR}/tessel_test_pch.cc)
    if(NOT EXISTS ${main})
      file(WRITE ${main} "int main() { return 0; }\n")
    endif()
    add_executable(tessel_test_pch EXCLUDE_FROM_ALL ${main})
    target_link_libraries(tessel_test_pch PRIVATE tessel::base GTest::gtest)
    target_precompile_headers(tessel_test_pch PRIVATE
      <gtest/gtest.h> <fmt/format.h> <algorithm> <atomic> <chrono> <cmath> <cstdio> <cstdlib>
      <cstring> <filesystem> <fstream> <functional> <map> <memory> <mutex> <random> <set>
      <sstream> <string> <thread> <vector> [["tessel/base/error.h"]])
  endif()
  # The header's flags and include path come with base (tests of the tree itself link nothing).
  target_link_libraries(${target} PRIVATE tessel::base)
  target_precompile_headers(${target} REUSE_FROM tessel_test_pch)
endfunction()

# tessel_add_test(<name> SOURCES ... [LIBS ...] [LABELS ...] [TIMEOUT seconds] [NO_MAIN]
#                 [RUN_SERIAL])
# One GoogleTest executable; every TEST in it becomes a ctest test with the folder's label
# (the first path component under tests/), the extra LABELS, and a timeout (default 60 s).
# RUN_SERIAL: ctest runs its tests with no other test beside them (for tests that measure
# overlap in time and would read another test's load as their own).
function(tessel_add_test name)
  cmake_parse_arguments(ARG "NO_MAIN;RUN_SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 60)
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/tests ${CMAKE_CURRENT_SOURCE_DIR})
  string(REGEX REPLACE "/.*" "" folder_label "${rel}")
  add_executable(${name} ${ARG_SOURCES})
  tessel_use_test_pch(${name})
  if(ARG_NO_MAIN)
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest)
  else()
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 30
    TEST_LIST ${name}_TESTS
    PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  # Labels are set after discovery by a file ctest reads next: a list value would not survive
  # gtest_discover_tests' own argument parsing.
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  set(serial "")
  if(ARG_RUN_SERIAL)
    set(serial " RUN_SERIAL TRUE")
  endif()
  file(WRITE ${labels_file}
    "if(${name}_TESTS)\n"
    "  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${folder_label};${ARG_LABELS}\"${serial})\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
endfunction()
