"""``python -m ssd.bench coupling``: sd and ssd under the rejection and the Gumbel coupling.

On one pair (default: the constructed regime pair), batch 1, for every
dataset and temperature, in one process: ar (Gumbel-coupled: the reference
tokens), then sd and ssd with coupling "rejection" and "gumbel", ssd at each
SAGUARO C. Each row reports decode tok/s, acceptance, the cache hit rate and
the speed model's inputs (E_hit, E_miss: tokens per round verifying a hit and
a fallback's speculation). Every Gumbel-coupled run must reproduce ar's
tokens with the same seeds (the coupling's promise, checked on the
benchmark's own prompts). The summary gives, per point, the best sd and the
best ssd over couplings (and C), and which coupling is faster for each mode.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from tqdm import tqdm

from .core import DATASETS, BenchConfig, constructed_pair, load_prompts, run_engine
from .record import BENCH_PROG, command_line, machine, write_result

PROG = f"{BENCH_PROG} coupling"
COUPLINGS = ("rejection", "gumbel")


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="the docs' run (4 prompts x 64 tokens per dataset, T 0.7 and 1.0, "
                                        "C 1 and 0.5): about 18 min on a 2-core machine")
    ap.add_argument("--target", help="target model (HF directory or GGUF); default: the constructed regime pair")
    ap.add_argument("--draft", help="draft model (with --target)")
    ap.add_argument("--datasets", default="humaneval,mtbench", help=f"comma-separated, from {','.join(DATASETS)}")
    ap.add_argument("--num-prompts", type=int, default=4, help="prompts per dataset")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=_floats, default=[0.7, 1.0], help="comma-separated, each > 0")
    ap.add_argument("--saguaro-c", type=_floats, default=[1.0, 0.5], help="ssd's C values, comma-separated")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 prompt per dataset, 16 tokens")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the result here")
    ap.add_argument("--plot", type=Path, metavar="FILE", help="write the PNG here")
    args = ap.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        ap.error("--target/--draft: give both (or neither, for the constructed regime pair)")
    if any(t <= 0 for t in args.temperature):
        ap.error("--temperature: the couplings differ only when sampling; every value must be > 0")
    if any(not 0 <= c <= 1 for c in args.saguaro_c):
        ap.error("--saguaro-c: every value must be in [0, 1]")
    if args.quick:
        args.num_prompts, args.max_tokens = 1, 16
    return args


def plan(cs: list[float]) -> list[tuple[str, str, float]]:
    """The runs of one (dataset, temperature) point as (mode, coupling, C): ar first (the reference)."""
    runs = [("ar", "gumbel", 1.0)]
    for coupling in COUPLINGS:
        runs.append(("sd", coupling, 1.0))
        runs += [("ssd", coupling, c) for c in cs]
    return runs


def summarize(rows: list[dict]) -> list[dict]:
    """Per (dataset, temperature): the best sd and ssd over couplings (and C) and their ratio."""
    points = []
    for key in sorted({(r["dataset"], r["temperature"]) for r in rows}):
        at = [r for r in rows if (r["dataset"], r["temperature"]) == key]

        def best(mode, coupling=None):
            rs = [r for r in at if r["mode"] == mode and coupling in (None, r["coupling"])]
            return max(rs, key=lambda r: r["decode_tok_per_s"]) if rs else None

        sd, ssd = best("sd"), best("ssd")
        points.append({
            "dataset": key[0], "temperature": key[1],
            "best_sd": {"coupling": sd["coupling"], "tok_per_s": sd["decode_tok_per_s"]},
            "best_ssd": {"coupling": ssd["coupling"], "saguaro_c": ssd["saguaro_c"],
                         "tok_per_s": ssd["decode_tok_per_s"]},
            "best_ssd_over_best_sd": ssd["decode_tok_per_s"] / sd["decode_tok_per_s"],
            "gumbel_over_rejection": {
                m: best(m, "gumbel")["decode_tok_per_s"] / best(m, "rejection")["decode_tok_per_s"]
                for m in ("sd", "ssd")},
        })
    return points


def print_rows(rows: list[dict], points: list[dict], out=sys.stdout) -> None:
    head = (f"{'dataset':<9} {'T':>4} {'mode':<4} {'coupling':<9} {'C':>4} {'tok/s':>6} {'acc':>5} {'hit':>5} "
            f"{'E_hit':>5} {'E_miss':>6} {'T_p':>5} {'T_b':>5} {'=ar':>4}")
    print(head, file=out)
    print("-" * len(head), file=out)

    def f(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    for r in rows:
        spec, ssd = r["mode"] != "ar", r["mode"] == "ssd"
        same = r.get("same_tokens_as_ar")
        print(f"{r['dataset']:<9} {r['temperature']:>4.1f} {r['mode']:<4} {r['coupling'] if spec else '':<9} "
              f"{f(r['saguaro_c'], '.1f') if ssd else '':>4} {r['decode_tok_per_s']:6.2f} "
              f"{f(r['acceptance_rate'] if spec else None):>5} {f(r['cache_hit_rate'] if ssd else None):>5} "
              f"{f(r['e_hit'] if ssd else None):>5} {f(r['e_miss'] if ssd else None):>6} "
              f"{f(r['t_p'] if ssd else None):>5} {f(r['t_b'] if ssd else None):>5} "
              f"{'' if same is None else ('yes' if same else 'NO'):>4}", file=out)
    for p in points:
        g = p["gumbel_over_rejection"]
        print(f"{p['dataset']} T={p['temperature']}: best ssd ({p['best_ssd']['coupling']}, C={p['best_ssd']['saguaro_c']}) "
              f"/ best sd ({p['best_sd']['coupling']}) = {p['best_ssd_over_best_sd']:.2f}x; "
              f"gumbel/rejection: sd {g['sd']:.2f}x, ssd {g['ssd']:.2f}x", file=out)
    differ = [r for r in rows if r.get("same_tokens_as_ar") is False]
    if differ:
        print("WARNING: Gumbel-coupled runs that did not reproduce ar's tokens: " +
              ", ".join(f"{r['dataset']} T={r['temperature']} {r['mode']} C={r['saguaro_c']}" for r in differ),
              file=out)


def main(argv: list[str]) -> int:
    import torch

    from ssd import models

    args = parse_args(argv)
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = [d for d in datasets if d not in DATASETS]
    if unknown or not datasets:
        print(f"{PROG}: --datasets: unknown {unknown} (choose from {', '.join(DATASETS)})", file=sys.stderr)
        return 2
    pair = (constructed_pair(0.75, 0.25) if args.target is None
            else {"constructed": False, "target": args.target, "draft": args.draft})
    target, draft = models.load(pair["target"], dtype=torch.float32), models.load(pair["draft"], dtype=torch.float32)
    base = BenchConfig(target=pair["target"], draft=pair["draft"], datasets=datasets, num_prompts=args.num_prompts,
                       max_tokens=args.max_tokens, k=args.k, same_total_hardware=False)
    prompts = {d: load_prompts(d, args.num_prompts, target.tokenizer, 0, target.config.vocab_size) for d in datasets}
    todo = [(d, t, *run) for d in datasets for t in args.temperature for run in plan(args.saguaro_c)]
    rows = []
    for d, t, mode, coupling, c in tqdm(todo, desc="coupling runs"):
        cfg = dataclasses.replace(base, coupling=coupling, saguaro_c=c)
        try:
            r = run_engine(target, draft, mode, prompts[d], cfg, 1, t, cfg.target_threads, label=f"{d} T{t} {coupling}")
        except ValueError as exc:  # a combination the engine refuses (it says why)
            print(f"{PROG}: {d} T={t} {mode} {coupling} C={c}: skipped: {exc}", file=sys.stderr)
            continue
        r["dataset"] = d
        rows.append(r)
    for r in rows:
        ar = next((a for a in rows if a["mode"] == "ar" and (a["dataset"], a["temperature"]) == (r["dataset"], r["temperature"])),
                  None)
        checked = ar is not None and r["mode"] != "ar" and r["coupling"] == "gumbel"
        r["same_tokens_as_ar"] = r["token_ids"] == ar["token_ids"] if checked else None
    for r in rows:
        del r["token_ids"]
    points = summarize(rows)
    print_rows(rows, points)
    means = {(m, cp): statistics.mean(r["decode_tok_per_s"] for r in rows
                                      if r["mode"] == m and r["coupling"] == cp and (m == "sd" or r["saguaro_c"] == 1.0))
             for m in ("sd", "ssd") for cp in COUPLINGS}
    doc = {"pair": pair, "config": {**vars(args), "json": str(args.json), "plot": str(args.plot), "datasets": datasets},
           "runs": rows, "points": points,
           "mean_tok_per_s_c1": {f"{m}_{cp}": v for (m, cp), v in means.items()}, "machine": machine()}
    if args.json:
        print(f"wrote {write_result(args.json, doc, command_line(['coupling', *argv], BENCH_PROG))}")
    if args.plot:
        from .plots import write_coupling_plot

        print(f"wrote {write_coupling_plot(args.plot, rows)}")
    return 1 if any(r.get("same_tokens_as_ar") is False for r in rows) else 0
