"""``python -m ssd.bench adaptive``: the engine's adaptive speculation against the fixed modes.

On one pair (default: the constructed regime pair), at every point (dataset,
temperature, batch) of the grid, with one full batch of prompts per wave and
at least --min-prompts prompts per point (more waves at small batches, where
one prompt's few seconds of decoding would be the whole measurement), six
variants run back to back: ar (target on 1 thread), ar on 2 threads
(reported beside, not a fixed mode below), sd and ssd fixed (adaptive=False),
and sd and ssd adaptive (adaptive=True, the engine's default). Every variant
but "ar 2thr" gives the target 1 thread and the draft 1 thread. Repetitions
are interleaved (each rep runs every point, each point every variant) so that
drift of the machine spreads over the variants; each variant reports its
median decode tok/s over reps, and the acceptance, hit rate and adaptive_*
counters of its median rep (the lower median for an even number of reps).

Per point, best fixed = max(ar, sd, ssd) (1-thread target), spread = best
fixed / min fixed - 1 and ratio = ssd adaptive / best fixed. Criteria (the
constants below): ratio >= 0.90 at every point; ratio >= 0.95 where the fixed
modes differ, spread > 0.05; at batch 1 and temperature 0, ssd adaptive >= 0.97x
ssd fixed and >= 1.5x ar; at temperature 0 every variant reproduces ar's tokens
(its failure is printed loudly, and only it makes the exit status 1).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from tqdm import tqdm

from ssd.config import EngineConfig

from .core import DATASETS, BenchConfig, constructed_pair, load_prompts, run_engine
from .record import BENCH_PROG, command_line, machine, write_result

PROG = f"{BENCH_PROG} adaptive"
# name -> (mode, EngineConfig.adaptive (None: ar), target threads)
VARIANTS = {"ar": ("ar", None, 1), "ar 2thr": ("ar", None, 2), "sd": ("sd", False, 1), "ssd": ("ssd", False, 1),
            "sd adaptive": ("sd", True, 1), "ssd adaptive": ("ssd", True, 1)}
FIXED = ("ar", "sd", "ssd")  # the fixed modes on the 1-thread target, over which best_fixed is taken
WARMUP_PROMPT_LEN = 16  # default --warmup-prompt-len: the warm-up batch's prompts cut to 16 tokens (a cheap prefill)
# The criteria, in one place.
MIN_RATIO = 0.90  # ssd adaptive / best fixed, at every point
MIN_RATIO_SPREAD = 0.95  # ... where the fixed modes differ by more than SPREAD
SPREAD = 0.05
MIN_B1_T0_OVER_SSD = 0.97  # batch 1, temperature 0: ssd adaptive / ssd fixed
MIN_B1_T0_OVER_AR = 1.5  # batch 1, temperature 0: ssd adaptive / ar
# option -> (default, --quick's); an option given explicitly wins over both.
DEFAULTS = {"batches": ([1, 2, 4, 8, 16], [1, 2]), "temperatures": ([0.0, 1.0], [0.0]),
            "datasets": (["humaneval", "mtbench"], ["mtbench"]), "reps": (3, 1), "max_tokens": (32, 8),
            "min_prompts": (4, 1)}


def _list(kind):
    def parse(text: str):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values
    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target model (HF directory or GGUF); default: the constructed regime pair")
    ap.add_argument("--draft", help="draft model (with --target)")
    ap.add_argument("--batch", "--batches", dest="batches", type=_list(int), metavar="B,...", help="default 1,2,4,8,16")
    ap.add_argument("--temperature", "--temperatures", dest="temperatures", type=_list(float), metavar="T,...",
                    help="default 0,1")
    ap.add_argument("--datasets", type=_list(str), metavar="D,...",
                    help=f"default humaneval,mtbench; from {','.join(DATASETS)}")
    ap.add_argument("--waves", type=int, default=1, help="full batches of prompts per point (at least)")
    ap.add_argument("--min-prompts", type=int, metavar="N",
                    help="prompts per point at least: a batch below N runs ceil(N / batch) waves (default 4)")
    ap.add_argument("--reps", type=int, help="repetitions, interleaved (default 3)")
    ap.add_argument("--max-tokens", type=int, help="new tokens per prompt (default 32)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--coupling", default=EngineConfig.coupling, choices=["rejection", "gumbel"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", type=_list(str), default=list(VARIANTS), metavar="V,...",
                    help=f"which variants run (default all: {','.join(VARIANTS)})")
    ap.add_argument("--warmup-tokens", type=int, default=16,
                    help="tokens of the untimed warm-up generation (one full batch) before each timed run")
    ap.add_argument("--warmup-prompt-len", type=int, default=WARMUP_PROMPT_LEN, metavar="N",
                    help="the warm-up's prompts: the first batch's cut to N tokens (default %(default)s, a cheap "
                         "prefill), or 0: whole prompts past the timed ones (the timed run's context; their prefill "
                         "made the default sweep about 40 %% longer)")
    ap.add_argument("--quick", action="store_true", help="smoke run: batches 1,2, T 0, mtbench, 1 rep, 8 tokens")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the result here")
    ap.add_argument("--plot", type=Path, metavar="FILE", help="write the PNG here")
    args = ap.parse_args(argv)
    for name, (full, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if (args.target is None) != (args.draft is None):
        ap.error("--target/--draft: give both (or neither, for the constructed regime pair)")
    if args.warmup_prompt_len < 0:
        ap.error(f"--warmup-prompt-len: must be >= 0 (0: whole prompts), got {args.warmup_prompt_len}")
    if any(b < 1 for b in args.batches):
        ap.error(f"--batch: every batch size must be >= 1, got {args.batches}")
    if any(t < 0 for t in args.temperatures):
        ap.error(f"--temperature: every temperature must be >= 0, got {args.temperatures}")
    missing = [v for v in args.variants if v not in VARIANTS]
    if missing:
        ap.error(f"--variants: unknown {','.join(missing)} (choose from {','.join(VARIANTS)})")
    if "ar" not in args.variants:
        ap.error("--variants: 'ar' is the reference every other variant is checked against; keep it")
    unknown = [d for d in args.datasets if d not in DATASETS]
    if unknown:
        ap.error(f"--datasets: unknown {','.join(unknown)} (choose from {','.join(DATASETS)})")
    for name, low in (("reps", 1), ("waves", 1), ("min_prompts", 1), ("k", 1), ("max_tokens", 2)):
        if getattr(args, name) < low:
            ap.error(f"--{name.replace('_', '-')}: must be >= {low}, got {getattr(args, name)}")
    return args


def waves_at(batch: int, waves: int, min_prompts: int) -> int:
    """Full batches of prompts a point of this batch size runs: --waves, or more to reach min_prompts."""
    return max(waves, -(-min_prompts // batch))


def grid(datasets: list[str], temperatures: list[float], batches: list[int]) -> list[tuple[str, float, int]]:
    """The points (dataset, temperature, batch), in the order they run and print."""
    return [(d, t, b) for d in datasets for t in temperatures for b in batches]


def plan(points: list[tuple], reps: int, variants=tuple(VARIANTS)) -> list[tuple[int, tuple, str]]:
    """Every run as (rep, point, variant), interleaved: each rep runs every point, each point every variant."""
    return [(rep, point, v) for rep in range(reps) for point in points for v in VARIANTS if v in variants]


def check_tokens(runs: list[dict]) -> None:
    """Sets same_tokens_as_ar on each run at temperature 0 (None elsewhere and on ar, the reference), comparing
    with ar's run of the same rep and point, and drops the token ids."""
    ar = {(r["rep"], r["dataset"], r["temperature"], r["batch_size"]): r for r in runs if r["variant"] == "ar"}
    for r in runs:
        ref = ar.get((r["rep"], r["dataset"], r["temperature"], r["batch_size"]))
        checked = r["temperature"] == 0 and r["variant"] != "ar" and ref is not None
        r["same_tokens_as_ar"] = r["token_ids"] == ref["token_ids"] if checked else None
    for r in runs:
        r.pop("token_ids", None)


