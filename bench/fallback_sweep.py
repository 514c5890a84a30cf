"""Which cache-miss fallback wins at which batch size: ssd with the fallback
forced to "neural" and to "fast", beside the `auto` policy's runs.

    python bench/fallback_sweep.py --auto bench/results/batch_sweep.json \
        --json bench/results/fallback_sweep.json --plot bench/results/batch_sweep/fallback_vs_batch.png

Reads the batch sweep written by `python -m ssd.bench --batch 1,2,4,8
--temperature 0,1.0 ...` (ar, sd and ssd with fallback=auto), reruns ssd on the
same prompts with each fixed fallback and prints, per batch size and
temperature, tokens/s of each, the fallback `auto` chose and the speed model's
reason: with b sequences a round is all hits with probability p^b; otherwise a
neural fallback stalls the whole batch for K draft steps (T_b of a verify),
while the fast one costs nothing but proposes tokens the target accepts less.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ssd.bench.core import BenchConfig, run_bench


def _key(r):
    return r["batch_size"], r["temperature"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--auto", required=True, help="JSON of the batch sweep (python -m ssd.bench --json)")
    ap.add_argument("--json", help="write the combined result here")
    ap.add_argument("--plot", help="write the PNG here")
    args = ap.parse_args()
    auto = json.loads(Path(args.auto).read_text())
    c = auto["config"]
    forced = {}
    for fallback in ("neural", "fast"):
        cfg = BenchConfig(datasets=c["datasets"], num_prompts=c["num_prompts"], max_tokens=c["max_tokens"],
                          batches=c["batches"], temperatures=c["temperatures"], modes=["ssd"], k=c["k"],
                          fallback=fallback, dtype=c["dtype"], target_threads=c["target_threads"],
                          draft_threads=c["draft_threads"], same_total_hardware=False, seed=c["seed"])
        forced[fallback] = {_key(r): r for r in run_bench(cfg)["runs"]}
    own = [r for r in auto["runs"] if not r["same_total_hardware"]]
    rows = []
    for r in sorted((r for r in own if r["mode"] == "ssd"), key=_key):
        b, t = _key(r)
        ref = {m: next(x for x in own if x["mode"] == m and _key(x) == (b, t)) for m in ("ar", "sd")}
        nrl, fast = forced["neural"][(b, t)], forced["fast"][(b, t)]
        cnt = r["counters"]
        rows.append({
            "batch_size": b, "temperature": t,
            "ar": ref["ar"]["decode_tok_per_s"], "sd": ref["sd"]["decode_tok_per_s"],
            "ssd_auto": r["decode_tok_per_s"], "ssd_neural": nrl["decode_tok_per_s"],
            "ssd_fast": fast["decode_tok_per_s"],
            "auto_neural_misses": cnt["fallback_neural"], "auto_fast_misses": cnt["fallback_fast"],
            "better_fixed": "neural" if nrl["decode_tok_per_s"] >= fast["decode_tok_per_s"] else "fast",
            # The speed model's terms, from the forced runs.
            "hit_rate": nrl["cache_hit_rate"], "all_hit": nrl["cache_hit_rate"] ** b,
            "t_b_neural": nrl["t_b"], "e_miss_neural": nrl["e_miss"], "e_miss_fast": fast["e_miss"],
            "predicted_neural": nrl["predicted_tok_per_s"], "predicted_fast": fast["predicted_tok_per_s"],
        })
    print(f"{'B':>3} {'T':>4} {'ar':>6} {'sd':>6} {'auto':>6} {'neural':>7} {'fast':>6}  auto chose (n/f)  "
          f"better  p^b   T_b  E_miss n/f   model n/f")
    for x in rows:
        print(f"{x['batch_size']:>3} {x['temperature']:>4.1f} {x['ar']:6.2f} {x['sd']:6.2f} {x['ssd_auto']:6.2f} "
              f"{x['ssd_neural']:7.2f} {x['ssd_fast']:6.2f}  {x['auto_neural_misses']:>6}/{x['auto_fast_misses']:<6}    "
              f"{x['better_fixed']:>6} {x['all_hit']:5.2f} {x['t_b_neural']:5.2f} "
              f"{x['e_miss_neural']:4.2f}/{x['e_miss_fast']:4.2f} {x['predicted_neural']:6.2f}/{x['predicted_fast']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": c, "pair": auto.get("pair"), "rows": rows}, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        temps = sorted({x["temperature"] for x in rows})
        fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
        styles = {"ar": ("#7f7f7f", "o", "ar"), "sd": ("#1f77b4", "s", "sd"),
                  "ssd_neural": ("#d62728", "^", "ssd, neural fallback"),
                  "ssd_fast": ("#ff7f0e", "v", "ssd, fast (n-gram) fallback"),
                  "ssd_auto": ("#2ca02c", "D", "ssd, auto")}
        for ax, t in zip(axes[0], temps):
            sel = [x for x in rows if x["temperature"] == t]
            bs = [x["batch_size"] for x in sel]
            for key, (color, marker, label) in styles.items():
                ax.plot(bs, [x[key] for x in sel], marker=marker, color=color, label=label,
                        linestyle="--" if key == "ssd_auto" else "-")
            ax.set_xscale("log", base=2)
            ax.set_xticks(bs, [str(b) for b in bs])
            ax.set_xlabel("batch size")
            ax.set_ylabel("decode tokens/s (all sequences)")
            ax.set_title(f"temperature {t:g}")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle("ssd cache-miss fallback by batch size (CONSTRUCTED regime pair, MT-bench)")
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
