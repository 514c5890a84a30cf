# CUDA kernels. Two uses:
#  - ssd_cuda_check: compiles every .cu for sm_80 and sm_90 with nvcc alone
#    (no torch headers), so CUDA code cannot rot on CPU-only machines. Not part
#    of ALL; CI builds it whenever nvcc is present.
#  - SSD_CUDA=on/auto with a CUDA torch: the kernels are linked into the core.
set(SSD_CUDA_ARCHS "80;90" CACHE STRING "GPU architectures of the CUDA kernels (scripts/gpu_check.sh builds 90 only)")
include(CheckLanguage)
check_language(CUDA)
file(GLOB SSD_CUDA_SOURCES CONFIGURE_DEPENDS csrc/kernels/cuda/*.cu)

set(SSD_WITH_CUDA OFF)
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  add_library(ssd_cuda_check OBJECT EXCLUDE_FROM_ALL ${SSD_CUDA_SOURCES})
  set_target_properties(ssd_cuda_check PROPERTIES CUDA_ARCHITECTURES "80;90")
  if(SSD_CUDA STREQUAL "on" OR (SSD_CUDA STREQUAL "auto" AND TORCH_CUDA_LIBRARIES))
    set(SSD_WITH_CUDA ON)
  endif()
elseif(SSD_CUDA STREQUAL "on")
  message(FATAL_ERROR "SSD_CUDA=on but no CUDA compiler (nvcc) was found")
endif()

if(SSD_WITH_CUDA)
  # pip's CUDA torch ships the CUDA library headers (cuSPARSE, cuBLAS, ...) that
  # ATen's CUDA headers include in site-packages/nvidia/<cuXY>/include.
  file(GLOB SSD_PIP_CUDA_INCLUDES "${SSD_TORCH_LIB_DIR}/../../nvidia/cu*/include")
  add_library(ssd_cuda_kernels STATIC ${SSD_CUDA_SOURCES})
  set_target_properties(ssd_cuda_kernels PROPERTIES CUDA_ARCHITECTURES "${SSD_CUDA_ARCHS}")
  target_link_libraries(ssd_core PUBLIC ssd_cuda_kernels)
  target_compile_definitions(ssd_core PUBLIC SSD_WITH_CUDA)
  target_include_directories(ssd_core SYSTEM PUBLIC ${SSD_PIP_CUDA_INCLUDES})
endif()
message(STATUS "ssd: CUDA kernels in the core: ${SSD_WITH_CUDA}")