def aggregate(runs: list[dict]) -> list[dict]:
    """One entry per (point, variant): every rep's decode tok/s, their median, and from the median rep
    (the lower median) acceptance, hit rate, the adaptive_* counters and what they give."""
    out = []
    keys = sorted({(r["dataset"], r["temperature"], r["batch_size"]) for r in runs})
    for key in keys:
        for v in VARIANTS:
            reps = sorted((r for r in runs if (r["dataset"], r["temperature"], r["batch_size"]) == key
                           and r["variant"] == v), key=lambda r: r["rep"])
            if not reps:
                continue
            tok = [r["decode_tok_per_s"] for r in reps]
            median = statistics.median(tok)
            mid = next(r for r in reps if r["decode_tok_per_s"] == statistics.median_low(tok))
            counters = mid.get("counters", {})
            ad = {k: val for k, val in counters.items() if k.startswith("adaptive_")}
            same = [r.get("same_tokens_as_ar") for r in reps if r.get("same_tokens_as_ar") is not None]
            out.append({
                "dataset": key[0], "temperature": key[1], "batch_size": key[2], "variant": v,
                "median_tok_per_s": median, "tok_per_s_reps": tok, "median_rep": mid["rep"],
                "acceptance_rate": mid.get("acceptance_rate"), "cache_hit_rate": mid.get("cache_hit_rate"),
                "adaptive_counters": ad,
                "switches_per_100_steps": (100 * ad["adaptive_switches"] / ad["adaptive_steps"]
                                           if "adaptive_switches" in ad and ad.get("adaptive_steps") else None),
                "decision_fraction": (ad["adaptive_decision_seconds"] / counters["active_seconds"] if
                                      "adaptive_decision_seconds" in ad and counters.get("active_seconds") else None),
                "same_tokens_as_ar": all(same) if same else None})
    return out


