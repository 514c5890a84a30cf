"""``python -m ssd.bench decode``: batch-1 decode tok/s of ssd beside transformers, and the bandwidth bound.

``--engines ... llamacpp`` adds llama.cpp (its own llama-bench, decode and
prefill, on GGUF files of each dtype; ``ssd.bench.llamacpp``).

Model: SmolLM2-135M-Instruct from its Q4_1 GGUF (``ssd.assets.smollm2_gguf_path()``),
dequantised by both loaders to float32 (and bfloat16 as an extra row); ssd
alone also runs it quantized: ``q8_0`` / ``q4_0`` (quantized at load) and
``auto`` (the file's own q4_1 layers and q8_0 embedding, kept in their
blocks; ssd.models.quantized). Each
configuration (engine x dtype x threads) runs in a fresh process
(``ssd.bench.decode_worker``): one untimed warm-up generation, then
``--repeats`` timed ones; the median is reported.

Both engines are measured the same way:

    decode tok/s = (generated_tokens - 1) / (t_last_token - t_first_token)

so prefill and the first token are excluded. ssd: ``LLM(gguf, mode="ar")``,
greedy with ``ignore_eos``, times from the engine's request metrics.
transformers: ``generate(max_new_tokens=M, min_new_tokens=M)`` with
``torch.set_num_threads(N)``, times from a streamer stamping every token.

The bound: every decode step streams all weights from memory once (the ~0.5
GB fp32 model dwarfs the caches); bytes/token = every weight matrix and norm,
the tied embedding once as lm_head, plus one embedding row. The bandwidth is a
large tensor copy (``--bw-mb`` MB, N threads, best of 5, read + write bytes /
time); bound tok/s = bandwidth / bytes per token. KV-cache reads (~1.5% of
the weight bytes at this context) are left out, so the bound is slightly
generous.

The machine should be idle: "other CPU" is the share of all CPU time other
processes used during each configuration's timed runs (/proc/stat); above 10%
a warning is printed. Before each configuration the run waits up to
``--wait-idle`` s for the CPUs to quiet.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .cpu_load import CONTENDED, wait_idle
from .decode_worker import MARK_RESULT, MARK_STEP
from .record import BENCH_PROG, command_line, write_result

PROG = f"{BENCH_PROG} decode"
DTYPES = ("float32", "bfloat16", "q8_0", "q4_0", "auto")
# The dtypes transformers runs too (it reads the GGUF dequantised).
FLOAT_DTYPES = ("float32", "bfloat16")
ENGINES = ("ssd", "transformers", "llamacpp")  # llamacpp: bench.llamacpp, on request
METHOD = ("decode tok/s = (generated - 1) / (t_last_token - t_first_token); prefill and the "
          "first token excluded. ssd: engine request metrics (finish_time - time_to_first_token). "
          "transformers: per-token timestamps from a generate() streamer. Greedy, EOS ignored, "
          "batch 1, one untimed warm-up per process, median over repeats. llama.cpp: llama-bench's "
          "own rates, decode -p 0 -n N -d P, prefill -p P -n 0 (P: the prompt's tokens). Prefill "
          "tok/s: P / TTFT for ssd and transformers.")
# --quick's settings, and the full run's.
QUICK = {"dtypes": ["float32"], "max_tokens": 16, "repeats": 1, "bw_mb": 256}
FULL = {"dtypes": list(DTYPES), "max_tokens": 64, "repeats": 3, "bw_mb": 1024}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="full run: about 4 min on an idle 2-core machine; --quick: under 1 min")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default: 1 2)")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=None,
                    help="weight dtypes (default: all; --quick: float32); transformers runs float32 and "
                         "bfloat16 only")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=["ssd", "transformers"],
                    help="engines to run (default: ssd transformers; llamacpp needs llama.cpp's tools, "
                         "see --llamacpp-bin)")
    ap.add_argument("--llamacpp-bin", default=None, metavar="DIR",
                    help="folder with llama.cpp's llama-bench and llama-quantize (default: where llama-bench "
                         "is on PATH); see ssd.bench.llamacpp")
    ap.add_argument("--cpu-isas", nargs="+", choices=("avx512_vnni", "avx512", "avx2", "portable"), default=None,
                    metavar="ISA", help="run ssd's CPU kernels on each of these instruction sets (avx512_vnni, "
                    "avx512, avx2, portable; "
                         "default: the best this CPU has), one row each")
    ap.add_argument("--tensor-parallel", nargs="+", type=int, default=[1], metavar="N",
                    help="ssd rows with the target split over each of these numbers of processes (default 1); "
                         "--threads is then the total, split evenly between them")
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
    ap.add_argument("--timeout", type=float, default=600.0, help="per-process timeout, s (default 600)")
    ap.add_argument("--quick", action="store_true", help="smoke run (fp32, 16 tokens, 1 repeat)")
    args = ap.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.max_tokens < 2:
        ap.error("--max-tokens must be at least 2 (the first token is excluded from the decode rate)")
    if args.repeats < 1 or any(t < 1 for t in args.threads) or args.bw_mb < 1:
        ap.error("--repeats, --threads and --bw-mb must be positive")
    if bad := [(t, n) for t in args.threads for n in args.tensor_parallel if n < 1 or t % n]:
        ap.error(f"--tensor-parallel: {bad[0][1]} processes cannot share {bad[0][0]} threads evenly")
    from ssd import _C

    if args.cpu_isas is None:
        args.cpu_isas = [_C.cpu_isa()]
    elif missing := [isa for isa in args.cpu_isas if isa not in _C.cpu_isas()]:
        ap.error(f"--cpu-isas: this CPU cannot run {', '.join(missing)} (it runs: {', '.join(_C.cpu_isas())})")
    return args


def job_name(job: dict) -> str:
    if job["kind"] == "bandwidth":
        return f"bandwidth {job['threads']}T"
    return f"{engine_label(job)} {job['dtype']} {job['threads']}T"


def engine_label(row: dict) -> str:
    """The engine, with the instruction set of ssd's kernels and its tensor-parallel
    processes: "ssd (avx2)", "ssd (avx2, tp2)"."""
    kind = row.get("kind", row.get("engine"))
    notes = ([row["cpu_isa"]] if row.get("cpu_isa") else []) + (
        [f"tp{row['tensor_parallel']}"] if row.get("tensor_parallel", 1) > 1 else [])
    return f"{kind} ({', '.join(notes)})" if notes else kind


def run_job(job: dict, bar, timeout: float) -> dict:
    """Runs one worker process, advancing `bar` on its progress lines; a silent hang is killed."""
    import ssd

    env = dict(os.environ)
    threads = str(job["threads"])
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # The worker imports the same ssd as this process (installed or a source tree on PYTHONPATH).
    package_root = str(Path(ssd.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "ssd.bench.decode_worker", json.dumps(job)]
    result = None
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                if line.startswith(MARK_STEP):
                    bar.update(1)
                elif line.startswith(MARK_RESULT):
                    result = json.loads(line[len(MARK_RESULT):])
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if timed_out.is_set():
            raise RuntimeError(f"{job_name(job)}: killed after the {timeout:.0f} s timeout")
        if proc.returncode != 0 or result is None:
            err.seek(0)
            raise RuntimeError(f"{job_name(job)}: worker exited with {proc.returncode}\n{err.read()[-3000:]}")
    return result


def model_facts(path: Path, prompt_text: str, dtypes: list[str]) -> tuple[list[int], dict[str, int], dict]:
    """Prompt ids (ssd's tokenizer), weight bytes read per decoded token per dtype, and the model's shape.

    Float dtypes count elements; a quantized dtype counts the bytes ssd's engine
    holds for the weights (its blocks, the tied embedding once).
    """
    from ssd.models import load

    model = load(path)
    ids = model.require_tokenizer().encode(prompt_text)
    weights, cfg = model.weights, model.config
    elements = sum(t.numel() for name, t in weights.items() if name != "model.embed_tokens.weight")
    if "lm_head.weight" not in weights:  # tied: the embedding matrix is read once as lm_head
        elements += weights["model.embed_tokens.weight"].numel()
    elements += cfg.hidden_size  # the one embedding row looked up
    bytes_per_token = {"float32": 4 * elements, "bfloat16": 2 * elements}
    for dtype in dtypes:
        if dtype not in FLOAT_DTYPES:
            bytes_per_token[dtype] = load(path, dtype=dtype).core_model().weight_bytes
    info = {"architecture": cfg.architecture, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size, "tied_embeddings": cfg.tie_word_embeddings,
            "weight_elements_read_per_token": elements}
    return ids, bytes_per_token, info


def common_prefix(a: list[int] | None, b: list[int] | None) -> int | None:
    if a is None or b is None:
        return None
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def summarise(rows: list[dict], bw: dict[int, dict], bytes_per_token: dict[str, int],
              prompt_tokens: int | None = None) -> None:
    """Adds median, prefill rate, bound, fraction of bound, speedups over transformers, llama.cpp
    and bf16, and greedy agreement to each row."""
    for r in rows:
        r["tok_s"] = statistics.median(r["rates"])
        r["tok_s_min"], r["tok_s_max"] = min(r["rates"]), max(r["rates"])
        r["ttft_s_median"] = statistics.median(r["ttft_s"]) if r.get("ttft_s") else None
        r["prefill_tok_s"] = (statistics.median(r["prefill_rates"]) if r.get("prefill_rates")
                              else prompt_tokens / r["ttft_s_median"] if prompt_tokens and r["ttft_s_median"]
                              else None)
        r["bytes_per_token"] = bytes_per_token[r["dtype"]]
        r["bound_tok_s"] = bw[r["threads"]]["gbps"] * 1e9 / r["bytes_per_token"]
        r["fraction_of_bound"] = r["tok_s"] / r["bound_tok_s"]
    # Each ssd row against transformers' row; transformers' row against one ssd row (the last).
    by_engine = {e: {(r["dtype"], r["threads"]): r for r in rows if r["engine"] == e and r.get("tensor_parallel", 1) == 1}
                 for e in ENGINES}
    bf16 = {(r["threads"], r.get("cpu_isa"), r.get("tensor_parallel", 1)): r
            for r in rows if r["engine"] == "ssd" and r["dtype"] == "bfloat16"}
    for r in rows:
        base = bf16.get((r["threads"], r.get("cpu_isa"), r.get("tensor_parallel", 1))) if r["engine"] == "ssd" else None
        r["speedup_vs_bf16"] = r["tok_s"] / base["tok_s"] if base else None
        other = by_engine["transformers" if r["engine"] == "ssd" else "ssd"].get((r["dtype"], r["threads"]))
        r["speedup_vs_transformers"] = r["tok_s"] / other["tok_s"] if r["engine"] == "ssd" and other else None
        peer = by_engine["llamacpp"].get((r["dtype"], r["threads"])) if r["engine"] == "ssd" else None
        r["speedup_vs_llamacpp"] = r["tok_s"] / peer["tok_s"] if peer else None
        r["prefill_vs_llamacpp"] = (r["prefill_tok_s"] / peer["prefill_tok_s"]
                                    if peer and r["prefill_tok_s"] else None)
        r["greedy_prefix_match"] = common_prefix(r["token_ids"], other["token_ids"]) if other else None


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f}%"


def table(rows: list[dict], bw: dict[int, dict], bytes_per_token: dict[str, int], max_tokens: int) -> str:
    head = (f"{'dtype':<9} {'thr':>3} {'engine':<16} {'decode tok/s':>12} {'(min-max)':>15} "
            f"{'prefill tok/s':>13} {'bound tok/s':>11} {'% bound':>8} {'vs HF':>6} {'vs llama.cpp':>12} "
            f"{'vs bf16':>7} {'greedy=':>8} {'other CPU':>9}")
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (DTYPES.index(r["dtype"]), r["threads"], ENGINES.index(r["engine"]),
                                         r.get("cpu_isa") or "", r.get("tensor_parallel", 1))):
        speed = f"{r['speedup_vs_transformers']:.2f}x" if r["speedup_vs_transformers"] else ""
        vs_bf16 = f"{r['speedup_vs_bf16']:.2f}x" if r.get("speedup_vs_bf16") else ""
        agree = f"{r['greedy_prefix_match']}/{max_tokens}" if r["greedy_prefix_match"] is not None else ""
        spread = f"({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f})"
        vs_peer = (f"{r['speedup_vs_llamacpp']:.2f}x/{r['prefill_vs_llamacpp']:.2f}x"
                   if r.get("speedup_vs_llamacpp") and r.get("prefill_vs_llamacpp") else "")
        prefill = f"{r['prefill_tok_s']:.1f}" if r["prefill_tok_s"] else "n/a"
        lines.append(f"{r['dtype']:<9} {r['threads']:>3} {engine_label(r):<16} {r['tok_s']:>12.2f} {spread:>15} "
                     f"{prefill:>13} {r['bound_tok_s']:>11.1f} {100 * r['fraction_of_bound']:>7.1f}% "
                     f"{speed:>6} {vs_peer:>12} {vs_bf16:>7} {agree:>8} {_pct(r.get('other_cpu_fraction')):>9}")
    lines.append("")
    for r in rows:
        if r.get("collective_ms_per_forward") is not None:
            lines.append(f"{engine_label(r)} {r['dtype']} {r['threads']} thr: {r['collectives_per_forward']:.0f} "
                         f"all-gathers per forward, {r['collective_ms_per_forward']:.2f} ms of it per forward")
    for t in sorted(bw):
        lines.append(f"copy bandwidth {t} thread(s): {bw[t]['gbps']:.2f} GB/s (read+write bytes / time; "
                     f"other CPU {_pct(bw[t].get('other_cpu_fraction'))})")
    for d in sorted(bytes_per_token, key=DTYPES.index):
        lines.append(f"weight bytes read per token, {d}: {bytes_per_token[d] / 1e6:.1f} MB")
    lines.append("vs bf16: ssd's tok/s over its own bfloat16 row (same threads and instruction set)")
    if any(r["engine"] == "llamacpp" for r in rows):
        lines.append("vs llama.cpp: ssd's decode / prefill tok/s over llama.cpp's (same dtype and threads; "
                     "llama.cpp on GGUF files of that type made by its llama-quantize)")
    lines.append("greedy= : leading generated tokens identical between ssd and transformers")
    lines.append("other CPU: share of the machine's CPU time used by other processes during the timed runs")
    fractions = [r.get("other_cpu_fraction") for r in rows] + [v.get("other_cpu_fraction") for v in bw.values()]
    if any(f is not None and f > CONTENDED for f in fractions):
        lines.append(f"WARNING: other processes used more than {100 * CONTENDED:.0f}% of the CPUs during some "
                     "runs; those numbers (multi-thread ones above all) are not trustworthy. Rerun on an idle machine.")
    return "\n".join(lines)


def make_jobs(args, model: Path, prompt_ids: list[int], peer_files: dict[str, str] | None = None,
              llama_bench: str | None = None) -> list[dict]:
    threads = sorted(set(args.threads))
    jobs = [{"kind": "bandwidth", "threads": t, "bw_mb": args.bw_mb} for t in threads]
    for dtype in args.dtypes:
        for t in threads:
            for engine in args.engines:
                if engine == "transformers" and dtype not in FLOAT_DTYPES:
                    continue
                job = {"kind": engine, "dtype": dtype, "threads": t, "model": str(model), "prompt_ids": prompt_ids,
                       "max_tokens": args.max_tokens, "repeats": args.repeats, "max_model_len": args.max_model_len}
                if engine == "llamacpp":
                    job.update(model=peer_files[dtype], llama_bench=llama_bench)
                isas = args.cpu_isas if engine == "ssd" else [None]
                splits = args.tensor_parallel if engine == "ssd" else [1]
                jobs += [{**job, **({"cpu_isa": isa} if isa else {}), **({"tensor_parallel": n} if n > 1 else {})}
                         for isa in isas for n in splits]
    return jobs


def run_jobs(jobs: list[dict], wait_s: float, timeout: float) -> tuple[dict[int, dict], list[dict]]:
    """Every job in turn, each after waiting for a quiet machine; returns (bandwidth by threads, engine rows)."""
    from tqdm.auto import tqdm

    total = sum(1 if j["kind"] == "bandwidth" else 2 + j["repeats"] for j in jobs)
    bw, rows = {}, []
    with tqdm(total=total, desc="decode bench", unit="step", dynamic_ncols=True) as bar:
        for job in jobs:
            bar.set_postfix_str(job_name(job))
            if wait_s > 0 and not wait_idle(wait_s):
                bar.write(f"{job_name(job)}: machine still busy after {wait_s:.0f} s; running anyway")
            res = run_job(job, bar, timeout)
            if job["kind"] == "bandwidth":
                bw[job["threads"]] = res
            else:
                rows.append({"engine": job["kind"], "dtype": job["dtype"], "threads": job["threads"],
                             **({"cpu_isa": job["cpu_isa"]} if "cpu_isa" in job else {}),
                             **({"tensor_parallel": job["tensor_parallel"]} if "tensor_parallel" in job else {}),
                             **res})
                bar.write(f"{job_name(job)}: {statistics.median(res['rates']):.2f} tok/s "
                          f"(runs: {', '.join(f'{x:.2f}' for x in res['rates'])})")
    return bw, rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from ssd.assets import humaneval_prompts, smollm2_gguf_path

    t_start = time.perf_counter()
    loadavg = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    model = smollm2_gguf_path()
    if args.prompt is not None:
        prompt_text, prompt_source = args.prompt, "--prompt"
    else:
        prompt_text = humaneval_prompts(args.humaneval_index + 1)[args.humaneval_index]
        prompt_source = f"HumanEval/{args.humaneval_index}"
    prompt_ids, bytes_per_token, model_info = model_facts(model, prompt_text, args.dtypes)
    if len(prompt_ids) + args.max_tokens > args.max_model_len:
        print(f"{PROG}: prompt ({len(prompt_ids)} tokens) + --max-tokens {args.max_tokens} "
              f"exceed --max-model-len {args.max_model_len}", file=sys.stderr)
        return 2
    bytes_per_token = {d: bytes_per_token[d] for d in args.dtypes}
    peer_files, tools, llamacpp_version = {}, {}, None
    if "llamacpp" in args.engines:
        from .llamacpp import LlamaCppMissing, find_tools, model_file, version

        try:
            tools = find_tools(args.llamacpp_bin)
        except LlamaCppMissing as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
        llamacpp_version = version(tools["llama-bench"])
        peer_files = {d: str(model_file(model, d, tools["llama-quantize"])) for d in args.dtypes}
    jobs = make_jobs(args, model, prompt_ids, peer_files, tools.get("llama-bench"))
    bw, rows = run_jobs(jobs, args.wait_idle, args.timeout)
    summarise(rows, bw, bytes_per_token, len(prompt_ids))
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    meta = {"model": str(model), "model_info": model_info, "prompt_source": prompt_source,
            "prompt_tokens": len(prompt_ids), "max_tokens": args.max_tokens, "repeats": args.repeats,
            "method": METHOD, "bandwidth_method": f"torch copy_ of {args.bw_mb} MB fp32, best of 5, "
            "(read + write bytes) / time", "transformers": transformers_version,
            "llamacpp": llamacpp_version, "llamacpp_files": peer_files,
            "loadavg_at_start": loadavg, "wall_seconds": round(time.perf_counter() - t_start, 1)}
    print(f"\nSmolLM2-135M-Instruct (GGUF Q4_1; dtype auto keeps its blocks), batch 1, {len(prompt_ids)}-token prompt "
          f"({prompt_source}), {args.max_tokens} new tokens, median of {args.repeats}")
    print(f"Method: {METHOD}\n")
    print(table(rows, bw, bytes_per_token, args.max_tokens))
    if args.json is not None:
        doc = {"meta": meta, "bandwidth": {str(t): v for t, v in bw.items()},
               "bytes_per_token": bytes_per_token, "results": rows}
        print(f"\nwrote {write_result(args.json, doc, command_line(['decode', *argv], BENCH_PROG))}")
    if args.plot is not None:
        from .plots import write_decode_plot
        from .record import machine

        print(f"wrote {write_decode_plot(args.plot, rows, meta, machine())}")
    print(f"total wall time: {meta['wall_seconds']:.0f} s")
    return 0
