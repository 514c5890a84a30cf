#!/usr/bin/env python
"""Decode throughput at batch 1: ssd beside transformers ``generate``.

Model: SmolLM2-135M-Instruct from its Q4_1 GGUF (``ssd.assets.smollm2_gguf_path()``),
dequantised by both loaders to float32 (and bfloat16 as an extra row). Each
configuration -- engine x dtype x thread count -- runs in a fresh subprocess,
so thread settings never leak between configurations and memory is released.
Inside the subprocess the model is loaded, one untimed warm-up generation runs,
then ``--repeats`` timed generations; the median is reported.

What is measured (the same definition for both engines):

    decode tok/s = (generated_tokens - 1) / (t_last_token - t_first_token)

i.e. prefill and the first token are excluded and only the steady-state
one-token-at-a-time steps count.

* ssd: ``LLM(target=gguf, mode="ar", target_threads=N, dtype=...)`` and greedy
  ``generate`` with ``ignore_eos``; the times are the engine's own request
  metrics (``finish_time - time_to_first_token``).
* transformers: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``
  with ``torch.set_num_threads(N)`` (and OMP/MKL_NUM_THREADS=N), greedy
  ``generate(max_new_tokens=M, min_new_tokens=M)``; the times come from a
  streamer that stamps every token as ``generate`` hands it out.

Also reported: a memory-bandwidth bound on decode speed. Every decode step must
stream all weights from DRAM once (the ~0.5 GB fp32 model is far larger than
the caches): bytes/token = every weight matrix and norm, the tied embedding
counted once as lm_head, plus one embedding row. The bandwidth is a measured
large tensor copy (``torch`` ``copy_``, ``--bw-mb`` MB, N threads, best of 5;
counted as read + write bytes / time). bound tok/s = bandwidth / bytes-per-token,
and "% bound" is each engine's fraction of it. (KV-cache reads, ~1.5 % of the
weight bytes at this context, are left out, so the bound is slightly generous.)

The machine must be otherwise idle: the "other CPU" column is the share of all
CPU time that other processes used during each configuration's timed runs
(from /proc/stat), and a warning is printed when it exceeds 10 %. Before each
configuration the script waits up to --wait-idle seconds for the CPUs to quiet.

Usage:
    PYTHONPATH=python python bench/bench_decode.py                 # full run (~4 min on an idle 2-core machine)
    PYTHONPATH=python python bench/bench_decode.py --quick         # smoke run: fp32, 16 tokens, 1 repeat
    PYTHONPATH=python python bench/bench_decode.py --threads 1 2 --dtypes float32 bfloat16 \\
        --max-tokens 64 --repeats 3 --json bench/results/decode.json --plot bench/results/decode.png

Options:
    --threads N [N ...]     thread counts (default: 1 2)
    --dtypes D [D ...]      float32 and/or bfloat16 (default: both; --quick: float32)
    --engines E [E ...]     ssd and/or transformers (default: both)
    --max-tokens M          new tokens per generation (default 64; --quick: 16)
    --repeats R             timed generations per configuration (default 3; --quick: 1)
    --prompt TEXT           prompt text (default: HumanEval prompt --humaneval-index)
    --humaneval-index I     which HumanEval prompt (default 0)
    --bw-mb MB              size of the bandwidth-test buffer (default 1024; --quick: 256)
    --json FILE             write all numbers (incl. per-repeat rates) as JSON
    --plot FILE             write a PNG bar chart (matplotlib)
    --wait-idle S           before each configuration, wait up to S s for other processes to
                            leave the CPUs idle (default 10; 0 disables)
    --timeout S             per-subprocess timeout in seconds (default 600)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_MARK_STEP = "@@step"
_MARK_RESULT = "@@result "
_DTYPES = ("float32", "bfloat16")
_ENGINES = ("ssd", "transformers")
_CONTENDED = 0.10  # other processes' CPU share above which a warning is printed
_ENGINE_LABEL = {"ssd": "ssd", "transformers": "transformers"}
_METHOD = ("decode tok/s = (generated - 1) / (t_last_token - t_first_token); prefill and the "
           "first token excluded. ssd: engine request metrics (finish_time - time_to_first_token). "
           "transformers: per-token timestamps from a generate() streamer. Greedy, EOS ignored, "
           "batch 1, one untimed warm-up per process, median over repeats.")


# ------------------------------------------------------------------ workers
# Each worker runs in its own subprocess, prints one `@@step` line per unit of
# progress and finally `@@result {json}` on stdout.


def _step() -> None:
    print(_MARK_STEP, flush=True)


def _machine_busy_seconds() -> float | None:
    """CPU seconds spent busy by all processes on the machine (from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class _ForeignLoad:
    """Measures how much CPU *other* processes used while the timed loop ran.

    other = (machine busy CPU-s - this process's CPU-s) / (wall-s * logical CPUs).
    A few percent is noise; tens of percent means the numbers are contended.
    """

    def __enter__(self):
        self.busy0, self.own0, self.wall0 = _machine_busy_seconds(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy1, own1, wall1 = _machine_busy_seconds(), time.process_time(), time.perf_counter()
        if self.busy0 is None or busy1 is None:
            self.fraction = None
        else:
            other = (busy1 - self.busy0) - (own1 - self.own0)
            self.fraction = max(0.0, other / ((wall1 - self.wall0) * (os.cpu_count() or 1)))


def _timed_runs(job: dict, generate_once) -> dict:
    """One untimed warm-up, then `repeats` timed runs of `generate_once() -> (rate, ttft, tokens)`."""
    generate_once()
    _step()
    rates, ttfts, tokens = [], [], None
    with _ForeignLoad() as load:
        for _ in range(job["repeats"]):
            rate, ttft, tokens = generate_once()
            rates.append(rate)
            ttfts.append(ttft)
            _step()
    return {"rates": rates, "ttft_s": ttfts, "token_ids": tokens, "other_cpu_fraction": load.fraction}


def _worker_ssd(job: dict) -> dict:
    from ssd import LLM, SamplingParams

    llm = LLM(target=job["model"], mode="ar", max_model_len=job["max_model_len"],
              target_threads=job["threads"], dtype=job["dtype"])
    _step()
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)

    def generate_once():
        out = llm.generate([job["prompt_ids"]], params)[0]
        if out.finish_reason == "error" or len(out.token_ids) != job["max_tokens"]:
            raise RuntimeError(f"ssd generate: finish_reason={out.finish_reason} error={out.error} "
                               f"tokens={len(out.token_ids)}")
        m = out.metrics  # seconds since the request was enqueued, measured by the engine
        rate = (len(out.token_ids) - 1) / (m["finish_time"] - m["time_to_first_token"])
        return rate, m["time_to_first_token"], list(out.token_ids)

    try:
        return _timed_runs(job, generate_once)
    finally:
        llm.shutdown()


class _StampStreamer:
    """A generate() streamer that records when each generated token arrives."""

    def __init__(self):
        self.stamps: list[float] = []
        self._seen_prompt = False

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self._seen_prompt:  # generate() first pushes the prompt itself
            self._seen_prompt = True
            return
        self.stamps.extend([now] * int(value.numel()))

    def end(self) -> None:
        pass


def _worker_transformers(job: dict) -> dict:
    import torch

    torch.set_num_threads(job["threads"])
    import transformers
    from transformers import AutoModelForCausalLM

    model_path = Path(job["model"])
    dtype = getattr(torch, job["dtype"])
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kw = {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}
    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 **dtype_kw).eval()
    _step()
    ids = torch.tensor([job["prompt_ids"]], dtype=torch.long)
    mask = torch.ones_like(ids)
    m = job["max_tokens"]
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
        pad = pad[0] if isinstance(pad, (list, tuple)) else (pad if pad is not None else 0)

    def generate_once():
        streamer = _StampStreamer()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m,
                                 do_sample=False, pad_token_id=pad, streamer=streamer)
        new = out[0, ids.shape[1]:].tolist()
        if len(new) != m or len(streamer.stamps) != m:
            raise RuntimeError(f"transformers generate: {len(new)} tokens, {len(streamer.stamps)} stamps")
        rate = (m - 1) / (streamer.stamps[-1] - streamer.stamps[0])
        return rate, streamer.stamps[0] - t0, new

    return _timed_runs(job, generate_once)


