#!/usr/bin/env bash
# Installs ssd (the C++ extension is built by CMake) and its test dependencies.
# Uses the installed torch when there is one (>= 2.11), else the CPU build 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install torch==2.13.0
fi
"$PY" -m pip install "cmake>=3.26" ninja "pybind11>=2.12" "setuptools>=64" wheel
"$PY" -m pip install --no-build-isolation ".[test]"
