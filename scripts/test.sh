#!/usr/bin/env bash
# Installs ssd and runs every test. Also compiles every .cu file with nvcc
# (sm_80, sm_90) when nvcc is present, so CUDA code cannot rot on CPU machines,
# and runs the device check's steps on the CPU (scripts/gpu_check.sh --cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
bash scripts/install.sh
if command -v nvcc >/dev/null 2>&1; then
  echo "== compiling CUDA kernels (compile-only check) =="
  cmake -S . -B build/cuda-check -G Ninja -DSSD_BUILD_PYTHON=OFF -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
  cmake --build build/cuda-check --target ssd_cuda_check
fi
"$PY" -m pytest -q "$@"
echo "== scripts/gpu_check.sh --cpu (the device check's steps on tiny CPU shapes) =="
PYTHON="$PY" bash scripts/gpu_check.sh --cpu
