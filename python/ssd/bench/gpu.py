"""python -m ssd.bench gpu: ar and sd decode on a device, on models generated there.

The target is Llama-3.1-8B-shaped and the draft Llama-3.2-1B-shaped, bf16,
with random weights made on the device (nothing is loaded or downloaded). It
measures batch-1 ar decode tok/s against the memory-bandwidth bound (weight
bytes / bandwidth: every decode step reads every weight once; the bandwidth
is the device's own, see ``device_bandwidth``), the same with
stock cuBLAS products (``batch_invariant=False``), greedy sd beside it,
whose tokens must equal ar's, and the bandwidth of the batch-1 matrix
products of the forward's largest matrices. ``--shapes tiny --device cpu`` runs the same
steps on tiny shapes on the CPU (what ``scripts/gpu_check.sh --cpu`` does).

Random weights make the draft a poor guesser (acceptance near 1 / vocab), so
the sd number is a lower bound on what a trained pair reaches; its point here
is the equality with ar and the cost of a verify round on the device.
"""
from __future__ import annotations

import argparse
import dataclasses
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
    """Record the bandwidth bound in `result` (its ar tok/s, the target's
    weight bytes and the linear rows' GB/s against `bandwidth` bytes/s); the
    line to print. An unknown bandwidth records none and says so."""
    result["bandwidth_bytes_s"] = bandwidth
    result["bandwidth_source"] = source
    if bandwidth is None:
        return f"memory bandwidth {source}: no bound"
    bound = bandwidth / result["target_weight_bytes"]
    result["bandwidth_bound_tok_s"] = bound
    result["ar_fraction_of_bound"] = result["ar"]["tok_s"] / bound
    for row in result["linear"]:
        row["fraction_of_bandwidth"] = row["gb_s"] * 1e9 / bandwidth
    return (f"ar at {result['ar_fraction_of_bound']:.0%} of the {bound:.0f} tok/s bandwidth bound "
            f"({bandwidth / 1e12:.2f} TB/s, {source})")


def generated_model(shape: dict, device: str, dtype, seed: int, name: str):
    """A LoadedModel of `shape` with random weights made on `device`."""
    import torch

    from ssd.models.config import ModelConfig
    from ssd.models.loaded import LoadedModel

    cfg = ModelConfig(architecture="LlamaForCausalLM", max_position_embeddings=8192, **shape)
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


def decode(llm, prompt: list[int], max_tokens: int, repeats: int) -> dict:
    """Batch-1 greedy decode: one warm-up, then the median of `repeats` runs."""
    from ssd import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rates, tokens = [], None
    for i in range(repeats + 1):
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        if out.finish_reason == "error" or len(out.token_ids) != max_tokens:
            raise RuntimeError(f"generate: finish_reason={out.finish_reason} error={out.error}")
        m = out.metrics
        if i > 0:
            rates.append((max_tokens - 1) / (m["finish_time"] - m["time_to_first_token"]))
        tokens = list(out.token_ids)
    return {"tok_s": statistics.median(rates), "runs_tok_s": rates, "token_ids": tokens}


def linear_bandwidth(device: str, shapes: dict, repeats: int = 20) -> list[dict]:
    """Batch-1 bf16 matrix-vector products of the forward's largest shapes
    through the backend's linear step: the weight bytes each call streams over
    the median call time (a call includes its stream synchronization)."""
    import torch

    from ssd import _C

    steps = _C.testing.BackendSteps(device)
    t = shapes["target"]
    h, f = t["hidden_size"], t["intermediate_size"]
    rows = []
    for name, n, k in [("gate_up", 2 * f, h), ("down", h, f), ("lm_head", t["vocab_size"], h)]:
        w = torch.randn(n, k, device=device).to(torch.bfloat16)
        x = torch.randn(1, k, device=device)
        steps.linear(x, w, None, bf16=True)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            steps.linear(x, w, None, bf16=True)
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        rows.append({"matrix": name, "n": n, "k": k, "seconds": sec, "gb_s": n * k * 2 / sec / 1e9})
        print(f"linear {name} [{n}, {k}] bf16, 1 row: {sec * 1e6:.0f} us, {rows[-1]['gb_s']:.0f} GB/s", flush=True)
        del w
    return rows