def _worker_bandwidth(job: dict) -> dict:
    import torch

    torch.set_num_threads(job["threads"])
    n = job["bw_mb"] * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)  # touches every page
    dst = torch.zeros(n, dtype=torch.float32)
    dst.copy_(src)
    best = float("inf")
    with _ForeignLoad() as load:
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    _step()
    return {"bytes": 2 * n * 4, "seconds": best, "gbps": 2 * n * 4 / best / 1e9,
            "other_cpu_fraction": load.fraction}


_WORKERS = {"ssd": _worker_ssd, "transformers": _worker_transformers, "bandwidth": _worker_bandwidth}


def _worker_main(spec: str) -> None:
    job = json.loads(spec)
    result = _WORKERS[job["kind"]](job)
    print(_MARK_RESULT + json.dumps(result), flush=True)


# ------------------------------------------------------------------- parent


def _run_job(job: dict, bar, timeout: float) -> dict:
    """Runs one worker subprocess, advancing `bar` on its progress lines."""
    env = dict(os.environ)
    threads = str(job["threads"])
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    python_dir = str(Path(__file__).resolve().parents[1] / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (python_dir, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(job)]
    result = None
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        timed_out = threading.Event()

        def _kill():
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout, _kill)  # a silent hang is killed too
        watchdog.start()
        try:
            for line in proc.stdout:
                if line.startswith(_MARK_STEP):
                    bar.update(1)
                elif line.startswith(_MARK_RESULT):
                    result = json.loads(line[len(_MARK_RESULT):])
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if timed_out.is_set():
            raise RuntimeError(f"{_job_name(job)}: killed after the {timeout:.0f} s timeout")
        if proc.returncode != 0 or result is None:
            err.seek(0)
            tail = err.read()[-3000:]
            raise RuntimeError(f"{_job_name(job)}: worker exited with {proc.returncode}\n{tail}")
    return result


