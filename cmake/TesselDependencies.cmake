# Optional dependencies. Each TESSEL_WITH_<X> is AUTO (use it when found), ON (required: fail
# when missing) or OFF. A build with all of them OFF is a first-class build: backend folders
# compile a stub instead and report is_available() == false at run time.
include(CMakeDependentOption)

set(_tessel_optional CUDA NCCL CUDNN MPI GRPC GLOO)
foreach(dep IN LISTS _tessel_optional)
  set(TESSEL_WITH_${dep} AUTO CACHE STRING "Build with ${dep}: AUTO, ON or OFF")
  set_property(CACHE TESSEL_WITH_${dep} PROPERTY STRINGS AUTO ON OFF)
endforeach()

# tessel_resolve_dependency(NAME FOUND_VAR) sets TESSEL_HAVE_<NAME> from the option and
# whether the dependency was found; ON without the dependency is a configure error.
function(tessel_resolve_dependency name found)
  set(mode ${TESSEL_WITH_${name}})
  if(mode STREQUAL "OFF")
    set(have OFF)
  elseif(${found})
    set(have ON)
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "TESSEL_WITH_${name}=ON but ${name} was not found; "
                        "run scripts/setup.sh or pass -DTESSEL_WITH_${name}=OFF")
  else()
    set(have OFF)
  endif()
  set(TESSEL_HAVE_${name} ${have} PARENT_SCOPE)
endfunction()

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)

# --- CUDA toolkit: nvcc, cudart, cuBLAS/cuBLASLt --------------------------------------------
set(_cuda_found OFF)
if(NOT TESSEL_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (sm_90a, for wgmma/TMA kernels) and Ampere (sm_80) unless told otherwise.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES 80 90a)
    endif()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 support; tell it the flag (nvcc >= 12 accepts it).
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(_cuda_found ON)
    endif()
  endif()
endif()
tessel_resolve_dependency(CUDA _cuda_found)

# --- NCCL and cuDNN (ship with the toolkit here; plain libraries elsewhere) ------------------
set(_nccl_found OFF)
set(_cudnn_found OFF)
if(TESSEL_HAVE_CUDA)
  find_path(TESSEL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include)
  find_library(TESSEL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib)
  if(TESSEL_NCCL_INCLUDE_DIR AND TESSEL_NCCL_LIBRARY)
    set(_nccl_found ON)
    add_library(tessel_nccl_dep INTERFACE IMPORTED)
    target_include_directories(tessel_nccl_dep INTERFACE ${TESSEL_NCCL_INCLUDE_DIR})
    target_link_libraries(tessel_nccl_dep INTERFACE ${TESSEL_NCCL_LIBRARY})
  endif()
  find_path(TESSEL_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(TESSEL_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(TESSEL_CUDNN_INCLUDE_DIR AND TESSEL_CUDNN_LIBRARY)
    set(_cudnn_found ON)
    add_library(tessel_cudnn_dep INTERFACE IMPORTED)
    target_include_directories(tessel_cudnn_dep INTERFACE ${TESSEL_CUDNN_INCLUDE_DIR})
    target_link_libraries(tessel_cudnn_dep INTERFACE ${TESSEL_CUDNN_LIBRARY})
  endif()
endif()
tessel_resolve_dependency(NCCL _nccl_found)
tessel_resolve_dependency(CUDNN _cudnn_found)

# --- cudnn-frontend (header-only C++ Graph API over cuDNN; scripts/setup.sh unpacks it) ------
# Needed by the cuDNN attention backend; without it that backend is a stub.
set(TESSEL_HAVE_CUDNN_FRONTEND OFF)
if(TESSEL_HAVE_CUDNN)
  set(TESSEL_CUDNN_FRONTEND_DIR "${PROJECT_SOURCE_DIR}/.cache/deps/cudnn-frontend" CACHE PATH
      "Where scripts/setup.sh unpacked cudnn-frontend (its include/ holds cudnn_frontend.h)")
  find_path(TESSEL_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS ${TESSEL_CUDNN_FRONTEND_DIR}/include $ENV{TESSEL_CUDNN_FRONTEND_DIR}/include
            NO_DEFAULT_PATH)
  if(TESSEL_CUDNN_FRONTEND_INCLUDE_DIR)
    set(TESSEL_HAVE_CUDNN_FRONTEND ON)
    add_library(tessel_cudnn_frontend_dep INTERFACE IMPORTED)
    target_include_directories(tessel_cudnn_frontend_dep SYSTEM INTERFACE
                               ${TESSEL_CUDNN_FRONTEND_INCLUDE_DIR})
    # cudnn-frontend's experimental engines call NVRTC (linked, not dlopen'ed).
    target_link_libraries(tessel_cudnn_frontend_dep INTERFACE tessel_cudnn_dep CUDA::cudart
                                                              CUDA::nvrtc)
  elseif(TESSEL_WITH_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "TESSEL_WITH_CUDNN=ON but cudnn-frontend was not found in "
                        "${TESSEL_CUDNN_FRONTEND_DIR}; run scripts/setup.sh")
  endif()
endif()

# --- Open MPI ---------------------------------------------------------------------------------
set(_mpi_found OFF)
if(NOT TESSEL_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(_mpi_found ON)
  endif()
endif()
tessel_resolve_dependency(MPI _mpi_found)

# --- gRPC + protobuf (store, rendezvous) --------------------------------------------------------
set(_grpc_found OFF)
if(NOT TESSEL_WITH_GRPC STREQUAL "OFF")
  find_package(Protobuf QUIET)
  find_package(gRPC CONFIG QUIET)
  find_program(TESSEL_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  if(Protobuf_FOUND AND gRPC_FOUND AND TESSEL_GRPC_CPP_PLUGIN)
    set(_grpc_found ON)
  endif()
endif()
tessel_resolve_dependency(GRPC _grpc_found)

# --- Gloo (CPU collectives over TCP) ------------------------------------------------------------
set(_gloo_found OFF)
if(NOT TESSEL_WITH_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  find_library(TESSEL_GLOO_LIBRARY gloo)
  if(Gloo_FOUND AND TESSEL_GLOO_LIBRARY)
    set(_gloo_found ON)
  endif()
endif()
tessel_resolve_dependency(GLOO _gloo_found)

function(tessel_print_summary)
  message(STATUS "tessel ${PROJECT_VERSION} (${CMAKE_BUILD_TYPE})")
  foreach(dep IN LISTS _tessel_optional)
    message(STATUS "  ${dep}: ${TESSEL_HAVE_${dep}} (TESSEL_WITH_${dep}=${TESSEL_WITH_${dep}})")
  endforeach()
  if(TESSEL_HAVE_CUDA)
    message(STATUS "  CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  if(TESSEL_HAVE_CUDNN)
    message(STATUS "  cudnn-frontend: ${TESSEL_HAVE_CUDNN_FRONTEND} (${TESSEL_CUDNN_FRONTEND_DIR})")
  endif()
endfunction()
