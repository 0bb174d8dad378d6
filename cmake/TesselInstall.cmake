# `cmake --install` lays out include/tessel/<folder>/*.h, the libraries, the tools, and a
# TesselConfig.cmake exporting tessel::<folder> targets for find_package(Tessel).
include(CMakePackageConfigHelpers)

get_property(_libs GLOBAL PROPERTY TESSEL_LIBRARIES)
get_property(_tools GLOBAL PROPERTY TESSEL_TOOLS)
install(TARGETS ${_libs} EXPORT TesselTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(_tools)
  install(TARGETS ${_tools} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Public headers only: internal/ folders (private to their library) and tools/ stay behind.
foreach(folder IN LISTS TESSEL_LIBRARY_FOLDERS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessel/${folder}
          FILES_MATCHING PATTERN "*.h" PATTERN "tools" EXCLUDE PATTERN "internal" EXCLUDE)
endforeach()
if(EXISTS ${CMAKE_BINARY_DIR}/gen/tessel)
  install(DIRECTORY ${CMAKE_BINARY_DIR}/gen/tessel/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessel FILES_MATCHING PATTERN "*.h"
          PATTERN "internal" EXCLUDE)
endif()

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/Tessel)
install(EXPORT TesselTargets NAMESPACE tessel:: DESTINATION ${_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesselConfig.cmake.in
  ${CMAKE_BINARY_DIR}/TesselConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/TesselConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/TesselConfig.cmake ${CMAKE_BINARY_DIR}/TesselConfigVersion.cmake
        DESTINATION ${_cmake_dir})

# The layer graph as declared by the folders' CMakeLists, for tests/layering.
get_property(_layers GLOBAL PROPERTY TESSEL_LAYERS)
string(JOIN "\n" _layers_text ${_layers})
file(WRITE ${CMAKE_BINARY_DIR}/tessel_layers.txt "${_layers_text}\n")
