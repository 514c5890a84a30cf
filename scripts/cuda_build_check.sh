#!/usr/bin/env bash
# Builds the extension against a CUDA torch on a machine WITHOUT a GPU, to prove
# the CUDA glue (csrc/bindings/*_cuda.cpp) and the cuda model backend
# (csrc/model/backend_cuda.cpp) compile and link, that every torch.ops.ssd op
# registers a CUDA kernel and that the build offers the cuda backend. Heavy
# (installs torch 2.14.1+cu130, ~5.4 GB, from the local wheel cache), so it is
# not part of CI; CI compiles the .cu files only.
# Usage: bash scripts/cuda_build_check.sh [VENV_DIR]   (default build/venv-cuda)
#        bash scripts/cuda_build_check.sh -h|--help  (print this header and exit)
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  -*) echo "cuda_build_check.sh: unknown option $1 (bash scripts/cuda_build_check.sh --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
VENV=$(realpath -m "${1:-build/venv-cuda}")  # absolute: CMake must not resolve the venv python to its base
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.14.1 pybind11 "cmake>=3.26" ninja numpy
NV=$("$VENV/bin/python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), '..', 'nvidia', 'cu13'))")
# torch's CMake wants one toolkit directory: nvcc from the system, libraries
# and headers from the pip wheels.
TK=build/cuda-toolkit
rm -rf "$TK" && mkdir -p "$TK/include" "$TK/lib64"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
ln -s "$CUDA_HOME/bin" "$TK/bin"
for f in "$CUDA_HOME"/include/* "$NV"/include/*; do ln -sf "$f" "$TK/include/"; done
for f in "$CUDA_HOME"/lib64/* "$NV"/lib/*; do ln -sf "$f" "$TK/lib64/"; done
(cd "$TK/lib64" && for f in *.so.*; do b=${f%%.so.*}.so; [ -e "$b" ] || ln -s "$f" "$b"; done)
export TORCH_CUDA_ARCH_LIST="8.0;9.0"
mkdir -p build/cuda-torch/pkg/ssd
# The venv's cmake and ninja (the PATH's may be older than 3.26).
"$VENV/bin/cmake" -S . -B build/cuda-torch -G Ninja -DCMAKE_MAKE_PROGRAM="$VENV/bin/ninja" \
  -DPython_EXECUTABLE="$VENV/bin/python" -DSSD_CUDA=on \
  -DCUDA_TOOLKIT_ROOT_DIR="$PWD/$TK" -DCUDAToolkit_ROOT="$PWD/$TK" -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/build/cuda-torch/pkg/ssd" >/dev/null
"$VENV/bin/cmake" --build build/cuda-torch --target _C
# Not _build_info.py: an in-place build's record of another torch.
(cd python && find ssd -name '*.py' ! -name _build_info.py -print0 | xargs -0 cp --parents -t ../build/cuda-torch/pkg)
PYTHONPATH=build/cuda-torch/pkg "$VENV/bin/python" - <<'PY'
import torch, ssd, ssd._C  # noqa: F401
ops = ["paged_attention", "fork_attention", "saguaro_sample", "gumbel_sample", "gumbel_top", "fork_select", "verify",
       "kv_commit", "kv_truncate"]
missing = [op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key("ssd::" + op, "CUDA")]
assert not missing, f"no CUDA kernel registered for {missing}"
print(f"CUDA kernels registered for all {len(ops)} ops (torch {torch.__version__})")
backends = ssd._C.available_backends()
assert "cuda" in backends, f"this build offers no cuda model backend: {backends}"
problem = ssd._C.device_problem("cuda")
assert "cuda" in problem, problem  # no GPU here: the device is refused, by name
print(f"model backends in the build: {backends}; here: {problem}")
PY
