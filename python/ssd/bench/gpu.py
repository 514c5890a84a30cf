"""python -m ssd.bench gpu: ar, sd and ssd decode on a device, on a pair constructed there.

The draft is Llama-3.2-1B-shaped, bf16, with random weights made on the
device (nothing is loaded or downloaded). The target is CONSTRUCTED from it
(``ssd.bench.gpu_pair``, as ``ssd.testing.regime_pair`` does on the CPU): the
draft's 16 layers, then ballast layers (near-identity: they add weight bytes,
so cost) and 8 perturbing layers (random output projections at a scale eps
calibrated so that greedy top-1 agreement with the draft is ``--agreement``,
teacher-forced on random-token prompts). The target therefore has the
DRAFT's shapes (hidden 2048, intermediate 8192, head_dim 64, the draft's
tied head) and about 128 layers: as many as give it Llama-3.1-8B's weight
bytes (16 GB), not the 8B's shapes (32 layers of hidden 4096), so a decode
step launches about four times the kernels of a real 8B's.

Measured: ar, sd and ssd (greedy, same random-token prompts) at each of
``--batches``: decode tok/s, whether sd's and ssd's tokens equal ar's, and
the engine's acceptance rate, cache hit rate, target busy fraction and the
speed model's predicted speedup (``llm.stats()``, docs/metrics.md) over the
timed runs; the ssd/sd and sd/ar ratios per batch; the pair's achieved
agreement (the engine's forward on held-out prompts, and the draft's on ar's
own output, which is what greedy sd verifies); batch-1 ar against the
memory-bandwidth bound (the bytes a decode step reads over the bandwidth:
every weight once and the KV cache at the step's context,
``gpu_context.step_bytes``; the bandwidth is the device's own, see
``device_bandwidth``), the same with stock cuBLAS products
(``batch_invariant=False``); and (``ssd.bench.gpu_context``) batch-1 ar
decode at ``--contexts`` (1K, 4K and 16K) each against its bound, prefill
tok/s of a ``--prefill-tokens`` (4K) prompt with and without batch-invariant
products, the share of a decode step outside CUDA kernels, and the GB/s of
a batch-1 product with each of the forward's matrices. A run that fails (ssd
where the engine refuses it on the device) records its error and the others
go on; ``--time-budget-s`` skips, and records as skipped, long-context
measurements that would end past it. ``--shapes tiny --device cpu`` runs the
same steps on tiny shapes (contexts 64 and 256, prefill 256) on the CPU
(what ``scripts/gpu_check.sh --cpu`` does); what needs CUDA is None there.

Exit status 1 when a run failed or sd's or ssd's tokens differ from ar's.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time

from .record import BENCH_PROG, command_line, write_result

# Llama-3.1-8B and Llama-3.2-1B (their config.json), and tiny stand-ins.
SHAPES = {
    "llama": {
        "target": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False),
        "draft": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                      num_kv_heads=8, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=True),
    },
    "tiny": {
        "target": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
                       num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
        "draft": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True),
    },
}
# Peak memory bandwidth, bytes/s, from NVIDIA's datasheets, for devices whose
# properties lack the memory clock or bus width. A row matches when every one
# of its words is in the device's name (case-insensitive); the first match wins,
# so the more specific rows come first. SXM H100s call themselves "H100 80GB HBM3".
DATASHEET_BANDWIDTH = [
    (("H200",), 4.8e12),                  # H200 SXM and NVL, HBM3e
    (("H100", "NVL"), 3.9e12),
    (("H100", "PCIe"), 2.0e12),
    (("H100",), 3.35e12),                 # H100 SXM5, HBM3
    (("A100", "80GB", "PCIe"), 1.935e12),
    (("A100", "80GB"), 2.039e12),         # A100 SXM4 80GB
    (("A100",), 1.555e12),                # A100 40GB, SXM4 and PCIe
    (("L40",), 864e9),                    # L40 and L40S
    (("RTX 4090",), 1.008e12),
]


def device_bandwidth(device: str, override_gbs: float | None = None) -> tuple[float | None, str]:
    """The peak memory bandwidth of `device` in bytes/s and where it came from;
    (None, why) when it is not known.

    In order: `override_gbs` (GB/s, from --bandwidth-gbs); the device's own
    memory clock and bus width; the datasheet row its name matches. The memory
    clock is in kHz and the memory transfers twice a clock (double data rate):
    2 * clock * 1e3 * bus_width / 8. Against the datasheets: H100 SXM5 reports
    2619 MHz on 5120 bits -> 3.35 TB/s (datasheet 3.35); A100 SXM4 80GB 1593 MHz
    on 5120 bits -> 2.04 TB/s (datasheet 2.039); H200's 4.8 TB/s on its 6144 bits
    is 3125 MHz.
    """
    if override_gbs is not None:
        return override_gbs * 1e9, "--bandwidth-gbs"
    if not device.startswith("cuda"):
        return None, f"{device} is not a CUDA device"
    import torch

    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if clock_khz > 0 and bus_bits > 0:
        return (2 * clock_khz * 1e3 * bus_bits / 8,
                f"memory_clock_rate {clock_khz / 1e3:.0f} MHz x memory_bus_width {bus_bits} bits")
    name = torch.cuda.get_device_name(dev)
    for words, bandwidth in DATASHEET_BANDWIDTH:
        if all(w.lower() in name.lower() for w in words):
            return bandwidth, f"datasheet for {name}"
    return None, f"unknown for {name} (give --bandwidth-gbs)"


def add_bandwidth_bound(result: dict, bandwidth: float | None, source: str) -> str:
    """Record the bandwidth bound in `result` against `bandwidth` bytes/s: a
    step's bytes over the bandwidth is the step's least time, so the bound in
    tok/s at batch 1 is bandwidth / step_bytes; batch-1 ar's fraction of it
    (``result["ar"]``), each long-context run's (``result["contexts"]``) and
    each linear row's fraction of the bandwidth. The lines to print; an
    unknown bandwidth records none and says so."""
    result["bandwidth_bytes_s"] = bandwidth
    result["bandwidth_source"] = source
    if bandwidth is None:
        return f"memory bandwidth {source}: no bound"
    lines = [f"memory bandwidth {bandwidth / 1e12:.2f} TB/s ({source}): no batch-1 ar run to bound"]
    if "ar" in result:
        bound = bandwidth / result["ar"]["step_bytes"]
        result["bandwidth_bound_tok_s"] = bound
        result["ar_fraction_of_bound"] = result["ar"]["tok_s"] / bound
        lines = [f"ar at {result['ar_fraction_of_bound']:.0%} of the {bound:.0f} tok/s bandwidth bound "
                 f"({bandwidth / 1e12:.2f} TB/s, {source})"]
    for row in result.get("contexts", {}).get("runs", []):
        if row.get("tok_s") is not None:
            row["bound_tok_s"] = bandwidth / row["step_bytes"]
            row["fraction_of_bound"] = row["tok_s"] / row["bound_tok_s"]
            lines.append(f"ar at context {row['context']}: {row['tok_s']:.1f} tok/s, {row['fraction_of_bound']:.0%} "
                         f"of its {row['bound_tok_s']:.0f} tok/s bound ({row['step_bytes'] / 1e9:.3f} GB a step)")
    for row in result["linear"]:
        row["fraction_of_bandwidth"] = row["gb_s"] * 1e9 / bandwidth
        line = f"linear {row['matrix']}: {row['fraction_of_bandwidth']:.0%} of the bandwidth"
        if row.get("kernel_gb_s") is not None:
            row["kernel_fraction_of_bandwidth"] = row["kernel_gb_s"] * 1e9 / bandwidth
            line += f" ({row['kernel_fraction_of_bandwidth']:.0%} over its kernels' time)"
        lines.append(line)
    return "\n".join(lines)


def generated_model(shape: dict, device: str, dtype, seed: int, name: str, max_positions: int = 8192):
    """A LoadedModel of `shape` with random weights made on `device`, for sequences of up to max_positions."""
    import torch

    from ssd.models.config import ModelConfig
    from ssd.models.loaded import LoadedModel

    cfg = ModelConfig(architecture="LlamaForCausalLM", max_position_embeddings=max_positions, **shape)
    gen = torch.Generator(device=device).manual_seed(seed)

    def matrix(n, k):
        return (torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k ** -0.5).to(dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    h, d = cfg.hidden_size, cfg.head_dim
    w = {"model.embed_tokens.weight": matrix(cfg.vocab_size, h), "model.norm.weight": ones(h)}
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = matrix(cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ones(h)
        w[p + "post_attention_layernorm.weight"] = ones(h)
        w[p + "self_attn.q_proj.weight"] = matrix(cfg.num_heads * d, h)
        w[p + "self_attn.k_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = matrix(h, cfg.num_heads * d)
        w[p + "mlp.gate_proj.weight"] = matrix(cfg.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = matrix(cfg.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = matrix(h, cfg.intermediate_size)
    return LoadedModel(config=cfg, weights=w, tokenizer=None, eos_token_ids=[], bos_token_id=None,
                       chat_template=None, source=f"generated:{name}", name=name)


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.weights.values())


def decode(llm, prompts: list[list[int]], max_tokens: int, repeats: int) -> dict:
    """Greedy decode of `prompts` as one batch: a short untimed warm-up, then
    `repeats` timed runs. tok/s of a run: its tokens after each request's first
    over the time from the first first token to the last token (prefill
    excluded); the median over runs. The engine's metrics are over the timed
    runs (counter deltas through ``ssd._C.speed_metrics``)."""
    from ssd import SamplingParams, _C

    def generate(n):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        for out in outs:
            if out.finish_reason == "error" or len(out.token_ids) != n:
                raise RuntimeError(f"generate: finish_reason={out.finish_reason} error={out.error}")
        return outs

    generate(min(max_tokens, 8))
    before = llm.stats()
    rates, tokens = [], None
    for _ in range(repeats):
        outs = generate(max_tokens)
        metrics = [o.metrics for o in outs]
        seconds = max(m["finish_time"] for m in metrics) - min(m["time_to_first_token"] for m in metrics)
        rates.append(len(outs) * (max_tokens - 1) / seconds)
        run_tokens = [list(o.token_ids) for o in outs]
        if tokens is not None and run_tokens != tokens:
            raise RuntimeError("greedy decode gave different tokens in two runs of the same prompts")
        tokens = run_tokens
    after = llm.stats()
    counters = {key: after[key] - before[key] for key in _C.counter_names()}
    return {"tok_s": statistics.median(rates), "runs_tok_s": rates, "token_ids": tokens, "counters": counters,
            "metrics": _C.speed_metrics(counters)}


def engine_report(mode: str, counters: dict, metrics: dict) -> dict:
    """What a run reports from the engine's metrics (docs/metrics.md), None
    where the mode has no such thing. predicted_speedup is the speed model
    (``_C.predict_round``, verify_cost 1) at the run's measured quantities:
    the engine's own for ssd (overlapped rounds; it and the hit rate are None
    when no round looked up the cache: the adaptive policy can run ssd
    without trees); for sd, which the engine's does not cover, a sequential
    round of tokens_per_round tokens costing 1 + t_p verifies."""
    from ssd import _C

    report = {"acceptance_rate": None, "cache_hit_rate": None, "predicted_speedup": None,
              "target_busy_fraction": metrics["target_busy_fraction"]}
    if mode == "ar":
        return report
    report["acceptance_rate"] = metrics["acceptance_rate"]
    if mode == "ssd":
        if counters["cache_lookups"] > 0:
            report.update(cache_hit_rate=metrics["cache_hit_rate"], predicted_speedup=metrics["predicted_speedup"])
    elif metrics["tokens_per_round"] > 0:
        report["predicted_speedup"] = _C.predict_round(
            e_hit=metrics["tokens_per_round"], t_p=metrics["t_p"], batch=max(1, round(metrics["mean_batch"])),
            verify_cost=1.0, overlapped=False)["speedup"]
    return report


def build_pair(args) -> tuple:
    """The draft, the constructed target and the pair's record (layers, bytes, calibration)."""
    import torch

    from ssd.models.config import ModelConfig

    from . import gpu_context, gpu_pair

    shapes = SHAPES[args.shapes]
    started = time.perf_counter()
    longest = max(args.prompt_tokens + args.max_tokens + 16,
                  gpu_context.engine_length(args.contexts, args.context_tokens, args.prefill_tokens))
    draft = generated_model(shapes["draft"], args.device, torch.bfloat16, seed=2, name=f"{args.shapes}-draft",
                            max_positions=max(8192, longest))
    reference = ModelConfig(architecture="LlamaForCausalLM", **shapes["target"])
    plan = gpu_pair.layer_plan(draft.config, reference)
    vocab = draft.config.vocab_size
    target, calib = gpu_pair.build_target(
        draft, plan, seed=0, agreement=args.agreement,
        prompts=gpu_pair.random_prompts(vocab, *CALIBRATION_PROMPTS, seed=gpu_pair.CALIBRATION_SEED))
    pair = {"draft_layers": plan.n_base,
            "target_layers": {"base": plan.n_base, "ballast": plan.n_ballast, "perturb": plan.n_perturb,
                              "total": plan.n_total},
            "draft_weight_bytes": weight_bytes(draft), "target_weight_bytes": weight_bytes(target),
            "reference_weight_bytes": 2 * gpu_pair.weight_params(reference),
            "reference": f"{args.shapes} target shape: {shapes['target']['num_layers']} layers of hidden "
                         f"{shapes['target']['hidden_size']}",
            "ballast_scale": gpu_pair.construct.BALLAST_SCALE, "eps": calib["eps"],
            "agreement_requested": args.agreement,
            "agreement_calibration": calib["agreement"], "calibration_positions": calib["positions"],
            "calibration_steps": calib["steps"]}
    pair["seconds"] = time.perf_counter() - started
    print(f"constructed on {args.device} in {pair['seconds']:.1f} s: draft {plan.n_base} layers "
          f"({_size(pair['draft_weight_bytes'])} bf16), target {plan.n_total} layers = draft + "
          f"{plan.n_ballast} ballast + {plan.n_perturb} perturbing ({_size(pair['target_weight_bytes'])}; "
          f"the reference target {_size(pair['reference_weight_bytes'])}); eps {calib['eps']:.4g} gives "
          f"agreement {calib['agreement']:.3f} (requested {args.agreement}) over {calib['positions']} "
          f"positions after {len(calib['steps'])} steps", flush=True)
    return draft, target, pair


