"""python -m ssd.bench: the one entry point of the project's benchmarks (``python -m ssd.bench --help``).

Without a subcommand it runs the default benchmark (``ssd.bench``'s docstring);
``decode``, ``contention`` and ``fallback`` are the others, and the kernel benchmarks stay
scripts in the source tree (listed in the help's epilog).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ssd.cli import _budget, _fanout  # the engine options' parsers, shared with `ssd`
from ssd.config import EngineConfig

from .core import DATASETS, MODES, BenchConfig, run_bench
from .record import BENCH_PROG, command_line, write_result

# name -> (module with main(argv), its arguments in the listing, what it measures)
SUBCOMMANDS = {
    "decode": ("ssd.bench.decode", "[--quick] [--json FILE] [--plot FILE]",
               "batch-1 decode tok/s of ssd beside transformers on SmolLM2-135M, and the memory-bandwidth bound"),
    "contention": ("ssd.bench.contention", "[--runs N] [--json FILE]",
                   "batch-1 bf16 decode tok/s on 1 and 2 threads, alone and beside a competing busy process"),
    "serve": ("ssd.bench.serve", "[--url URL | --modes ar,sd,ssd] [--rates R,...] [--json FILE] [--plot FILE]",
              "TTFT, inter-token latency and output tok/s of ssd serve under Poisson request rates"),
    "gpu": ("ssd.bench.gpu", "[--device cuda|cpu] [--shapes llama|tiny] [--contexts N ...] [--json FILE]",
            "ar, sd and ssd at batch 1 and 4 on a 1B draft and a target of an 8B's bytes built from it, "
            "made on the device; ar against the bandwidth bound at contexts 1K-16K, prefill, kernel time"),
    "fallback": ("ssd.bench.fallback", "--auto FILE [--json FILE] [--plot FILE]",
                 "ssd with the neural and the fast cache-miss fallback forced, beside a default run's auto"),
    "coupling": ("ssd.bench.coupling", "[--temperature 0.7,1.0] [--saguaro-c 1,0.5] [--json FILE] [--plot FILE]",
                 "sd and ssd under the rejection and the Gumbel coupling: acceptance, hit rate, tok/s"),
    "adaptive": ("ssd.bench.adaptive", "[--quick] [--batch 1,2,4,8,16] [--reps N] [--json FILE] [--plot FILE]",
                 "adaptive sd and ssd against the fixed modes over batch sizes: median tok/s, PASS/FAIL criteria"),
}
# bench/kernels/<script> -> (its arguments, what it measures); run from the source tree's root.
KERNEL_BENCHES = {
    "bench_paged_attention.py": ("[--quick] [--json FILE]", "paged_attention: time, bandwidth, GFLOP/s"),
    "bench_fork_attention.py": ("[--quick] [--json FILE]", "fork_attention (one tree-decode step)"),
    "bench_fork_select.py": ("[--json FILE]", "fork_select"),
    "bench_saguaro_sample.py": ("[--json FILE]", "saguaro_sample (SAGUARO sampling)"),
    "bench_verify.py": ("[--json FILE] [--repeats N]", "verify (rejection sampling)"),
    "bench_gumbel_sample.py": ("[--json FILE]", "gumbel_sample and gumbel_top (the Gumbel coupling's draw, the tree's ranking)"),
    "bench_kv_commit.py": ("[--json FILE]", "kv_commit: time and bytes moved"),
    "bench_forward_rows.py": ("[--dtypes ...] [--cpu-isas ...] [--threads N] [--json FILE]",
                              "one forward of m new rows per dtype and instruction set (verify and prefill cost)"),
}


def epilog() -> str:
    lines = ["every benchmark of the project:",
             f"  {BENCH_PROG} [options]",
             "      this one: AR, SD and SSD side by side, beside the speed model (a list for",
             "      --regime-acceptance or --regime-cost-ratio sweeps constructed pairs)"]
    for name, (_, usage, what) in SUBCOMMANDS.items():
        lines += [f"  {BENCH_PROG} {name} {usage}", f"      {what}"]
    lines.append("  kernel benchmarks (scripts in the source tree, over the installed ssd; run from its root):")
    for script, (usage, what) in KERNEL_BENCHES.items():
        lines += [f"  python bench/kernels/{script} {usage}", f"      {what}"]
    lines += ["", f"{BENCH_PROG} SUBCOMMAND --help describes a subcommand. Every JSON result records the",
              "command that produced it and the machine (\"command\", \"machine\")."]
    return "\n".join(lines)


def _list(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}: {text!r}") from exc
    return parse


def _regime(name: str):
    """One value or a comma-separated sweep of a regime parameter, each inside regime_pair's range."""
    def parse(text: str):
        from ssd.testing.regime import ACCEPTANCE_RANGE, COST_RATIO_RANGE

        values = _list(float)(text)
        lo, hi = ACCEPTANCE_RANGE if name == "acceptance" else COST_RATIO_RANGE
        bad = [v for v in values if not lo < v < hi]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"every value must be in ({lo}, {hi}), got {text!r}")
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"a value repeats in {text!r}")
        return values
    return parse