def _ratio(num, den):
    return num / den if num is not None and den else None


def summarize(entries: list[dict]) -> list[dict]:
    """Per point: the variants' medians, best fixed, spread, the adaptive ratios and the criteria."""
    points = []
    for key in sorted({(e["dataset"], e["temperature"], e["batch_size"]) for e in entries}):
        at = {e["variant"]: e for e in entries if (e["dataset"], e["temperature"], e["batch_size"]) == key}
        tok = {v: e["median_tok_per_s"] for v, e in at.items()}
        fixed = {v: tok[v] for v in FIXED if v in tok}
        best = max(fixed, key=fixed.get) if fixed else None
        best_tok = fixed.get(best)
        spread = best_tok / min(fixed.values()) - 1 if fixed and min(fixed.values()) > 0 else None
        ratio = _ratio(tok.get("ssd adaptive"), best_tok)
        dataset, temperature, batch = key
        p = {"dataset": dataset, "temperature": temperature, "batch_size": batch, "tok_per_s": tok,
             "best_fixed": best, "best_fixed_tok_per_s": best_tok, "spread": spread, "ratio": ratio,
             "sd_adaptive_ratio": _ratio(tok.get("sd adaptive"), best_tok),
             "ssd_adaptive_over_ssd": _ratio(tok.get("ssd adaptive"), tok.get("ssd")) if batch == 1 else None,
             "ssd_adaptive_over_ar": _ratio(tok.get("ssd adaptive"), tok.get("ar")) if batch == 1 else None}
        checks = {f"ratio >= {MIN_RATIO}": ratio is not None and ratio >= MIN_RATIO}
        if spread is not None and spread > SPREAD:
            checks[f"ratio >= {MIN_RATIO_SPREAD} (spread > {SPREAD})"] = (ratio is not None
                                                                          and ratio >= MIN_RATIO_SPREAD)
        if batch == 1 and temperature == 0:
            for name, low in (("ssd_adaptive_over_ssd", MIN_B1_T0_OVER_SSD),
                              ("ssd_adaptive_over_ar", MIN_B1_T0_OVER_AR)):
                checks[f"{name} >= {low}"] = p[name] is not None and p[name] >= low
        if temperature == 0:
            checks["same tokens as ar"] = all(e["same_tokens_as_ar"] is not False for e in at.values())
        points.append({**p, "checks": checks, "pass": all(checks.values())})
    return points


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_summary(entries: list[dict], points: list[dict], out=sys.stdout) -> bool:
    """The table of points, the adaptive variants' details and the verdicts; returns whether all passed."""
    names = [v.replace(" adaptive", " ad") for v in VARIANTS]
    head = (f"{'dataset':<9} {'T':>3} {'B':>3} " + " ".join(f"{n:>8}" for n in names) +
            f" {'best':>4} {'spread':>6} {'ratio':>5} {'sd ratio':>8} {'verdict':<7}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for p in points:
        print(f"{p['dataset']:<9} {p['temperature']:>3g} {p['batch_size']:>3} " +
              " ".join(f"{_f(p['tok_per_s'].get(v)):>8}" for v in VARIANTS) +
              f" {p['best_fixed'] or '-':>4} {_f(p['spread']):>6} {_f(p['ratio']):>5} {_f(p['sd_adaptive_ratio']):>8} "
              f"{'PASS' if p['pass'] else 'FAIL':<7}", file=out)
        if p["ssd_adaptive_over_ssd"] is not None:
            print(f"{'':>17} batch 1: ssd ad / ssd {_f(p['ssd_adaptive_over_ssd'])}, "
                  f"ssd ad / ar {_f(p['ssd_adaptive_over_ar'])}", file=out)
        for name, ok in p["checks"].items():
            if not ok:
                print(f"{'':>17} FAIL: {name}", file=out)
    print("\nmedian rep: variant, acceptance, hit rate (ssd), switches/100 steps, decision time / active time",
          file=out)
    for e in entries:
        mode = VARIANTS[e["variant"]][0]
        if mode != "ar":
            print(f"  {e['dataset']:<9} T={e['temperature']:g} B={e['batch_size']:<3} {e['variant']:<12} "
                  f"acc {_f(e['acceptance_rate'])} hit {_f(e['cache_hit_rate'] if mode == 'ssd' else None)} "
                  f"sw/100 {_f(e['switches_per_100_steps'], '.1f')} dec {_f(e['decision_fraction'], '.3f')}",
                  file=out)
    differ = [e for e in entries if e["same_tokens_as_ar"] is False]
    if differ:
        print("\nFAIL: AT TEMPERATURE 0 THESE VARIANTS DID NOT REPRODUCE AR'S TOKENS: " +
              ", ".join(f"{e['dataset']} B={e['batch_size']} {e['variant']}" for e in differ), file=out)
    ok = bool(points) and all(p["pass"] for p in points)
    print(f"\noverall: {'PASS' if ok else 'FAIL'} ({sum(p['pass'] for p in points)}/{len(points)} points)", file=out)
    return ok


def main(argv: list[str]) -> int:
    args = parse_args(argv)  # before torch loads: --help and bad options answer at once
    import torch

    from ssd import models

    base = dataclasses.replace(BenchConfig(), target=args.target, draft=args.draft, datasets=args.datasets,
                               batches=args.batches, temperatures=args.temperatures, max_tokens=args.max_tokens,
                               k=args.k, coupling=args.coupling, seed=args.seed, target_threads=1,
                               draft_threads=1, same_total_hardware=False)
    pair = (constructed_pair(base.regime_acceptance, base.regime_cost_ratio) if args.target is None
            else {"constructed": False, "target": args.target, "draft": args.draft})
    target, draft = models.load(pair["target"], dtype=torch.float32), models.load(pair["draft"], dtype=torch.float32)
    # One full batch per wave; a dataset's first n prompts are the same for every n, so load the most once.
    num_prompts = {b: b * waves_at(b, args.waves, args.min_prompts) for b in args.batches}
    most = max(num_prompts.values())
    whole = args.warmup_prompt_len == 0  # then the warm-up's prompts follow the timed ones
    prompts = {d: load_prompts(d, most + (max(args.batches) if whole else 0), target.tokenizer, args.seed,
                               target.config.vocab_size) for d in args.datasets}
    runs = []
    for rep, (d, t, b), v in tqdm(plan(grid(args.datasets, args.temperatures, args.batches), args.reps,
                                       args.variants),
                                  desc="adaptive runs"):
        mode, adaptive, threads = VARIANTS[v]
        n = num_prompts[b]
        cfg = dataclasses.replace(base, num_prompts=n)
        # The untimed warm-up is one full batch, so every variant's timed run starts warm at its
        # batch (the adaptive policy as it would be after a server's first requests at that load).
        warm = (prompts[d][most:most + b] if whole else
                [p[:args.warmup_prompt_len] for p in prompts[d][:b]])
        r = run_engine(target, draft, mode, prompts[d][:n], cfg, b, t, threads,
                       label=f"{d} T{t:g} B{b} rep{rep} {v}", adaptive=adaptive, warmup_set=warm,
                       warmup_tokens=args.warmup_tokens)
        runs.append({**r, "dataset": d, "variant": v, "rep": rep})
    check_tokens(runs)
    entries = aggregate(runs)
    points = summarize(entries)
    ok = print_summary(entries, points)
    thresholds = {"min_ratio": MIN_RATIO, "min_ratio_spread": MIN_RATIO_SPREAD, "spread": SPREAD,
                  "min_b1_t0_over_ssd": MIN_B1_T0_OVER_SSD, "min_b1_t0_over_ar": MIN_B1_T0_OVER_AR}
    config = {**vars(args), "json": args.json and str(args.json), "plot": args.plot and str(args.plot),
              "variants": VARIANTS, "thresholds": thresholds}
    doc = {"pair": pair, "config": config,
           "runs": runs, "variants": entries, "points": points, "pass": ok, "machine": machine()}
    if args.json:
        print(f"wrote {write_result(args.json, doc, command_line(['adaptive', *argv], BENCH_PROG))}")
    if args.plot:
        from .plots import write_adaptive_plot

        print(f"wrote {write_adaptive_plot(args.plot, points)}")
    return 1 if any(e["same_tokens_as_ar"] is False for e in entries) else 0