def run(args) -> dict:
    import torch

    from ssd import LLM

    dev = args.device
    dtype = torch.bfloat16
    shapes = SHAPES[args.shapes]
    started = time.perf_counter()
    target = generated_model(shapes["target"], dev, dtype, seed=1, name=f"{args.shapes}-target")
    draft = generated_model(shapes["draft"], dev, dtype, seed=2, name=f"{args.shapes}-draft")
    bytes_t = weight_bytes(target)
    print(f"generated the target ({bytes_t / 1e9:.2f} GB bf16) and the draft ({weight_bytes(draft) / 1e9:.2f} GB) "
          f"on {dev} in {time.perf_counter() - started:.1f} s", flush=True)
    prompt = list(torch.randint(0, shapes["target"]["vocab_size"], (args.prompt_tokens,),
                                generator=torch.Generator().manual_seed(0)).tolist())
    common = dict(dtype="bfloat16", max_model_len=args.prompt_tokens + args.max_tokens + 16, max_batch=4,
                  kv_cache_gib=args.kv_cache_gib, target_device=dev)
    result = {"device": dev, "shapes": args.shapes, "target_weight_bytes": bytes_t,
              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "repeats": args.repeats}

    def fresh(model):  # each engine clears the weights it was given; the tensors are shared
        return dataclasses.replace(model, weights=dict(model.weights))

    runs = [("ar", dict(mode="ar"), None), ("ar_stock_cublas", dict(mode="ar", batch_invariant=False), None),
            ("sd", dict(mode="sd", k=args.k, draft_device=dev), draft)]
    if dev == "cpu":
        runs = [r for r in runs if r[0] != "ar_stock_cublas"]  # the CPU is always batch-invariant
    for name, options, dft in runs:
        t0 = time.perf_counter()
        with LLM(fresh(target), draft=None if dft is None else fresh(dft), **common, **options) as llm:
            r = decode(llm, prompt, args.max_tokens, args.repeats)
            if options["mode"] == "sd":
                s = llm.stats()
                r["acceptance"] = s["draft_tokens_accepted"] / max(1, s["draft_tokens_proposed"])
        r["seconds"] = time.perf_counter() - t0
        result[name] = r
        print(f"{name}: {r['tok_s']:.1f} tok/s ({r['seconds']:.0f} s)", flush=True)
    result["sd_equals_ar"] = result["sd"]["token_ids"] == result["ar"]["token_ids"]
    result["linear"] = linear_bandwidth(dev, shapes)
    if dev.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(dev))
    if dev.startswith("cuda") or args.bandwidth_gbs is not None:
        print(add_bandwidth_bound(result, *device_bandwidth(dev, args.bandwidth_gbs)), flush=True)
    print(f"greedy sd equals ar: {result['sd_equals_ar']}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"{BENCH_PROG} gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    ap.add_argument("--shapes", default="llama", choices=sorted(SHAPES), help="llama: 8B target, 1B draft")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--bandwidth-gbs", type=float,
                    help="the device's peak memory bandwidth in GB/s for the bound (default: from the "
                         "device's memory clock and bus width, else its datasheet)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.bandwidth_gbs is not None and not args.bandwidth_gbs > 0:
        ap.error(f"--bandwidth-gbs must be positive, got {args.bandwidth_gbs}")
    from ssd import _C

    problem = _C.device_problem(args.device)
    if problem:
        ap.error(problem)
    result = run(args)
    if args.json:
        write_result(args.json, result,
                     command_line(["gpu", *(sys.argv[1:] if argv is None else argv)], BENCH_PROG))
    return 0 if result["sd_equals_ar"] else 1


if __name__ == "__main__":
    sys.exit(main())
