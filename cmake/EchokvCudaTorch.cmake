# find_package(Torch) for the CUDA build (ECHOKV_CUDA=ON): LibTorch 2.11 with CUDA from
# PyPI's torch wheel (scripts/setup.sh --cuda installs it into .cache/torch-cu130; the
# GPU machine has its own in site-packages), with the local CUDA toolkit's nvcc.
#
#   cmake -S . -B build-cuda -G Ninja -DECHOKV_CUDA=ON \
#     -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
#
# What it sorts out (each measured against the wheel's config, docs/ARCHITECTURE.md):
#  - The wheel's TorchConfig finds torch/c10 with find_library(... PATHS wheel), which
#    searches the system first: on a machine with Debian's libtorch-dev it would mix
#    Debian's 1.13 libc10.so into a 2.11 build. The libraries are set to the wheel's.
#  - Caffe2's cuda.cmake ignores (and warns about) CMAKE_CUDA_ARCHITECTURES and adds its
#    own -gencode flags (TORCH_CUDA_ARCH_LIST) to every CUDA file. Our .cu files include
#    no torch header and need none of Caffe2's CUDA flags: they are restored after
#    find_package and the architectures are set per target (echokv_cuda_library), with
#    policy CMP0104 OLD so that CMake leaves CMAKE_CUDA_ARCHITECTURES undefined.
#  - The CUDA runtime is linked shared: the one libcudart.so that LibTorch uses.
cmake_policy(SET CMP0104 OLD)
# Caffe2's cuda.cmake still calls the FindCUDA module, which CMake 3.27+ (the GPU
# machine's pip cmake) keeps only under CMP0146's OLD behaviour.
if(POLICY CMP0146)
  cmake_policy(SET CMP0146 OLD)
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  # Caffe2 would otherwise try to detect a GPU at configure time (CI has none).
  set(TORCH_CUDA_ARCH_LIST "9.0a")
endif()
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(CCACHE_PROGRAM)
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
endif()

if(NOT Torch_DIR)
  find_path(_echokv_torch_config TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH}
            PATH_SUFFIXES Torch share/cmake/Torch NO_DEFAULT_PATH NO_CACHE)
  if(NOT _echokv_torch_config)
    message(FATAL_ERROR "ECHOKV_CUDA: no TorchConfig.cmake under CMAKE_PREFIX_PATH='${CMAKE_PREFIX_PATH}': "
                        "give the wheel's torch/share/cmake (scripts/setup.sh --cuda does)")
  endif()
  set(Torch_DIR "${_echokv_torch_config}" CACHE PATH "The CUDA LibTorch's cmake folder" FORCE)
