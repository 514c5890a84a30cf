"""``python -m ssd.bench contention``: batch-1 decode tok/s on 1 and 2 threads, alone and beside a busy process.

A shared machine takes cores away: another process busy on one of the two
cores leaves a 2-thread pool one core for two threads. This measures whether
the thread pool keeps its speed then. Model: SmolLM2-135M-Instruct from its
GGUF (``ssd.assets.smollm2_gguf_path()``, or ``--model``), ``--dtype``
weights (default bfloat16), ar mode, greedy, EOS ignored.

Each run is one fresh process per configuration (threads x alone / busy):
one untimed warm-up generation, then one timed one; runs are interleaved
(round r runs every configuration once) so that a slow spell of the machine
touches all configurations alike. The median over ``--runs`` is reported.

    decode tok/s = (generated_tokens - 1) / (t_last_token - t_first_token)

The busy process is ``python -c "while True: pass"`` in a session of its
own, pinned to one CPU (``--busy-cpu``, default the last) where the OS
allows; it runs only during the "busy" configurations. "other CPU" is the share of the machine's CPU
time that third parties (neither ssd nor the busy process) used during the
timed generations; the busy process's own share is reported apart.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .cpu_load import CONTENDED, wait_idle
from .decode import job_name, run_job
from .record import BENCH_PROG, command_line, write_result

PROG = f"{BENCH_PROG} contention"
DTYPES = ("float32", "bfloat16")
LOADS = ("alone", "busy")
METHOD = ("decode tok/s = (generated - 1) / (t_last_token - t_first_token) from the engine's request metrics; "
          "batch 1, greedy, EOS ignored, one fresh process per run (one untimed warm-up generation, one timed), "
          "configurations interleaved, median over runs. busy: a `while True: pass` process pinned to one CPU.")
# Token ids for a model without a tokenizer (the tiny test models).
FALLBACK_PROMPT = list(range(1, 33))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="default run: about 3 min on a 2-core machine")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="target thread counts (default: 1 2)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per configuration (default 5)")
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weight dtype (default bfloat16)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per generation (default 128)")
    ap.add_argument("--model", type=Path, default=None,
                    help="HF directory or GGUF (default: SmolLM2-135M-Instruct's GGUF)")
    ap.add_argument("--humaneval-index", type=int, default=0, help="HumanEval prompt to use (default 0)")
    ap.add_argument("--max-model-len", type=int, default=1024, help="ssd max_model_len (default 1024)")
    ap.add_argument("--busy-cpu", type=int, default=None,
                    help="CPU the busy process is pinned to (default: the last one this process may use)")
    ap.add_argument("--wait-idle", type=float, default=10.0, metavar="S",
                    help="before each run wait up to S s for third parties to leave the CPUs idle "
                         "(default 10; 0: don't wait)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-process timeout, s (default 600)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="write results as JSON")
    args = ap.parse_args(argv)
    if args.max_tokens < 2:
        ap.error("--max-tokens must be at least 2 (the first token is excluded from the decode rate)")
    if args.runs < 1 or any(t < 1 for t in args.threads):
        ap.error("--runs and --threads must be positive")
    return args


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


@contextlib.contextmanager
def busy_process(cpu: int | None):
    """A process spinning on one CPU (pinned to `cpu` where the OS allows) for as long as the block runs."""
    # Its own session (and so its own scheduler autogroup), like a process started elsewhere.
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(proc.pid, {cpu})
        yield proc
    finally:
        proc.kill()
        proc.wait()


def prompt_ids(model: Path, index: int) -> tuple[list[int], str]:
    """The HumanEval prompt in the model's tokenizer; FALLBACK_PROMPT for a model without one."""
    from ssd.assets import humaneval_prompts
    from ssd.models import load

    tokenizer = load(model).tokenizer
    if tokenizer is None:
        return FALLBACK_PROMPT, f"token ids {FALLBACK_PROMPT[0]}..{FALLBACK_PROMPT[-1]} (model without tokenizer)"
    return tokenizer.encode(humaneval_prompts(index + 1)[index]), f"HumanEval/{index}"


