# Torch (C++ API) and pybind11, located through the Python that builds us.
find_package(Threads REQUIRED)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)

if(NOT Torch_DIR)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE SSD_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  list(APPEND CMAKE_PREFIX_PATH ${SSD_TORCH_PREFIX})
endif()
find_package(Torch REQUIRED)

get_filename_component(SSD_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${SSD_TORCH_LIB_DIR}" REQUIRED)

if(SSD_BUILD_PYTHON AND NOT pybind11_DIR)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
    OUTPUT_VARIABLE pybind11_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
endif()
if(SSD_BUILD_PYTHON)
  find_package(pybind11 CONFIG REQUIRED)
endif()