def parse_args(argv=None) -> tuple[BenchConfig, argparse.Namespace]:
    usage = f"%(prog)s [options]  (the default run)\n       %(prog)s {{{','.join(SUBCOMMANDS)}}} ..."
    ap = argparse.ArgumentParser(prog=BENCH_PROG, usage=usage, epilog=epilog(), allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="AR, SD and SSD side by side on real prompts, beside the speed model.")
    ap.add_argument("--target", help="target model (HF directory or GGUF); default: the constructed regime pair")
    ap.add_argument("--draft", help="draft model (with --target)")
    ap.add_argument("--regime-acceptance", type=_regime("acceptance"), default=[0.75],
                    help="constructed pair: teacher-forced agreement; a comma-separated list sweeps it")
    ap.add_argument("--regime-cost-ratio", type=_regime("cost_ratio"), default=[0.25],
                    help="constructed pair: draft cost / target cost; a comma-separated list sweeps it")
    ap.add_argument("--datasets", type=_list(str), default=["humaneval", "mtbench"],
                    help=f"comma-separated, from {','.join(DATASETS)}")
    ap.add_argument("--num-prompts", type=int, default=4, help="prompts per dataset")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=_list(int), default=[1], help="batch sizes, e.g. 1,2,4,8")
    ap.add_argument("--temperature", type=_list(float), default=[0.0], help="e.g. 0,0.7,1.0")
    ap.add_argument("--modes", type=_list(str), default=list(MODES))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--fanout", type=_fanout, default="confidence",
                    help="'confidence' (greedy sequences: the most likely outcomes by the draft's calibrated "
                         "confidence), 'geometric' (SAGUARO's F_j) or F_0,..,F_K")
    ap.add_argument("--fanout-budget", type=_budget, default="auto")
    ap.add_argument("--saguaro-c", type=float, default=1.0)
    ap.add_argument("--fallback", default="auto", choices=["auto", "neural", "fast"])
    ap.add_argument("--coupling", default=EngineConfig.coupling, choices=["rejection", "gumbel"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "auto"],
                    help="weight storage of target and draft (ssd.models.quantized; default float32)")
    ap.add_argument("--target-threads", type=int, default=1)
    ap.add_argument("--draft-threads", type=int, default=1)
    ap.add_argument("--no-same-total-hardware", action="store_true",
                    help="skip the ar/sd reruns on target + draft threads")
    ap.add_argument("--peers", type=_list(str), default=[], help="'hf': transformers generate + assisted generation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 prompt per dataset, 24 tokens")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plots", help="write PNG plots into this directory")
    args = ap.parse_args(argv)
    # 1-D sweeps only, and only over constructed pairs.
    swept = [opt for opt, values in (("--regime-acceptance", args.regime_acceptance),
                                     ("--regime-cost-ratio", args.regime_cost_ratio)) if len(values) > 1]
    if len(swept) > 1:
        ap.error("--regime-acceptance and --regime-cost-ratio: sweep one at a time (1-D sweeps only); "
                 "give the other a single value")
    if swept and (args.target or args.draft):
        ap.error(f"{swept[0]}: a list sweeps constructed regime pairs; it cannot be combined with --target/--draft")
    # A single value stays a plain number (the config and JSON as without a sweep).
    acceptance, cost_ratio = (v if len(v) > 1 else v[0] for v in (args.regime_acceptance, args.regime_cost_ratio))
    cfg = BenchConfig(target=args.target, draft=args.draft, regime_acceptance=acceptance,
                      regime_cost_ratio=cost_ratio, datasets=args.datasets,
                      num_prompts=args.num_prompts, max_tokens=args.max_tokens, batches=args.batch,
                      temperatures=args.temperature, modes=args.modes, k=args.k, fanout=args.fanout,
                      fanout_budget=args.fanout_budget, saguaro_c=args.saguaro_c, fallback=args.fallback,
                      coupling=args.coupling,
                      dtype=args.dtype, target_threads=args.target_threads, draft_threads=args.draft_threads,
                      same_total_hardware=not args.no_same_total_hardware, peers=args.peers, seed=args.seed)
    if args.quick:
        cfg.num_prompts, cfg.max_tokens = 1, 24
    return cfg, args


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def pair_tag(parameter: str, value: float) -> str:
    """Short name of a sweep's pair in the table: 'acc=0.5' or 'cost=0.1'."""
    return f"{'acc' if parameter == 'acceptance' else 'cost'}={value:g}"