endif()
get_filename_component(ECHOKV_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
foreach(lib torch c10 c10_cuda)
  if(NOT EXISTS "${ECHOKV_TORCH_PREFIX}/lib/lib${lib}.so")
    message(FATAL_ERROR "ECHOKV_CUDA: ${ECHOKV_TORCH_PREFIX}/lib/lib${lib}.so is missing: not a CUDA LibTorch")
  endif()
endforeach()
set(TORCH_LIBRARY "${ECHOKV_TORCH_PREFIX}/lib/libtorch.so" CACHE FILEPATH "" FORCE)
set(c10_LIBRARY "${ECHOKV_TORCH_PREFIX}/lib/libc10.so" CACHE FILEPATH "" FORCE)
set(C10_CUDA_LIBRARY "${ECHOKV_TORCH_PREFIX}/lib/libc10_cuda.so" CACHE FILEPATH "" FORCE)
set(Caffe2_DIR "${ECHOKV_TORCH_PREFIX}/share/cmake/Caffe2" CACHE PATH "" FORCE)
# The wheel links Kineto (the profiler) into libtorch_cpu; TorchConfig looks for a
# separate libkineto and warns. Pointing it at libtorch_cpu names a library already
# linked.
set(kineto_LIBRARY "${ECHOKV_TORCH_PREFIX}/lib/libtorch_cpu.so" CACHE FILEPATH "" FORCE)

# Debian's protobuf (gRPC's and our generated code's), found first and at the top level
# as Debian's LibTorch config does: the wheel's Caffe2 config otherwise defines
# protobuf::libprotobuf as an empty alias (the wheel's own protobuf is internal to
# libtorch_cpu, its symbols hidden), and every later find_package(Protobuf) keeps it.
find_package(Protobuf REQUIRED)

set(_echokv_cuda_flags "${CMAKE_CUDA_FLAGS}")
find_package(Torch REQUIRED CONFIG NO_DEFAULT_PATH PATHS "${Torch_DIR}")
set(CMAKE_CUDA_FLAGS "${_echokv_cuda_flags}")
if(NOT TARGET torch_cuda)
  message(FATAL_ERROR "ECHOKV_CUDA: ${ECHOKV_TORCH_PREFIX} is a LibTorch without CUDA")
endif()
find_package(CUDAToolkit REQUIRED)
if(Torch_VERSION VERSION_LESS 2.5)
  message(FATAL_ERROR "ECHOKV_CUDA needs LibTorch >= 2.5 (scaled_dot_product_attention's enable_gqa), found ${Torch_VERSION}")
endif()
message(STATUS "echokv: CUDA build against LibTorch ${Torch_VERSION} at ${ECHOKV_TORCH_PREFIX}, "
               "nvcc ${CMAKE_CUDA_COMPILER_VERSION}, kernels for ${ECHOKV_CUDA_ARCHITECTURES}")

# OpenMP: the wheel ships its own libgomp.so.1 (GOMP_5.0 at most; GCC 12's has 5.1) and
# LibTorch's RPATH makes every binary load that one. Our `omp parallel` code links
# against it too, so the linker checks our symbol versions against the library that
# runs (and CMake sees one libgomp, not two that could hide each other).
if(NOT EXISTS "${ECHOKV_TORCH_PREFIX}/lib/libgomp.so.1")
  message(FATAL_ERROR "ECHOKV_CUDA: ${ECHOKV_TORCH_PREFIX}/lib/libgomp.so.1 is missing")
endif()
# FindOpenMP takes the library it links from this cache entry (every find_package(OpenMP)
# of the subfolders then agrees).
set(OpenMP_gomp_LIBRARY "${ECHOKV_TORCH_PREFIX}/lib/libgomp.so.1" CACHE FILEPATH "" FORCE)
find_package(OpenMP REQUIRED)

# The wheel's include folder also carries third-party headers LibTorch was built with,
# among them protobuf 3.13's google/protobuf, which would shadow Debian's protobuf 3.21
# that gRPC and our generated code need. Every target sees the wheel's headers through a
# folder of links to its entries without google/ instead.
set(ECHOKV_TORCH_INCLUDE "${CMAKE_BINARY_DIR}/torch-include")
file(MAKE_DIRECTORY "${ECHOKV_TORCH_INCLUDE}")
file(GLOB _echokv_torch_entries RELATIVE "${ECHOKV_TORCH_PREFIX}/include" "${ECHOKV_TORCH_PREFIX}/include/*")
foreach(entry IN LISTS _echokv_torch_entries)
  if(NOT entry STREQUAL "google" AND NOT EXISTS "${ECHOKV_TORCH_INCLUDE}/${entry}")
    file(CREATE_LINK "${ECHOKV_TORCH_PREFIX}/include/${entry}" "${ECHOKV_TORCH_INCLUDE}/${entry}" SYMBOLIC)
  endif()
endforeach()
set(TORCH_INCLUDE_DIRS "${ECHOKV_TORCH_INCLUDE}" "${ECHOKV_TORCH_INCLUDE}/torch/csrc/api/include")
foreach(target c10 c10_cuda torch_cpu torch_cuda torch)
  if(TARGET ${target})
    set_property(TARGET ${target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}")
  endif()
endforeach()

# The wheel's libtorch.so, libtorch_cpu.so and libc10.so export their own copies of
# libstdc++'s std::filesystem (linked in statically by PyTorch's toolchain), which would
# win over libstdc++.so for our calls too: std::filesystem::remove_all jumped to a null
# address from model_config_test. libstdc++ is made the first library every binary
# needs, so the dynamic linker finds its definitions first.
add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")
