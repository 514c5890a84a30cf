#!/usr/bin/env bash
# CI's entry point (.ci/run): install with the test extras, then every test.
set -euo pipefail

usage() {
  cat <<'TXT'
Usage: bash scripts/test.sh [--system] [PYTEST_ARGS...]

Installs ssd with its test extras into the environment of $PYTHON (default: the python
first on PATH) with scripts/install.sh --test; compiles every .cu file with nvcc
(sm_80, sm_90) when nvcc is present, so CUDA code cannot rot on CPU machines; runs
pytest -q PYTEST_ARGS (default: every test under tests/); then the device check's
steps on tiny CPU shapes (scripts/gpu_check.sh --cpu).

  --system    passed to install.sh: install even outside a virtualenv or conda environment
  -h, --help  print this and exit (python -m pytest --help lists PYTEST_ARGS)
TXT
}

INSTALL=(--test) PYTEST=()
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    --system) INSTALL+=(--system) ;;
    *) PYTEST+=("$arg") ;;
  esac
done

cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3 || echo python)}
PYTHON="$PY" bash scripts/install.sh "${INSTALL[@]}"
if command -v nvcc >/dev/null 2>&1; then
  echo "== compiling CUDA kernels (compile-only check) =="
  # The environment's cmake and ninja, as setup.py builds with.
  CMAKE_BIN=$("$PY" -c 'import cmake; print(cmake.CMAKE_BIN_DIR)')
  NINJA=$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')
  "$CMAKE_BIN/cmake" -S . -B build/cuda-check -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" -DSSD_BUILD_PYTHON=OFF \
    -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
  "$CMAKE_BIN/cmake" --build build/cuda-check --target ssd_cuda_check
fi
"$PY" -m pytest -q ${PYTEST[@]+"${PYTEST[@]}"}
echo "== scripts/gpu_check.sh --cpu (the device check's steps on tiny CPU shapes) =="
PYTHON="$PY" bash scripts/gpu_check.sh --cpu
