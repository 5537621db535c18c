# Every third-party dependency, found once. Versions: Debian 12 (yaml-cpp 0.7, spdlog 1.10, fmt 9) and
# Ubuntu 24.04 (yaml-cpp 0.8, spdlog 1.12); both must keep building.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)

# yaml-cpp 0.7 exports the target `yaml-cpp`, 0.8 `yaml-cpp::yaml-cpp`: give the project one name.
if(TARGET yaml-cpp::yaml-cpp)
  set(DSPARK_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(DSPARK_YAML_TARGET yaml-cpp)
endif()

set(DSPARK_HAVE_CUDA OFF)
set(DSPARK_HAVE_NCCL OFF)
if(NOT DSPARK_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a)
    endif()
    # sm_80 and up: the kernels' tensor-core instructions compile to nothing for older targets.
    foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX MATCH "^[0-9]+" arch_number "${arch}")
      if(arch_number AND arch_number LESS 80)
        message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES ${arch}: the CUDA backend needs sm_80 or later")
      endif()
    endforeach()
    enable_language(CUDA)
    # CMake 3.25 (Debian 12) does not know nvcc's C++20 flag; newer CMake defines these itself.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)  # one cudart for .cu and .cpp targets alike
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(DSPARK_HAVE_CUDA ON)
    # NCCL (dspark_nccl, the tp communicator of the CUDA backend): shipped with the CUDA toolkit here, by
    # libnccl-dev on Ubuntu, or under NCCL_ROOT / NCCL_HOME.
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
      PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
      PATH_SUFFIXES lib lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      add_library(dspark::nccl UNKNOWN IMPORTED)
      set_target_properties(dspark::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
      set(DSPARK_HAVE_NCCL ON)
    else()
      message(WARNING "dspark: NCCL not found (set NCCL_ROOT): dspark_nccl and its tests are not built")
    endif()
  elseif(DSPARK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DSPARK_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "dspark: CUDA backend ${DSPARK_HAVE_CUDA}, NCCL ${DSPARK_HAVE_NCCL}")

# Prometheus metrics (metrics.port: rank 0's /metrics endpoint, lib/serve/prometheus_metrics.cpp): prometheus-cpp's
# core library for the metrics and their text format, libmicrohttpd for the HTTP endpoint (Debian 12:
# prometheus-cpp-dev, libmicrohttpd-dev, from scripts/install_deps.sh). Optional: without them everything else
# builds and the worker refuses a config that sets metrics.port.
find_package(prometheus-cpp CONFIG QUIET)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(DSPARK_MHD QUIET IMPORTED_TARGET libmicrohttpd)
endif()
if(TARGET prometheus-cpp::core AND TARGET PkgConfig::DSPARK_MHD)
  set(DSPARK_HAVE_PROMETHEUS ON)
  message(STATUS "dspark: Prometheus metrics ON (prometheus-cpp, libmicrohttpd ${DSPARK_MHD_VERSION})")
else()
  set(DSPARK_HAVE_PROMETHEUS OFF)
  message(STATUS "dspark: Prometheus metrics OFF: prometheus-cpp or libmicrohttpd not found (Debian: "
                 "prometheus-cpp-dev, libmicrohttpd-dev); the worker refuses metrics.port")
endif()
