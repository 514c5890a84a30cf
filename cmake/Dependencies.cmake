# Torch (C++ API) and pybind11: always those of Python_EXECUTABLE (setup.py passes
# sys.executable, the Python of the environment being installed into), never others
# CMake could find on its own.
find_package(Threads REQUIRED)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)

execute_process(
  COMMAND ${Python_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE SSD_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
# Torch_DIR, once cached, is where find_package looks: a cache from another
# environment would build against its torch.
if(Torch_DIR)
  file(REAL_PATH "${Torch_DIR}" SSD_CACHED_TORCH_DIR)
  file(REAL_PATH "${SSD_TORCH_PREFIX}/Torch" SSD_PYTHON_TORCH_DIR)
  if(NOT SSD_CACHED_TORCH_DIR STREQUAL SSD_PYTHON_TORCH_DIR)
    message(FATAL_ERROR "Torch_DIR (${Torch_DIR}) is not the torch of ${Python_EXECUTABLE} "
                        "(${SSD_TORCH_PREFIX}/Torch): configure this build folder afresh (cmake --fresh)")
  endif()
endif()
find_package(Torch REQUIRED PATHS "${SSD_TORCH_PREFIX}" NO_DEFAULT_PATH)
message(STATUS "ssd: torch ${Torch_VERSION} from ${Torch_DIR}")

get_filename_component(SSD_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${SSD_TORCH_LIB_DIR}" NO_DEFAULT_PATH NO_CACHE REQUIRED)

if(SSD_BUILD_PYTHON)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
    OUTPUT_VARIABLE SSD_PYBIND11_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  find_package(pybind11 CONFIG REQUIRED PATHS "${SSD_PYBIND11_DIR}" NO_DEFAULT_PATH)
endif()