def run_all(args, model: Path, ids: list[int], busy_cpu: int | None) -> list[dict]:
    """Every configuration once per round, for --runs rounds; returns one row per configuration."""
    from tqdm.auto import tqdm

    threads = sorted(set(args.threads))
    rows = {(t, load): {"threads": t, "load": load, "rates": [], "other_cpu_fraction": [],
                        "busy_cpu_fraction": []} for load in LOADS for t in threads}
    base = {"kind": "ssd", "dtype": args.dtype, "model": str(model), "prompt_ids": ids,
            "max_tokens": args.max_tokens, "repeats": 1, "max_model_len": args.max_model_len}
    # Per process: model loaded, warm-up, one timed run (decode_worker's progress lines).
    with tqdm(total=3 * len(rows) * args.runs, desc="contention bench", unit="step", dynamic_ncols=True) as bar:
        for r in range(args.runs):
            for load in LOADS:
                if args.wait_idle > 0 and not wait_idle(args.wait_idle):
                    bar.write(f"run {r + 1}: third parties still busy after {args.wait_idle:.0f} s; running anyway")
                with busy_process(busy_cpu) if load == "busy" else contextlib.nullcontext() as busy:
                    for t in threads:
                        job = {**base, "threads": t, "exclude_pids": [busy.pid] if busy else []}
                        bar.set_postfix_str(f"run {r + 1}/{args.runs} {job_name(job)} {load}")
                        res = run_job(job, bar, args.timeout)
                        row = rows[(t, load)]
                        row["rates"] += res["rates"]
                        row["other_cpu_fraction"].append(res["other_cpu_fraction"])
                        row["busy_cpu_fraction"].append(res["excluded_cpu_fraction"])
    return list(rows.values())


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(rows: list[dict]) -> dict:
    """Adds medians to each row; returns 2-thread / 1-thread speed per load (when both were run)."""
    for r in rows:
        r["tok_s"] = statistics.median(r["rates"])
        r["tok_s_min"], r["tok_s_max"] = min(r["rates"]), max(r["rates"])
        r["other_cpu_median"] = _median(r["other_cpu_fraction"])
        r["busy_cpu_median"] = _median(r["busy_cpu_fraction"])
    by_key = {(r["threads"], r["load"]): r for r in rows}
    return {load: by_key[(2, load)]["tok_s"] / by_key[(1, load)]["tok_s"]
            for load in LOADS if (1, load) in by_key and (2, load) in by_key}


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f}%"


def table(rows: list[dict], ratios: dict) -> str:
    head = f"{'threads':>7} {'load':<6} {'decode tok/s':>12} {'(min-max)':>15} {'other CPU':>9} {'busy proc':>9}"
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (LOADS.index(r["load"]), r["threads"])):
        spread = f"({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f})"
        busy = _pct(r["busy_cpu_median"]) if r["load"] == "busy" else ""
        lines.append(f"{r['threads']:>7} {r['load']:<6} {r['tok_s']:>12.2f} {spread:>15} "
                     f"{_pct(r['other_cpu_median']):>9} {busy:>9}")
    lines.append("")
    for load, ratio in ratios.items():
        lines.append(f"2 threads / 1 thread, {load}: {ratio:.2f}x")
    lines.append("other CPU: median share of the machine's CPU time third parties used during the timed runs")
    lines.append("busy proc: median share of the machine's CPU time the competing busy process used")
    if any(f is not None and f > CONTENDED for r in rows for f in r["other_cpu_fraction"]):
        lines.append(f"WARNING: third parties used more than {100 * CONTENDED:.0f}% of the CPUs during some runs; "
                     "rerun when the machine is quieter.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from ssd.assets import smollm2_gguf_path

    t_start = time.perf_counter()
    model = args.model if args.model is not None else smollm2_gguf_path()
    cpus = usable_cpus()
    busy_cpu = args.busy_cpu if args.busy_cpu is not None else cpus[-1]
    if busy_cpu not in cpus:
        print(f"{PROG}: --busy-cpu {busy_cpu} is not one of this process's CPUs {cpus}", file=sys.stderr)
        return 2
    ids, prompt_source = prompt_ids(model, args.humaneval_index)
    if len(ids) + args.max_tokens > args.max_model_len:
        print(f"{PROG}: prompt ({len(ids)} tokens) + --max-tokens {args.max_tokens} "
              f"exceed --max-model-len {args.max_model_len}", file=sys.stderr)
        return 2
    rows = run_all(args, model, ids, busy_cpu)
    ratios = summarise(rows)
    meta = {"model": str(model), "dtype": args.dtype, "prompt_source": prompt_source, "prompt_tokens": len(ids),
            "max_tokens": args.max_tokens, "runs": args.runs, "busy_cpu": busy_cpu, "usable_cpus": cpus,
            "method": METHOD, "wall_seconds": round(time.perf_counter() - t_start, 1)}
    print(f"\n{model.name}, {args.dtype}, batch 1, {len(ids)}-token prompt ({prompt_source}), "
          f"{args.max_tokens} new tokens, median of {args.runs} runs; busy process pinned to CPU {busy_cpu}")
    print(table(rows, ratios))
    if args.json is not None:
        doc = {"meta": meta, "two_over_one_thread": ratios, "results": rows}
        print(f"\nwrote {write_result(args.json, doc, command_line(['contention', *argv], BENCH_PROG))}")
    print(f"total wall time: {meta['wall_seconds']:.0f} s")
    return 0
