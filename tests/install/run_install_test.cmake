# cmake -P script for install.find_package_consumer (see CMakeLists.txt beside it).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(required lib/cmake/Tessel/TesselConfig.cmake include/tessel/base/error.h)
  if(NOT EXISTS ${prefix}/${required})
    message(FATAL_ERROR "install did not produce ${required}")
  endif()
endforeach()

# Public headers only: no library's internal/ folder is installed.
file(GLOB_RECURSE internal_headers LIST_DIRECTORIES false ${prefix}/include/tessel/*/internal/*)
if(internal_headers)
  message(FATAL_ERROR "install shipped private headers: ${internal_headers}")
endif()

# One definition per class: no tessel class's type information is exported by two libraries
# (two different classes with one name in two libraries broke this once).
find_program(NM nm)
if(NM)
  file(GLOB libs ${prefix}/lib/libtessel_*.so)
  set(owners "")
  foreach(lib IN LISTS libs)
    execute_process(COMMAND ${NM} -DC --defined-only ${lib} OUTPUT_VARIABLE symbols
                    RESULT_VARIABLE nm_rc)
    if(NOT nm_rc EQUAL 0)
      message(FATAL_ERROR "nm failed on ${lib}")
    endif()
    get_filename_component(lib_name ${lib} NAME)
    string(REGEX MATCHALL "typeinfo for tessel::[^\n]*" infos "${symbols}")
    list(REMOVE_DUPLICATES infos)
    foreach(info IN LISTS infos)
      string(MD5 key "${info}")
      if(DEFINED owner_${key})
        message(FATAL_ERROR "'${info}' is exported by ${owner_${key}} and ${lib_name}")
      endif()
      set(owner_${key} ${lib_name})
    endforeach()
  endforeach()
else()
  message("nm not found: the typeinfo check is skipped")
endif()

run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
message("${last_output}")
