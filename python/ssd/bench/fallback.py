"""``python -m ssd.bench fallback``: which cache-miss fallback wins at which batch size.

Reads a result of the default run (``python -m ssd.bench --json``, with ar, sd
and ssd at fallback=auto, typically over ``--batch 1,2,4,8 --temperature
0,1.0``), reruns ssd with the same configuration on the same pair and prompts
with the fallback forced to "neural" and then to "fast", and prints per batch
size and temperature the tok/s of each beside the choices ``auto`` made and
the speed model's terms. With b sequences a round is all hits with
probability p^b; otherwise a neural fallback stalls the whole batch for K
draft steps (T_b of a verify), while the fast one costs nothing but proposes
tokens the target accepts less often.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .core import BenchConfig, run_bench
from .record import BENCH_PROG, command_line, write_result

PROG = f"{BENCH_PROG} fallback"
FORCED = ("neural", "fast")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="the README's sweep (8 prompts x 32 tokens, batch 1-8, T 0 and 1): "
                                        "about 9 min on a 2-core machine")
    ap.add_argument("--auto", required=True, type=Path, metavar="FILE",
                    help="JSON of the default run to compare against (python -m ssd.bench --json FILE)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the combined result here")
    ap.add_argument("--plot", type=Path, metavar="FILE", help="write the PNG here")
    return ap.parse_args(argv)


def _key(r: dict) -> tuple:
    return r["batch_size"], r["temperature"]


def forced_config(auto: dict, fallback: str) -> BenchConfig:
    """The auto run's configuration with ssd alone and the fallback forced."""
    if "sweep" in auto:
        raise ValueError("--auto: a regime sweep's result; give a single-pair run (python -m ssd.bench --json)")
    if "config" not in auto or "runs" not in auto:
        raise ValueError("--auto: not a result of python -m ssd.bench (no 'config' or 'runs')")
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    fields = {k: v for k, v in auto["config"].items() if k in known}
    return BenchConfig(**{**fields, "modes": ["ssd"], "fallback": fallback, "same_total_hardware": False,
                          "peers": []})


def auto_groups(auto_runs: list[dict]) -> dict[tuple, dict[str, dict]]:
    """The auto run's ar, sd and ssd runs on the target's own hardware per (batch, temperature);
    a ValueError names any ssd point without its ar or sd reference."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in auto_runs:
        if not r["same_total_hardware"]:
            groups.setdefault(_key(r), {})[r["mode"]] = r
    groups = {k: g for k, g in groups.items() if "ssd" in g}
    if not groups:
        raise ValueError("--auto: the result has no ssd run")
    for (b, t), g in sorted(groups.items()):
        missing = [m for m in ("ar", "sd") if m not in g]
        if missing:
            raise ValueError(f"--auto: no {' or '.join(missing)} run at batch {b}, temperature {t} "
                             "(the default run needs --modes ar,sd,ssd)")
    return groups


def fallback_rows(auto_runs: list[dict], forced: dict[str, dict[tuple, dict]]) -> list[dict]:
    """One row per (batch, temperature) of the auto run's ssd runs: ar, sd and ssd tok/s with each
    fallback, the kinds auto chose, and the speed model's terms from the forced runs.

    forced: fallback kind -> {(batch, temperature): that ssd run}.
    """
    rows = []
    for (b, t), g in sorted(auto_groups(auto_runs).items()):
        neural, fast = forced["neural"][(b, t)], forced["fast"][(b, t)]
        cnt = g["ssd"]["counters"]
        rows.append({
            "batch_size": b, "temperature": t,
            "ar": g["ar"]["decode_tok_per_s"], "sd": g["sd"]["decode_tok_per_s"],
            "ssd_auto": g["ssd"]["decode_tok_per_s"], "ssd_neural": neural["decode_tok_per_s"],
            "ssd_fast": fast["decode_tok_per_s"],
            "auto_neural_misses": cnt["fallback_neural"], "auto_fast_misses": cnt["fallback_fast"],
            "better_fixed": "neural" if neural["decode_tok_per_s"] >= fast["decode_tok_per_s"] else "fast",
            # The speed model's terms, from the forced runs.
            "hit_rate": neural["cache_hit_rate"], "all_hit": neural["cache_hit_rate"] ** b,
            "t_b_neural": neural["t_b"], "e_miss_neural": neural["e_miss"], "e_miss_fast": fast["e_miss"],
            "predicted_neural": neural["predicted_tok_per_s"], "predicted_fast": fast["predicted_tok_per_s"],
        })
    return rows


def print_rows(rows: list[dict], out=sys.stdout) -> None:
    print(f"{'B':>3} {'T':>4} {'ar':>6} {'sd':>6} {'auto':>6} {'neural':>7} {'fast':>6}  auto chose (n/f)  "
          f"better  p^b   T_b  E_miss n/f   model n/f", file=out)
    for x in rows:
        print(f"{x['batch_size']:>3} {x['temperature']:>4.1f} {x['ar']:6.2f} {x['sd']:6.2f} {x['ssd_auto']:6.2f} "
              f"{x['ssd_neural']:7.2f} {x['ssd_fast']:6.2f}  {x['auto_neural_misses']:>6}/{x['auto_fast_misses']:<6}    "
              f"{x['better_fixed']:>6} {x['all_hit']:5.2f} {x['t_b_neural']:5.2f} "
              f"{x['e_miss_neural']:4.2f}/{x['e_miss_fast']:4.2f} "
              f"{x['predicted_neural']:6.2f}/{x['predicted_fast']:.2f}", file=out)


def plot_title(auto: dict) -> str:
    pair = auto.get("pair") or {}
    which = "CONSTRUCTED regime pair" if pair.get("constructed") else f"{pair.get('target')} / {pair.get('draft')}"
    return f"ssd cache-miss fallback by batch size ({which}, {', '.join(auto['config']['datasets'])})"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        auto = json.loads(args.auto.read_text())
        configs = {kind: forced_config(auto, kind) for kind in FORCED}
        auto_groups(auto["runs"])  # before the long runs: the references must be there
        for cfg in configs.values():
            cfg.validate()
    except (OSError, json.JSONDecodeError, ValueError, TypeError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    forced = {kind: {_key(r): r for r in run_bench(cfg)["runs"]} for kind, cfg in configs.items()}
    rows = fallback_rows(auto["runs"], forced)
    print_rows(rows)
    if args.json:
        doc = {"auto_result": str(args.auto), "config": auto["config"], "pair": auto.get("pair"), "rows": rows}
        print(f"wrote {write_result(args.json, doc, command_line(['fallback', *argv], BENCH_PROG))}")
    if args.plot:
        from .plots import write_fallback_plot

        print(f"wrote {write_fallback_plot(args.plot, rows, plot_title(auto))}")
    return 0
