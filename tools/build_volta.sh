#!/usr/bin/env bash
# The Volta build (V100, sm_70): the same sources as the default build, compiled with CUDA 12.9 for
# sm_70 plus compute_70 PTX (CUDA 13 cannot target sm_70). NVIDIA's CUDA 12 wheels on PyPI carry the
# headers, runtime, ptxas and libdevice but no nvcc, so clang 19 compiles the CUDA code against a
# CUDA tree assembled from them in BUILD/cuda-12.9 (once; ~50 MB of downloads).
#   tools/build_volta.sh              ferry and ferry_gpu_tests in build-volta/, bundled into dist/volta
#                                     (tools/gpu_bundle.sh: copy it to the GPU host, run run-gpu-tests.sh)
#   tools/build_volta.sh TARGET...    only these targets, no bundle (tools/test.sh: ferry ferry_gpu_tests)
# FERRY_VOLTA_DIR sets the build folder; FERRY_CMAKE_ARGS adds configure arguments. Needs clang-19 and
# the packages tools/setup.sh installs. cuBLAS is not needed to build: ferry loads libcublas.so.12 at
# run time (README, "Volta").
set -euo pipefail
cd "$(dirname "$0")/.."

build=${FERRY_VOLTA_DIR:-build-volta}
cuda=$build/cuda-12.9
for tool in clang-19 clang++-19 python3; do
  command -v $tool >/dev/null || { echo "build_volta: needs $tool (tools/setup.sh installs it)" >&2; exit 2; }
done

wheels=(nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27
  nvidia-nvfatbin-cu12==12.9.82)
if [ "$(cat "$cuda/wheels.txt" 2>/dev/null)" != "${wheels[*]}" ]; then
  echo "build_volta: assembling the CUDA 12.9 tree in $cuda"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$build/wheels" "${wheels[@]}"
  stage=$build/wheels/unpacked
  rm -rf "$stage" "$cuda"
  for spec in "${wheels[@]}"; do
    name=${spec%%==*}
    python3 -m zipfile -e "$build/wheels/${name//-/_}-${spec##*==}"-*.whl "$stage"
  done
  n=$stage/nvidia
  mkdir -p "$cuda/bin" "$cuda/include" "$cuda/lib64" "$cuda/nvvm"
  cp -r "$n/cuda_runtime/include/." "$n/cuda_nvcc/include/." "$n/nvfatbin/include/." "$cuda/include/"
  cp -r "$n/cuda_cccl/include/cub" "$n/cuda_cccl/include/cuda" "$n/cuda_cccl/include/nv" "$n/cuda_cccl/include/thrust" \
    "$cuda/include/"
  find "$cuda/include" \( -name __init__.py -o -name __pycache__ \) -prune -exec rm -rf {} +
  cp -r "$n/cuda_nvcc/nvvm/libdevice" "$cuda/nvvm/"
  cp "$n/cuda_runtime/lib/libcudart.so.12" "$n/nvfatbin/lib/libnvfatbin.so.12" "$cuda/lib64/"
  install -m 755 "$n/cuda_nvcc/bin/ptxas" "$cuda/bin/ptxas"  # zip extraction drops the execute bit
  # clang packs each object's cubin and PTX with `fatbinary`, which the wheels lack: tools/fatbinary.cpp.
  c++ -std=c++17 -O2 -Wall -Wextra $([ "${CI:-}" = true ] && echo -Werror) -I"$cuda/include" tools/fatbinary.cpp \
    "$cuda/lib64/libnvfatbin.so.12" -Wl,-rpath,'$ORIGIN/../lib64' -o "$cuda/bin/fatbinary"
  rm -rf "$stage"
  echo "${wheels[*]}" >"$cuda/wheels.txt"
fi

cmake_args=(-G Ninja -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_CUDA_ARCHITECTURES=70
  "-DFERRY_CLANG_CUDA_PATH=$(cd "$cuda" && pwd)")
if [ "${CI:-}" = "true" ]; then
  cmake_args+=(-DFERRY_WERROR=ON)
fi
# A full Volta build takes most of an hour on two cores: with ccache a rebuild compiles what changed.
if command -v ccache >/dev/null; then
  cmake_args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" "${cmake_args[@]}" ${FERRY_CMAKE_ARGS:-} >"$build/configure.log" ||
  { cat "$build/configure.log"; exit 1; }

if [ $# -gt 0 ]; then
  cmake --build "$build" --target "$@"
else
  cmake --build "$build" --target ferry ferry_gpu_tests
  tools/gpu_bundle.sh "$build" volta
fi
