#!/usr/bin/env bash
# Installs ssd into one Python environment, building its C++ extension there.
set -euo pipefail

usage() {
  cat <<'TXT'
Usage: bash scripts/install.sh [--test] [--system]

Installs ssd into the environment of $PYTHON (default: the python first on PATH),
its C++ extension built by CMake against that environment's torch (about 12 minutes
on 2 cores; later builds in the same environment are incremental).

  --test      also install the test extras (pytest, transformers, scipy, ...: about 1.7 GB)
  --system    install even though that Python is not a virtualenv's or a conda environment's
  -h, --help  print this and exit

Steps: a torch >= 2.11 already there is kept; without one, torch 2.13.0's CPU build
is installed: plainly when pip's configured index serves a +cpu build of it (a local
wheel index, say), else from PyTorch's CPU index ($SSD_TORCH_INDEX, default
https://download.pytorch.org/whl/cpu). Then cmake >= 3.26, ninja, pybind11,
setuptools and wheel, and `pip install --no-build-isolation .` (or `.[test]`).
TXT
}

TEST=0 SYSTEM=0
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    --test) TEST=1 ;;
    --system) SYSTEM=1 ;;
    *) echo "install.sh: unknown option $arg (bash scripts/install.sh --help lists them)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3 || echo python)}
TORCH=torch==2.13.0
TORCH_INDEX=${SSD_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

if [ $SYSTEM -eq 0 ] && ! "$PY" -c 'import os, sys
sys.exit(sys.prefix == sys.base_prefix and not os.path.isdir(os.path.join(sys.prefix, "conda-meta")))'; then
  echo "install.sh: $PY is not in a virtualenv or conda environment: create one" \
       "(python -m venv .venv && . .venv/bin/activate) or pass --system to install there anyway" >&2
  exit 1
fi

HAVE=$("$PY" -c 'import importlib.metadata as m
try: print(m.version("torch"))
except m.PackageNotFoundError: pass')
if [ -n "$HAVE" ]; then
  if ! "$PY" -c "import sys; sys.exit(tuple(map(int, '$HAVE'.split('+')[0].split('.')[:2])) < (2, 11))"; then
    echo "install.sh: this environment has torch $HAVE, ssd needs >= 2.11" >&2
    exit 1
  fi
  echo "install.sh: keeping torch $HAVE"
else
  # What the plain requirement resolves to, without installing it.
  OFFERED=$("$PY" -m pip install --dry-run --no-deps --quiet --report - "$TORCH" 2>/dev/null |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' 2>/dev/null || true)
  if [[ $OFFERED == *+cpu ]]; then
    "$PY" -m pip install "$TORCH"
  else
    "$PY" -m pip install "$TORCH" --index-url "$TORCH_INDEX"
  fi
fi
"$PY" -m pip install "cmake>=3.26" ninja "pybind11>=2.12" "setuptools>=64" wheel
if [ $TEST -eq 1 ]; then
  "$PY" -m pip install --no-build-isolation ".[test]"
else
  "$PY" -m pip install --no-build-isolation .
fi
