#!/usr/bin/env python
"""AR, SD and SSD at batch 1 on the constructed regime pair, beside the speed model.

The pair is ``ssd.testing.regime_pair(acceptance, cost_ratio)`` (CONSTRUCTED:
draft = SmolLM2-135M-Instruct as shipped, target = the same model with ballast
and perturbing layers; it claims nothing about any published model). Prompts:
MT-bench and HumanEval chats, greedy, batch 1. Placement: the target runs on
one thread in every mode; in ``sd`` the draft shares the target's thread (the
modes take turns), in ``ssd`` the draft worker has its own thread (the
machine's other core), as the paper gives the draft its own GPU.

Measured per mode: decode tok/s = (generated - 1) / (t_last - t_first), summed
over the prompts (prefill and the first token excluded), and the engine's
speed-model metrics over the timed requests only (counter deltas).

Predicted per mode, from component times measured IN ISOLATION with
``ssd._C.SequenceRunner`` at the run's mean context (not from round times):
  t_ar      one target decode step (1 row)
  t_verify  one target forward over K + 1 rows (the verify)
  t_d1      one draft decode step (1 row; also the fork-point forward)
  t_tree    one draft tree step over B rows (B = the run's mean branches per
            round; bf16 matmul path, as the engine's tree uses)
and the run's token counts (tokens per round, hit rate, E_hit, E_miss):
  AR   1 / t_ar
  SD   (tokens per round) / (K t_d1 + t_verify)
  SSD  (p E_hit + (1 - p) E_miss) / (t_verify (p max(1, T_p) + (1 - p)(1 + T_b)))
       T_p = (t_d1 + K t_tree) / t_verify,  T_b = fallback time / t_verify
       (neural fallback: K t_d1; fast: 0; the run's mix of the two)

Usage:
  python bench/bench_ssd.py [--prompts 4] [--max-tokens 64] [--k 4]
      [--json bench/results/ssd_regime.json] [--plot bench/results/ssd_regime.png]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from ssd import LLM, SamplingParams, _C
from ssd.assets import humaneval_prompts, mtbench_prompts
from ssd.models import load
from ssd.testing import regime_pair

COUNTERS = ("rounds", "draft_tokens_proposed", "draft_tokens_accepted", "cache_lookups", "cache_hits",
            "fallback_neural", "fallback_fast", "hit_tokens", "miss_tokens", "kv_commits", "tree_branches",
            "verify_steps", "verify_seconds", "active_seconds", "target_wait_seconds", "draft_rounds",
            "draft_round_seconds", "fallback_batches", "fallback_seconds", "forward_seconds",
            "generated_tokens", "steps", "fast_tokens_proposed", "fast_tokens_accepted")


def run_mode(pair, mode, chats, max_tokens, k, extra):
    kwargs = dict(draft=str(pair.draft), k=k) if mode != "ar" else {}
    kwargs.update(extra)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(str(pair.target), mode=mode, max_model_len=1024, max_batch=1, target_threads=1,
             draft_threads=1, **kwargs) as llm:
        llm.chat([chats[0]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))  # warm-up
        before = llm.stats()
        decode_s, decode_tokens, contexts = 0.0, 0, []
        for chat in tqdm(chats, desc=f"{mode:>3}", leave=False):
            out = llm.chat([chat], params)[0]
            m = out.metrics
            decode_s += m["finish_time"] - m["time_to_first_token"]
            decode_tokens += m["generated_tokens"] - 1
            contexts.append(m["prompt_tokens"] + m["generated_tokens"] / 2)
        after = llm.stats()
    delta = {key: after[key] - before[key] for key in COUNTERS}
    metrics = _C.speed_metrics(delta)
    return {"mode": mode, "decode_tok_per_s": decode_tokens / decode_s, "decode_tokens": decode_tokens,
            "decode_seconds": decode_s, "mean_context": statistics.mean(contexts), "counters": delta,
            **metrics, "fanout": after.get("fanout"), "fanout_budget": after.get("fanout_budget"),
            "random_token_acceptance": after.get("random_token_acceptance", 0.0)}


def time_forward(runner, batch, all_logits=False, matmul_min_rows=0, repeats=5):
    """Median seconds of one forward that appends `batch` (then undone)."""
    times = []
    for _ in range(repeats):
        lengths = {sid: runner.length(sid) for sid, _ in batch}
        t = time.perf_counter()
        runner.extend(batch, all_logits, matmul_min_rows)
        times.append(time.perf_counter() - t)
        for sid, n in lengths.items():
            runner.truncate(sid, n)
    return statistics.median(times)


def components(pair, context, k, rows):
    """Isolated component times (seconds) at `context` tokens, 1 thread each."""
    prompt = [(7 * i + 3) % 1000 + 10 for i in range(int(context))]
    out = {}
    target = load(str(pair.target)).core_model()
    r = _C.SequenceRunner(target, 256, 16, 1)
    s = r.add_sequence()
    r.extend([(s, prompt)], False)
    out["t_ar"] = time_forward(r, [(s, [11])])
    out["t_verify"] = time_forward(r, [(s, list(range(20, 21 + k)))], all_logits=True)
    del r, target
    draft = load(str(pair.draft)).core_model()
    n = max(1, round(rows))
    r = _C.SequenceRunner(draft, 64 * (n + 1), 16, 1)
    ids = [r.add_sequence() for _ in range(n)]
    r.extend([(i, prompt) for i in ids], False)
    out["t_d1"] = time_forward(r, [(ids[0], [11])])
    out["t_tree"] = time_forward(r, [(i, [11]) for i in ids], matmul_min_rows=4)
    out["tree_rows"] = n
    return out


def predict(run, c, k):
    if run["mode"] == "ar":
        return 1.0 / c["t_ar"]
    if run["mode"] == "sd":
        return run["tokens_per_round"] / (k * c["t_d1"] + c["t_verify"])
    cnt = run["counters"]
    misses = cnt["fallback_neural"] + cnt["fallback_fast"]
    neural_share = cnt["fallback_neural"] / misses if misses else 1.0
    t_p = (c["t_d1"] + k * c["t_tree"]) / c["t_verify"]
    t_b = neural_share * k * c["t_d1"] / c["t_verify"]
    p = run["cache_hit_rate"]
    tokens = p * run["e_hit"] + (1 - p) * run["e_miss"]
    return tokens / (c["t_verify"] * (p * max(1.0, t_p) + (1 - p) * (1 + t_b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="half MT-bench, half HumanEval")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.75)
    ap.add_argument("--cost-ratio", type=float, default=0.25)
    ap.add_argument("--fallback", default="auto")
    ap.add_argument("--json", default="bench/results/ssd_regime.json")
    ap.add_argument("--plot", default="bench/results/ssd_regime.png")
    args = ap.parse_args()

    pair = regime_pair(acceptance=args.acceptance, cost_ratio=args.cost_ratio)
    half = args.prompts // 2
    chats = [[{"role": "user", "content": q}] for q in mtbench_prompts(args.prompts - half) + humaneval_prompts(half)]
    runs = [run_mode(pair, mode, chats, args.max_tokens, args.k, {"fallback": args.fallback} if mode == "ssd" else {})
            for mode in tqdm(["ar", "sd", "ssd"], desc="modes")]
    ssd_run = runs[2]
    rows = ssd_run["counters"]["tree_branches"] / max(1, ssd_run["counters"]["draft_rounds"])
    comp = components(pair, statistics.mean(r["mean_context"] for r in runs), args.k, rows)
    for run in runs:
        run["predicted_tok_per_s"] = predict(run, comp, args.k)

    print(f"pair: CONSTRUCTED regime pair (acceptance {args.acceptance}, cost ratio {args.cost_ratio}), "
          f"{len(chats)} prompts x {args.max_tokens} tokens, batch 1, temperature 0, k={args.k}")
    print("placement: target 1 thread in every mode; sd: draft on the target's thread; ssd: draft worker on its own")
    print(f"{'mode':>4} {'decode tok/s':>12} {'predicted':>9} {'accept':>6} {'hit':>5} {'E_hit':>5} {'E_miss':>6} "
          f"{'T_p':>5} {'T_b':>5} {'busy':>5}")
    for r in runs:
        print(f"{r['mode']:>4} {r['decode_tok_per_s']:12.2f} {r['predicted_tok_per_s']:9.2f} "
              f"{r['acceptance_rate']:6.3f} {r['cache_hit_rate']:5.2f} {r['e_hit']:5.2f} {r['e_miss']:6.2f} "
              f"{r['t_p']:5.2f} {r['t_b']:5.2f} {r['target_busy_fraction']:5.2f}")
    ar, sd, ssd = (r["decode_tok_per_s"] for r in runs)
    print(f"SSD/SD {ssd / sd:.2f}x  SSD/AR {ssd / ar:.2f}x  SD/AR {sd / ar:.2f}x  "
          f"(predicted SSD/SD {runs[2]['predicted_tok_per_s'] / runs[1]['predicted_tok_per_s']:.2f}x)")
    if ssd_run["counters"]["fast_tokens_proposed"]:
        print(f"fast fallback acceptance {ssd_run['fast_acceptance_rate']:.3f} vs uniformly random tokens "
              f"{ssd_run['random_token_acceptance']:.1e} (1 / vocab)")
    print("isolated components (ms): " + ", ".join(f"{key} {v * 1000:.1f}" for key, v in comp.items() if key.startswith("t_"))
          + f" (tree rows {comp['tree_rows']})")

    result = {"pair": {**pair.info, "constructed": True},
              "settings": vars(args), "components_s": comp, "runs": runs,
              "machine": {"platform": platform.platform(), "processor": platform.processor()}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        x = range(len(runs))
        ax.bar([i - 0.2 for i in x], [r["decode_tok_per_s"] for r in runs], 0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [r["predicted_tok_per_s"] for r in runs], 0.4, label="speed model")
        ax.set_xticks(list(x), [r["mode"] for r in runs])
        ax.set_ylabel("decode tokens/s (batch 1)")
        ax.set_title("Constructed regime pair (SmolLM2 draft), 1 core each")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    print(f"wrote {args.json}" + (f" and {args.plot}" if args.plot else ""))


if __name__ == "__main__":
    main()
