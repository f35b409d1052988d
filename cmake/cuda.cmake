# CUDA parts (kernels/cuda, docs/cuda.md): TESSERA_CUDA=AUTO|ON|OFF.
#
# AUTO builds them when a CUDA compiler and the CUDA Toolkit (cudart, cuBLAS) are found, ON fails
# configure when they are not, OFF never looks. The CUDA language is enabled here only, after
# check_language(CUDA) found a compiler, so a machine without nvcc configures the CPU build
# unchanged. libtessera never links CUDA: it dlopens libtessera-cuda.so (core/kernel_table.c).

set(TESSERA_CUDA AUTO CACHE STRING "CUDA kernels: AUTO (built when nvcc and the CUDA Toolkit are found), ON or OFF")
set_property(CACHE TESSERA_CUDA PROPERTY STRINGS AUTO ON OFF)
if(NOT TESSERA_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TESSERA_CUDA=${TESSERA_CUDA}: use AUTO, ON or OFF")
endif()

set(TESSERA_CUDA_BUILT 0)
set(TESSERA_CUDA_LIB_DIR ${CMAKE_BINARY_DIR}/lib)
set(tessera_cuda_missing "")

if(NOT TESSERA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(tessera_cuda_missing "no CUDA compiler (nvcc) on PATH or in CUDACXX")
  else()
    # sm_90 code for H100/H200 plus compute_90 PTX that newer GPUs JIT-compile.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cudart)
      set(tessera_cuda_missing "nvcc found (${CMAKE_CUDA_COMPILER}) but not the CUDA Toolkit's cudart and cuBLAS")
    endif()
  endif()
  if(tessera_cuda_missing STREQUAL "")
    set(TESSERA_CUDA_BUILT 1)
  elseif(TESSERA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_CUDA=ON but ${tessera_cuda_missing}. Install the CUDA Toolkit "
                        "(nvcc, cudart, cuBLAS), put its bin/ on PATH or set CUDACXX, or configure "
                        "with -DTESSERA_CUDA=AUTO|OFF")
  endif()
endif()

# The core's loader needs to know whether the library exists and where it lands.
target_compile_definitions(tessera PRIVATE
  TSR_CUDA_BUILT=${TESSERA_CUDA_BUILT}
  TSR_CUDA_BUILD_LIB="${TESSERA_CUDA_LIB_DIR}/libtessera-cuda.so"
  TSR_CUDA_INSTALL_LIB="${CMAKE_INSTALL_FULL_LIBDIR}/libtessera-cuda.so")

if(TESSERA_CUDA_BUILT)
  add_subdirectory(${PROJECT_SOURCE_DIR}/kernels/cuda ${CMAKE_BINARY_DIR}/kernels/cuda)
  message(STATUS "tessera: CUDA kernels enabled (CUDA ${CUDAToolkit_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
elseif(TESSERA_CUDA STREQUAL "OFF")
  message(STATUS "tessera: CUDA kernels disabled by TESSERA_CUDA=OFF; their tests are not registered")
else()
  message(STATUS "tessera: CUDA kernels disabled (${tessera_cuda_missing}); their tests are not registered")
endif()

# Runs in every build: checks that device 'cuda' is refused with the reason when it is absent.
if(TESSERA_TESTS)
  enable_testing()
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/cuda ${CMAKE_BINARY_DIR}/tests/cuda)
endif()

# The GPU training benchmark; it exists only with the CUDA kernels (bench/gpu_check.sh runs it).
if(TESSERA_CUDA_BUILT AND TESSERA_BENCH)
  add_executable(bench_gpu_llama ${PROJECT_SOURCE_DIR}/bench/bench_gpu_llama.c)
  target_link_libraries(bench_gpu_llama PRIVATE tessera-cuda CUDA::cudart m)
  set_target_properties(bench_gpu_llama PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endif()

# The benchmark's step checked on the CPU engine against central differences (runs anywhere),
# and its CUDA engines against the CPU one (skips without a device).
if(TESSERA_CUDA_BUILT AND TESSERA_BENCH AND TESSERA_TESTS)
  add_test(NAME bench_gpu_llama_gradcheck COMMAND bench_gpu_llama --gradcheck)
  set_tests_properties(bench_gpu_llama_gradcheck PROPERTIES LABELS "cuda" TIMEOUT 120)
  add_test(NAME bench_gpu_llama_check COMMAND bench_gpu_llama --check)
  set_tests_properties(bench_gpu_llama_check PROPERTIES LABELS "cuda" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