CALIBRATION_PROMPTS = (2, 128)  # prompts, tokens each: the positions calibration and measurement score
MODES = ("ar", "sd", "ssd")


def run_mode(target, draft, mode: str, prompts: list[list[int]], args, common: dict, **options) -> dict:
    """One engine of `mode` decoding `prompts` as one batch; its error instead of a crash."""
    from ssd import LLM

    started = time.perf_counter()
    try:
        with LLM(target, draft=None if mode == "ar" else draft, mode=mode, max_batch=len(prompts),
                 **common, **options) as llm:
            r = decode(llm, prompts, args.max_tokens, args.repeats)
        r.update(engine_report(mode, r["counters"], r["metrics"]))
    except Exception as e:  # noqa: BLE001 -- recorded per run; the others go on
        r = {"error": f"{type(e).__name__}: {e}"}
    return {"mode": mode, "batch": len(prompts), **r, "seconds": time.perf_counter() - started}


def format_row(r: dict) -> str:
    def num(key, fmt):
        return "-" if r.get(key) is None else format(r[key], fmt)

    if "error" in r:
        return f"{r['mode']:<5}{r['batch']:>6}  error: {r['error']}"
    match = "" if r["mode"] == "ar" else ("yes" if r["matches_ar"] else "NO")
    return (f"{r['mode']:<5}{r['batch']:>6}{r['tok_s']:>10.1f}{num('speedup_vs_ar', '.2f'):>8}"
            f"{num('predicted_speedup', '.2f'):>10}{num('acceptance_rate', '.3f'):>8}"
            f"{num('cache_hit_rate', '.3f'):>6}{num('target_busy_fraction', '.3f'):>7}{match:>7}")