def _wait_idle(max_wait: float, probe: float = 1.0) -> bool:
    """Waits (up to max_wait s) until other processes use under _CONTENDED of the CPUs for `probe` s."""
    deadline = time.monotonic() + max_wait
    while True:
        with _ForeignLoad() as load:
            time.sleep(probe)
        if load.fraction is None or load.fraction < _CONTENDED:
            return True
        if time.monotonic() >= deadline:
            return False


def _job_name(job: dict) -> str:
    if job["kind"] == "bandwidth":
        return f"bandwidth {job['threads']}T"
    return f"{job['kind']} {job['dtype']} {job['threads']}T"


def _model_facts(path: Path, prompt_text: str) -> tuple[list[int], dict[str, int], dict]:
    """Prompt ids (ssd's tokenizer) and weight bytes read per decoded token, per dtype."""
    from ssd.models import load

    model = load(path)
    ids = model.require_tokenizer().encode(prompt_text)
    weights = model.weights
    cfg = model.config
    elements = sum(t.numel() for name, t in weights.items() if name != "model.embed_tokens.weight")
    if "lm_head.weight" not in weights:  # tied: the embedding matrix is read once as lm_head
        elements += weights["model.embed_tokens.weight"].numel()
    elements += cfg.hidden_size  # the one embedding row looked up
    bytes_per_token = {"float32": 4 * elements, "bfloat16": 2 * elements}
    info = {"architecture": cfg.architecture, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size, "tied_embeddings": cfg.tie_word_embeddings,
            "weight_elements_read_per_token": elements}
    del model, weights
    return ids, bytes_per_token, info