def _table(cols, out):
    """Prints the header of a fixed-width table of (name, width, align) columns; returns its row formatter."""
    def row(values):
        return " ".join(f"{str(v)[:w]:{a}{w}}" for v, (_, w, a) in zip(values, cols))

    head = row([c[0] for c in cols])
    print(head, file=out)
    print("-" * len(head), file=out)
    return row


def print_table(result: dict, out=sys.stdout) -> None:
    cfg, sweep = result["config"], result.get("sweep")
    if sweep is None:
        pairs = [result["pair"]]
        pair = result["pair"]
        label = pair.get("label") or f"{pair['target']} / {pair['draft']}"
        print(f"pair: {label}", file=out)
    else:
        pairs = result["pairs"]
        (fixed_name, fixed_value), = sweep["fixed"].items()
        print(f"pairs: CONSTRUCTED regime pairs (not published models), {sweep['parameter']} swept over "
              f"{','.join(format(v, 'g') for v in sweep['values'])} at {fixed_name} {fixed_value:g}", file=out)
    for pair in pairs:
        if pair.get("constructed"):
            lead = ("     " if sweep is None
                    else f"  {pair_tag(sweep['parameter'], pair['requested'][sweep['parameter']])}:")
            print(f"{lead} requested acceptance {pair['requested']['acceptance']}, cost ratio "
                  f"{pair['requested']['cost_ratio']}; measured agreement {pair['measured']['agreement']:.3f}",
                  file=out)
    # Results saved before EngineConfig.coupling existed ran what is now "rejection".
    print(f"k={cfg['k']} fanout={cfg['fanout']} budget={cfg['fanout_budget']} C={cfg['saguaro_c']} "
          f"fallback={cfg['fallback']} coupling={cfg.get('coupling', 'rejection')} dtype={cfg['dtype']} "
          f"max_tokens={cfg['max_tokens']} "
          f"prompts/dataset={cfg['num_prompts']}", file=out)
    cols = [("dataset", 9, "<"), ("B", 2, ">"), ("T", 4, ">"), ("mode", 11, "<"), ("placement", 38, "<"),
            ("dec tok/s", 9, ">"), ("pred", 8, ">"), ("x AR", 5, ">"), ("pred x", 6, ">"), ("e2e", 8, ">"),
            ("ttft", 5, ">"), ("acc", 5, ">"), ("len", 4, ">"), ("hit", 4, ">"), ("busy", 4, ">"),
            ("T_p", 4, ">"), ("T_b", 4, ">"), ("nrl", 4, ">"), ("fast", 4, ">")]

    # In a sweep every row starts with the pair it ran on (its swept value).
    def value_of(r):
        return (r[f"regime_{sweep['parameter']}"],) if sweep else ()

    def tag(r):
        return [pair_tag(sweep["parameter"], v) for v in value_of(r)]

    if sweep:
        cols.insert(0, ("pair", 9, "<"))

    row = _table(cols, out)
    for r in result["runs"]:
        spec, ssd = r["mode"] != "ar", r["mode"] == "ssd"
        print(row(tag(r) + [r["dataset"], r["batch_size"], f"{r['temperature']:.1f}", r["mode"], r["placement"],
                            f"{r['decode_tok_per_s']:.2f}", _f(r["predicted_tok_per_s"]), _f(r["measured_speedup"]),
                            _f(r["predicted_speedup_isolated"]), f"{r['e2e_tok_per_s']:.2f}", f"{r['ttft_s']:.2f}",
                            _f(r["acceptance_rate"] if spec else None), _f(r["mean_accepted_len"] if spec else None),
                            _f(r["cache_hit_rate"] if ssd else None), f"{r['target_busy_fraction']:.2f}",
                            _f(r["t_p"] if ssd else None), _f(r["t_b"] if ssd else None),
                            r["counters"]["fallback_neural"], r["counters"]["fallback_fast"]]), file=out)
    for p in result["peers"]:
        print(row(tag(p) + [p["dataset"], p["batch_size"], f"{p['temperature']:.1f}", p["peer"],
                            f"torch {p['threads']} thr", f"{p['decode_tok_per_s']:.2f}", "", "", "",
                            f"{p['e2e_tok_per_s']:.2f}", f"{p['ttft_s']:.2f}"]), file=out)
    differ = [r for r in result["runs"] if r.get("same_tokens_as_ar") is False]
    if differ:
        print("WARNING: at temperature 0 these runs did not reproduce ar's tokens: " +
              ", ".join(" ".join(tag(r) + [f"{r['dataset']} B={r['batch_size']} {r['mode']}"]) for r in differ),
              file=out)
    elif any(r.get("same_tokens_as_ar") for r in result["runs"]):
        print("temperature 0: every mode produced ar's tokens", file=out)
    print_headlines(result["runs"], sweep, value_of, out)
    if sweep:
        print_sweep(sweep, out)