TABLE_HEADER = (f"{'mode':<5}{'batch':>6}{'tok/s':>10}{'vs ar':>8}{'predicted':>10}{'accept':>8}"
                f"{'hit':>6}{'busy':>7}{'= ar':>7}")


def run(args) -> dict:
    import torch

    from . import gpu_context, gpu_pair, gpu_share

    dev = args.device
    deadline = gpu_context.Deadline(getattr(args, "started", time.perf_counter()), args.time_budget_s)
    if dev == "cpu":
        torch.set_num_threads(1)  # tiny shapes: more threads only wait on each other (the engine runs 1)
    draft, target, pair = build_pair(args)
    result = {"device": dev, "shapes": args.shapes, "target_weight_bytes": pair["target_weight_bytes"],
              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "k": args.k, "batches": args.batches, "pair": pair,
              "prefill": {"tokens": args.prefill_tokens}}
    # Every batch-invariant engine shares these two models (built once, cached by the LoadedModels); the
    # stock-cuBLAS run builds its own from a copy of the weights, taken before the first engine clears them.
    stock = dataclasses.replace(target, weights=dict(target.weights)) if dev.startswith("cuda") else None
    target_core, draft_core = target.core_model(dev), draft.core_model(dev)
    measure_prompts = gpu_pair.random_prompts(draft.config.vocab_size, *CALIBRATION_PROMPTS,
                                              seed=gpu_pair.MEASURE_SEED)
    pair["agreement_measured"] = gpu_pair.engine_agreement(draft_core, target_core, measure_prompts)
    print(f"agreement measured by the engine on other random prompts: {pair['agreement_measured']:.3f}",
          flush=True)

    prompts = torch.randint(0, draft.config.vocab_size, (max(args.batches), args.prompt_tokens),
                            generator=torch.Generator().manual_seed(0)).tolist()
    common = dict(dtype="bfloat16", max_model_len=args.prompt_tokens + args.max_tokens + 16,
                  kv_cache_gib=args.kv_cache_gib, target_device=dev, k=args.k)
    runs = []
    if stock is not None:
        r = run_mode(stock, None, "ar", prompts[:1], args, common, batch_invariant=False)
        result["prefill"]["stock_cublas"] = gpu_context.stock_prefill(stock, args)
        del stock
        gc.collect()  # its engine and engine model (16 GB on the device) go now, not at some later collection
        result["ar_stock_cublas"] = r
        print(f"ar with stock cuBLAS products, batch 1: "
              f"{r['error'] if 'error' in r else format(r['tok_s'], '.1f') + ' tok/s'}", flush=True)
    else:
        result["prefill"]["stock_cublas"] = gpu_context.stock_prefill(None, args)  # says why not
    print(TABLE_HEADER, flush=True)
    result["speedup"] = {}
    for batch in args.batches:
        by_mode = {}
        for mode in MODES:
            r = run_mode(target, draft, mode, prompts[:batch], args, common,
                         **({} if mode == "ar" else {"draft_device": dev}))
            ar = by_mode.get("ar", {})
            if mode != "ar" and "error" not in r:
                r["matches_ar"] = r["token_ids"] == ar.get("token_ids")
            if "error" not in r and "tok_s" in ar:
                r["speedup_vs_ar"] = r["tok_s"] / ar["tok_s"]
            by_mode[mode] = r
            runs.append(r)
            print(format_row(r), flush=True)
        rate = {m: by_mode[m].get("tok_s") for m in MODES}
        result["speedup"][str(batch)] = {
            "sd_over_ar": rate["sd"] / rate["ar"] if rate["sd"] and rate["ar"] else None,
            "ssd_over_sd": rate["ssd"] / rate["sd"] if rate["ssd"] and rate["sd"] else None}
    result["runs"] = runs
    result["draft_sm_share"] = gpu_share.compare(run_mode, target, draft, prompts[0], args, common, runs)
    print(gpu_share.format_compare(result["draft_sm_share"]), flush=True)
    for batch, s in result["speedup"].items():
        print(f"batch {batch}: sd/ar {_ratio(s['sd_over_ar'])}, ssd/sd {_ratio(s['ssd_over_sd'])}", flush=True)

    ar_runs = [r for r in runs if r["mode"] == "ar" and "error" not in r]
    if ar_runs:
        widest = max(ar_runs, key=lambda r: r["batch"])
        same = total = 0
        for prompt, tokens in zip(prompts, widest["token_ids"]):
            s, n = gpu_pair.agreement_on_text(draft_core, prompt, tokens)
            same, total = same + s, total + n
        pair["agreement_on_ar_output"] = same / total
        print(f"agreement on ar's own output (what greedy sd verifies; {total} positions): "
              f"{pair['agreement_on_ar_output']:.3f}", flush=True)
    ar1 = next((r for r in ar_runs if r["batch"] == 1), None)
    if ar1 is not None:
        context = gpu_context.mean_context(args.prompt_tokens, args.max_tokens)
        result["ar"] = {"batch": 1, "tok_s": ar1["tok_s"], "mean_context": context,
                        "step_bytes": gpu_context.step_bytes(target.config, pair["target_weight_bytes"], context,
                                                             gpu_context.kv_cache_dtype_on(dev))}
    result["linear"] = gpu_context.linear_bandwidth(dev, SHAPES[args.shapes]["draft"])
    if dev.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(dev))
    # Last, as what --time-budget-s may cut short.
    long = gpu_context.long_contexts(target, args, deadline, pair["target_weight_bytes"])
    result["contexts"], result["outside_kernels"] = long["contexts"], long["outside_kernels"]
    result["prefill"]["batch_invariant"] = long["prefill"]
    print(gpu_context.format_outside(result["outside_kernels"]), flush=True)
    print(gpu_context.format_prefill(result["prefill"]), flush=True)
    if dev.startswith("cuda") or args.bandwidth_gbs is not None:
        print(add_bandwidth_bound(result, *device_bandwidth(dev, args.bandwidth_gbs)), flush=True)
    result["goals"] = gpu_context.goals(result)
    if dev.startswith("cuda"):  # on the CPU none is measured
        print(gpu_context.format_goals(result["goals"]), flush=True)
    result["errors"] = [f"{r['mode']} batch {r['batch']}: {r['error']}" for r in runs if "error" in r]
    result["errors"] += [f"ssd draft_sm_share {r['draft_sm_share']}: {r['error']}"
                         for r in result["draft_sm_share"]["runs"] if "error" in r]
    if "error" in result.get("ar_stock_cublas", {}):
        result["errors"].append(f"ar_stock_cublas batch 1: {result['ar_stock_cublas']['error']}")
    result["errors"] += gpu_context.errors(result)
    result["all_match_ar"] = all(r.get("matches_ar", True) for r in runs + result["draft_sm_share"]["runs"])
    print(f"greedy sd and ssd equal ar: {result['all_match_ar']}; failed runs: {len(result['errors'])}", flush=True)
    return result


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    from . import gpu_context

    ap = argparse.ArgumentParser(prog=f"{BENCH_PROG} gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    ap.add_argument("--shapes", default="llama", choices=sorted(SHAPES),
                    help="llama: 1B-shaped draft, target of an 8B's weight bytes (default: llama)")
    ap.add_argument("--agreement", type=float, default=0.75,
                    help="the greedy top-1 agreement the target's perturbation is calibrated to (default: 0.75)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4], help="batch sizes (default: 1 4)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per mode and batch (default: 2)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--bandwidth-gbs", type=float,
                    help="the device's peak memory bandwidth in GB/s for the bound (default: from the "
                         "device's memory clock and bus width, else its datasheet)")
    ap.add_argument("--contexts", type=int, nargs="*",
                    help="batch-1 ar decode after a prompt of each of these lengths (default: 1024 4096 16384; "
                         "64 256 with --shapes tiny; none given: no long contexts)")
    ap.add_argument("--context-tokens", type=int, default=gpu_context.CONTEXT_TOKENS,
                    help=f"tokens generated at each context, the first not timed (default: "
                         f"{gpu_context.CONTEXT_TOKENS})")
    ap.add_argument("--prefill-tokens", type=int,
                    help="the prompt whose prefill tok/s is measured (default: 4096; 256 with --shapes tiny; "
                         "0: none)")
    ap.add_argument("--time-budget-s", type=float,
                    help="seconds from the start the run should end within: a long-context measurement "
                         "estimated to end past it is skipped and recorded as such (default: no limit)")
    ap.add_argument("--draft-sm-shares", type=float, nargs="*", default=[],
                    help="also run ssd at batch 1 with its draft on each of these shares of the GPU's SMs "
                         "(a green context; EngineConfig.draft_sm_share) against stream priority alone")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    args.started = started
    contexts, prefill = gpu_context.DEFAULTS[args.shapes]
    args.contexts = contexts if args.contexts is None else args.contexts
    args.prefill_tokens = prefill if args.prefill_tokens is None else args.prefill_tokens
    if any(c < 1 for c in args.contexts) or len(set(args.contexts)) != len(args.contexts):
        ap.error(f"--contexts must be distinct positive lengths, got {args.contexts}")
    if args.context_tokens < 2:
        ap.error(f"--context-tokens must be at least 2 (the first token is not timed), got {args.context_tokens}")
    if args.prefill_tokens < 0:
        ap.error(f"--prefill-tokens must be 0 or more, got {args.prefill_tokens}")
    if args.time_budget_s is not None and not args.time_budget_s > 0:
        ap.error(f"--time-budget-s must be positive, got {args.time_budget_s}")
    if args.bandwidth_gbs is not None and not args.bandwidth_gbs > 0:
        ap.error(f"--bandwidth-gbs must be positive, got {args.bandwidth_gbs}")
    if not 0 < args.agreement < 1:
        ap.error(f"--agreement must be between 0 and 1, got {args.agreement}")
    if min(args.batches) < 1:
        ap.error(f"--batches must be positive, got {args.batches}")
    if args.max_tokens < 2:
        ap.error(f"--max-tokens must be at least 2 (the first token is not timed), got {args.max_tokens}")
    if args.repeats < 1 or args.prompt_tokens < 1:
        ap.error(f"--repeats and --prompt-tokens must be positive, got {args.repeats} and {args.prompt_tokens}")
    from ssd import _C

    problem = _C.device_problem(args.device)
    if problem:
        ap.error(problem)
    result = run(args)
    if args.json:
        write_result(args.json, result,
                     command_line(["gpu", *(sys.argv[1:] if argv is None else argv)], BENCH_PROG))
    return 0 if result["all_match_ar"] and not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