def _machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    for mod in ("torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    try:
        import ssd

        info["ssd"] = ssd.__version__
    except ImportError:
        info["ssd"] = None
    try:
        repo = Path(__file__).resolve().parents[1]
        info["git_commit"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                            capture_output=True, text=True, check=False).stdout.strip() or None
    except OSError:
        info["git_commit"] = None
    return info


def _common_prefix(a: list[int] | None, b: list[int] | None) -> int | None:
    if a is None or b is None:
        return None
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _summarise(rows: list[dict], bw: dict[int, dict], bytes_per_token: dict[str, int]) -> None:
    """Adds median/bound/fraction/speedup/agreement fields to each row (in place)."""
    by_key = {(r["engine"], r["dtype"], r["threads"]): r for r in rows}
    for r in rows:
        r["tok_s"] = statistics.median(r["rates"])
        r["tok_s_min"], r["tok_s_max"] = min(r["rates"]), max(r["rates"])
        r["ttft_s_median"] = statistics.median(r["ttft_s"])
        gbps = bw[r["threads"]]["gbps"]
        r["bytes_per_token"] = bytes_per_token[r["dtype"]]
        r["bound_tok_s"] = gbps * 1e9 / r["bytes_per_token"]
        r["fraction_of_bound"] = r["tok_s"] / r["bound_tok_s"]
    for r in rows:
        other = by_key.get(("transformers" if r["engine"] == "ssd" else "ssd", r["dtype"], r["threads"]))
        r["speedup_vs_transformers"] = (r["tok_s"] / other["tok_s"]
                                        if r["engine"] == "ssd" and other else None)
        r["greedy_prefix_match"] = _common_prefix(r["token_ids"], other["token_ids"]) if other else None


def _table(rows: list[dict], bw: dict[int, dict], bytes_per_token: dict[str, int], max_tokens: int) -> str:
    head = (f"{'dtype':<9} {'thr':>3} {'engine':<13} {'decode tok/s':>12} {'(min-max)':>15} "
            f"{'TTFT s':>7} {'bound tok/s':>11} {'% bound':>8} {'vs HF':>6} {'greedy=':>8} {'other CPU':>9}")
    lines = [head, "-" * len(head)]
    order = {e: i for i, e in enumerate(_ENGINES)}
    for r in sorted(rows, key=lambda r: (_DTYPES.index(r["dtype"]), r["threads"], order[r["engine"]])):
        speed = f"{r['speedup_vs_transformers']:.2f}x" if r["speedup_vs_transformers"] else ""
        agree = f"{r['greedy_prefix_match']}/{max_tokens}" if r["greedy_prefix_match"] is not None else ""
        spread = f"({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f})"
        other = _pct(r.get("other_cpu_fraction"))
        lines.append(f"{r['dtype']:<9} {r['threads']:>3} {_ENGINE_LABEL[r['engine']]:<13} "
                     f"{r['tok_s']:>12.2f} {spread:>15} {r['ttft_s_median']:>7.3f} "
                     f"{r['bound_tok_s']:>11.1f} {100 * r['fraction_of_bound']:>7.1f}% {speed:>6} {agree:>8} {other:>9}")
    lines.append("")
    for t in sorted(bw):
        lines.append(f"copy bandwidth {t} thread(s): {bw[t]['gbps']:.2f} GB/s (read+write bytes / time; "
                     f"other CPU {_pct(bw[t].get('other_cpu_fraction')).strip()})")
    for d in sorted(bytes_per_token, key=_DTYPES.index):
        lines.append(f"weight bytes read per token, {d}: {bytes_per_token[d] / 1e6:.1f} MB")
    lines.append("greedy= : leading generated tokens identical between ssd and transformers")
    lines.append("other CPU: share of the machine's CPU time used by other processes during the timed runs")
    fractions = [r.get("other_cpu_fraction") for r in rows] + [v.get("other_cpu_fraction") for v in bw.values()]
    if any(f is not None and f > _CONTENDED for f in fractions):
        lines.append(f"WARNING: other processes used more than {100 * _CONTENDED:.0f}% of the CPUs during some "
                     "runs; those numbers (multi-thread ones above all) are not trustworthy. Rerun on an idle machine.")
    return "\n".join(lines)


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f}%"