def print_headlines(runs: list[dict], sweep: dict | None, value_of, out=sys.stdout) -> None:
    """One line per (pair when sweeping, dataset, batch, temperature): SSD against SD and the best of
    AR and SD, the speed model's error, and the best mode on the same total hardware."""
    keys = sorted({(*value_of(r), r["dataset"], r["batch_size"], r["temperature"]) for r in runs})
    for key in keys:
        rs = {(r["mode"], r["same_total_hardware"]): r for r in runs
              if (*value_of(r), r["dataset"], r["batch_size"], r["temperature"]) == key}
        ssd, sd, ar = rs.get(("ssd", False)), rs.get(("sd", False)), rs.get(("ar", False))
        if not (ssd and sd and ar):
            continue
        dataset, batch, temperature = key[-3:]
        line = (f"{pair_tag(sweep['parameter'], key[0]) + ' ' if sweep else ''}{dataset} B={batch} T={temperature}: "
                f"SSD/SD {ssd['decode_tok_per_s'] / sd['decode_tok_per_s']:.2f}x, "
                f"SSD/max(AR,SD) {ssd['decode_tok_per_s'] / max(sd['decode_tok_per_s'], ar['decode_tok_per_s']):.2f}x")
        if ssd["predicted_speedup_isolated"]:
            err = ssd["measured_speedup"] / ssd["predicted_speedup_isolated"] - 1
            line += f", SSD speedup over AR measured {ssd['measured_speedup']:.2f}x vs model " \
                    f"{ssd['predicted_speedup_isolated']:.2f}x ({err:+.0%})"
        total = [rs.get((m, True)) for m in ("ar", "sd")]
        total = [t for t in total if t]
        if total:
            best = max(total, key=lambda t: t["decode_tok_per_s"])
            line += (f"; same total hardware: best {best['mode']} on {best['target_threads']} thr "
                     f"{best['decode_tok_per_s']:.2f} tok/s -> SSD {ssd['decode_tok_per_s'] / best['decode_tok_per_s']:.2f}x")
        print(line, file=out)


def print_sweep(sweep: dict, out=sys.stdout) -> None:
    """The sweep's points: SSD over SD and over max(AR, SD), measured and from the speed model."""
    (fixed_name, fixed_value), = sweep["fixed"].items()
    print(f"\nsweep over {sweep['parameter']} ({fixed_name} {fixed_value:g}; CONSTRUCTED regime pairs); "
          "target's own hardware, pred = speed model", file=out)
    cols = [("pair", 9, "<"), ("agree", 5, ">"), ("dataset", 9, "<"), ("B", 2, ">"), ("T", 4, ">"),
            ("SSD/SD", 6, ">"), ("pred", 6, ">"), ("SSD/best", 8, ">"), ("pred", 6, ">"), ("best", 4, "<")]

    row = _table(cols, out)
    for pt in sweep["points"]:
        print(row([pair_tag(sweep["parameter"], pt["value"]), _f(pt["regime_agreement"], ".3f"), pt["dataset"],
                   pt["batch_size"], f"{pt['temperature']:.1f}", _f(pt["ssd_over_sd"]),
                   _f(pt["predicted_ssd_over_sd"]), _f(pt["ssd_over_best"]), _f(pt["predicted_ssd_over_best"]),
                   pt["best_mode"] or "-"]), file=out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]][0]).main(argv[1:])
    cfg, args = parse_args(argv)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"python -m ssd.bench: {exc}", file=sys.stderr)
        return 2
    result = run_bench(cfg)
    print_table(result)
    if args.json:
        print(f"wrote {write_result(args.json, result, command_line(argv, BENCH_PROG))}")
    if args.plots:
        from .plots import write_plots

        for path in write_plots(result, Path(args.plots)):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
