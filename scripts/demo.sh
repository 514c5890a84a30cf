#!/usr/bin/env bash
# Installs ssd and generates text with SmolLM2-135M-Instruct for a few prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
${PYTHON:-python} -m ssd "$@"