def _plot(path: Path, rows: list[dict], meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["dtype"], r["threads"]) for r in rows}, key=lambda g: (_DTYPES.index(g[0]), g[1]))
    engines = [e for e in _ENGINES if any(r["engine"] == e for r in rows)]
    by_key = {(r["engine"], r["dtype"], r["threads"]): r for r in rows}
    width = 0.8 / len(engines)
    colors = {"ssd": "#1f77b4", "transformers": "#ff7f0e"}
    fig, ax = plt.subplots(figsize=(3.6 + 2.0 * len(groups), 4.5))
    for j, eng in enumerate(engines):
        xs, hs, errs = [], [], [[], []]
        for i, g in enumerate(groups):
            r = by_key.get((eng, *g))
            if r is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            hs.append(r["tok_s"])
            errs[0].append(r["tok_s"] - r["tok_s_min"])
            errs[1].append(r["tok_s_max"] - r["tok_s"])
        bars = ax.bar(xs, hs, width, yerr=errs, capsize=3, label=_ENGINE_LABEL[eng], color=colors[eng])
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    for i, g in enumerate(groups):
        bound = next(r["bound_tok_s"] for r in rows if (r["dtype"], r["threads"]) == g)
        ax.hlines(bound, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1.2,
                  label="bandwidth bound" if i == 0 else None)
    ax.set_xticks(range(len(groups)), [f"{d}\n{t} thread{'s' if t > 1 else ''}" for d, t in groups])
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title(f"SmolLM2-135M-Instruct decode, {meta['max_tokens']} new tokens, "
                 f"{meta['prompt_tokens']}-token prompt (bars: median, whiskers: min-max)\n"
                 f"{meta['machine']['cpu']}, {meta['machine']['logical_cpus']} logical CPUs", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse_args(argv=None) -> argparse.Namespace:
    doc = __doc__.split("Usage:")[0].strip()
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default: 1 2)")
    ap.add_argument("--dtypes", nargs="+", choices=_DTYPES, default=None,
                    help="weight dtypes (default: float32 bfloat16; --quick: float32)")
    ap.add_argument("--engines", nargs="+", choices=_ENGINES, default=list(_ENGINES),
                    help="engines to run (default: both)")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per generation (default 64; --quick 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed generations per config (default 3; --quick 1)")
    ap.add_argument("--prompt", default=None, help="prompt text (default: a HumanEval prompt)")
    ap.add_argument("--humaneval-index", type=int, default=0, help="HumanEval prompt to use (default 0)")
    ap.add_argument("--bw-mb", type=int, default=None, help="bandwidth buffer MB (default 1024; --quick 256)")
    ap.add_argument("--max-model-len", type=int, default=1024, help="ssd max_model_len (default 1024)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="write results as JSON")
    ap.add_argument("--plot", type=Path, default=None, metavar="FILE", help="write a PNG bar chart")
    ap.add_argument("--wait-idle", type=float, default=10.0, metavar="S",
                    help="before each configuration wait up to S s for other processes to leave the CPUs "
                         "idle (default 10; 0: don't wait)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-subprocess timeout, s (default 600)")
    ap.add_argument("--quick", action="store_true", help="fast smoke run (fp32, 16 tokens, 1 repeat)")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker is None:
        args.dtypes = args.dtypes or (["float32"] if args.quick else list(_DTYPES))
        args.max_tokens = args.max_tokens or (16 if args.quick else 64)
        args.repeats = args.repeats or (1 if args.quick else 3)
        args.bw_mb = args.bw_mb or (256 if args.quick else 1024)
        if args.max_tokens < 2:
            ap.error("--max-tokens must be at least 2 (the first token is excluded from the decode rate)")
        if args.repeats < 1 or any(t < 1 for t in args.threads) or args.bw_mb < 1:
            ap.error("--repeats, --threads and --bw-mb must be positive")
    return args


def main(argv=None) -> int:
    args = _parse_args(argv)
    if args._worker is not None:
        _worker_main(args._worker)
        return 0

    from tqdm.auto import tqdm

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from ssd.assets import humaneval_prompts, smollm2_gguf_path

    t_start = time.perf_counter()
    machine = _machine()
    model = smollm2_gguf_path()
    if args.prompt is not None:
        prompt_text, prompt_source = args.prompt, "--prompt"
    else:
        prompt_text = humaneval_prompts(args.humaneval_index + 1)[args.humaneval_index]
        prompt_source = f"HumanEval/{args.humaneval_index}"
    prompt_ids, bytes_per_token, model_info = _model_facts(model, prompt_text)
    if len(prompt_ids) + args.max_tokens > args.max_model_len:
        raise SystemExit(f"prompt ({len(prompt_ids)} tokens) + --max-tokens {args.max_tokens} "
                         f"exceed --max-model-len {args.max_model_len}")
    threads = sorted(set(args.threads))
    bytes_per_token = {d: bytes_per_token[d] for d in args.dtypes}

    jobs = [{"kind": "bandwidth", "threads": t, "bw_mb": args.bw_mb} for t in threads]
    for dtype in args.dtypes:
        for t in threads:
            for eng in args.engines:
                jobs.append({"kind": eng, "dtype": dtype, "threads": t, "model": str(model),
                             "prompt_ids": prompt_ids, "max_tokens": args.max_tokens,
                             "repeats": args.repeats, "max_model_len": args.max_model_len})
    total = sum(1 if j["kind"] == "bandwidth" else 2 + j["repeats"] for j in jobs)

    bw: dict[int, dict] = {}
    rows: list[dict] = []
    with tqdm(total=total, desc="bench", unit="step", dynamic_ncols=True) as bar:
        for job in jobs:
            bar.set_postfix_str(_job_name(job))
            if args.wait_idle > 0 and not _wait_idle(args.wait_idle):
                bar.write(f"{_job_name(job)}: machine still busy after {args.wait_idle:.0f} s; running anyway")
            res = _run_job(job, bar, args.timeout)
            if job["kind"] == "bandwidth":
                bw[job["threads"]] = res
            else:
                rows.append({"engine": job["kind"], "dtype": job["dtype"], "threads": job["threads"], **res})
                bar.write(f"{_job_name(job)}: {statistics.median(res['rates']):.2f} tok/s "
                          f"(runs: {', '.join(f'{x:.2f}' for x in res['rates'])})")
    _summarise(rows, bw, bytes_per_token)

    meta = {"model": str(model), "model_info": model_info, "prompt_source": prompt_source,
            "prompt_tokens": len(prompt_ids), "max_tokens": args.max_tokens, "repeats": args.repeats,
            "method": _METHOD, "bandwidth_method": f"torch copy_ of {args.bw_mb} MB fp32, best of 5, "
            "(read + write bytes) / time", "machine": machine,
            "wall_seconds": round(time.perf_counter() - t_start, 1)}
    print()
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1, dequantised), batch 1, {len(prompt_ids)}-token prompt "
          f"({prompt_source}), {args.max_tokens} new tokens, median of {args.repeats}")
    print(f"Method: {_METHOD}")
    print()
    print(_table(rows, bw, bytes_per_token, args.max_tokens))

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"meta": meta, "bandwidth": {str(t): v for t, v in bw.items()},
                   "bytes_per_token": bytes_per_token, "results": rows}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    if args.plot is not None:
        _plot(args.plot, rows, meta)
        print(f"wrote {args.plot}")
    print(f"total wall time: {meta['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
