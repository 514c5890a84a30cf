"""What ``python -m ssd.bench gpu`` measures beside its tok/s table: long contexts, prefill, kernels.

- Decode at each of ``--contexts`` (ar, batch 1, batch-invariant products):
  a prompt of that many random tokens, prefilled in the engine's chunks
  (``max_batched_tokens``), then ``--context-tokens`` greedy tokens; the
  tok/s of the tokens after the first, and the bytes a step reads at the
  timed steps' mean context (``step_bytes``: the weights once and every
  cached K and V value), which ``gpu.add_bandwidth_bound`` turns into a
  bound and a fraction of it.
- Prefill of a ``--prefill-tokens`` prompt: its tokens over its time to the
  first token, with batch-invariant products (the context run of that
  length when there is one) and, on CUDA, stock cuBLAS products
  (``batch_invariant=False``; the CPU is always batch-invariant).
- The share of a decode step at the first context spent outside kernels
  (CUDA only): 1 minus the CUDA kernel time per step over the step's wall
  time. The kernel time is torch.profiler's (the union of the kernels' intervals, so kernels that
  overlap count once), from a profiled request of 1 + PROFILED_STEPS tokens
  less one of 1 token on the same prompt (the prefill cancels); the wall time
  is the unprofiled decode's at the same context (the profiler slows
  launches, not kernels).
- Each of the forward's products (qkv, o, gate_up, down, lm_head) alone at
  one row: GB/s over the wall time of a call and, on CUDA, over its kernels'.

A long prompt's prefill can take tens of seconds, so with ``--time-budget-s``
each measurement is first estimated from the last one (prefill at most
quadratic in the context, a decode step at most linear: an upper bound when
the costs are sums of such terms) and skipped, recorded with why, when it
would end past the budget. On the CPU what needs CUDA is None with why.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

# Per --shapes: the contexts decoded at and the prefill's prompt length (the tiny
# shapes' are small so that a CPU run stays within seconds).
DEFAULTS = {"llama": ([1024, 4096, 16384], 4096), "tiny": ([64, 256], 256)}
CONTEXT_TOKENS = 32  # tokens generated at each context, the first not timed
PROFILED_STEPS = 8  # decode steps the kernel time is taken over
WARMUP = (16, 4)  # prompt tokens, generated tokens: the untimed request an engine starts with
KV_VALUE_BYTES = {"float32": 4, "bfloat16": 2}
# The goals for a first GPU run (docs/gpu.md): (what, result key, comparison, threshold).
GOALS = [
    ("ar batch 1 at 1K context >= 80% of the bound", ("contexts", 1024, "fraction_of_bound"), ">=", 0.80),
    ("ar batch 1 at 16K context >= 60% of the bound", ("contexts", 16384, "fraction_of_bound"), ">=", 0.60),
    ("prefill of a 4K prompt, stock cuBLAS, >= 10,000 tok/s", ("prefill", 4096, "stock_cublas"), ">=", 10_000.0),
    ("outside kernels <= 5% of a decode step", ("outside_kernels",), "<=", 0.05),
]


def kv_cache_dtype_on(device: str, kv_cache_dtype: str = "auto") -> str:
    """The KV cache's element type on `device` as the engine resolves it
    (``EngineConfig::kv_cache_dtype_on``): "auto" is bfloat16 on a GPU and
    float32 on the CPU (docs/configuration.md)."""
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return "float32" if device == "cpu" else "bfloat16"


def step_bytes(config, weight_bytes: int, context: float, kv_cache_dtype: str) -> float:
    """The bytes one batch-1 decode step reads from memory at `context` keys.

    weight_bytes (every weight is read once a step: true of a tied head, which
    reads the embedding it looks one row up in; an untied model's embedding
    counts too, a slight over-count) plus the KV cache's: attention reads
    every cached key and value of every layer and KV head,
    ``2 * num_layers * num_kv_heads * head_dim * context`` values of
    ``KV_VALUE_BYTES[kv_cache_dtype]`` bytes. Activations are left out (KBs).
    A step that feeds the token at position p attends over p + 1 keys.
    """
    kv_values = 2 * config.num_layers * config.num_kv_heads * config.head_dim * context
    return weight_bytes + kv_values * KV_VALUE_BYTES[kv_cache_dtype]


def mean_context(prompt_tokens: int, max_tokens: int) -> float:
    """The mean keys a timed decode step attends over: after a prompt of
    prompt_tokens the steps feed positions prompt_tokens .. prompt_tokens +
    max_tokens - 2 (the first token comes from the prefill, untimed), so they
    attend over prompt_tokens + 1 .. prompt_tokens + max_tokens - 1 keys."""
    return prompt_tokens + max_tokens / 2


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals, in their unit."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def trace_kernels(trace: dict) -> tuple[float, int]:
    """(seconds the device ran kernels, kernel count) of a torch.profiler
    Chrome trace: its complete events of category "kernel" (ts and dur in
    microseconds); memory copies and host events are not kernels."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in trace.get("traceEvents", [])
             if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]
    return busy_seconds(spans) / 1e6, len(spans)


def cuda_kernels(fn) -> tuple[float, int]:
    """fn() under torch.profiler recording CUDA activity: (kernel seconds, kernels), ``trace_kernels``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return trace_kernels(json.load(f))
    finally:
        os.unlink(path)


class Deadline:
    """What is left of --time-budget-s, counted from the bench's start (None: no limit)."""

    def __init__(self, started: float, budget_s: float | None):
        self.started, self.budget_s = started, budget_s

    def why_skip(self, estimate_s: float | None) -> str | None:
        """None when a measurement estimated to take estimate_s may start; one not estimated (None:
        the first of its kind) starts while any of the budget is left."""
        if self.budget_s is None:
            return None
        left = self.started + self.budget_s - time.perf_counter()
        if estimate_s is None:
            return None if left > 0 else "skipped: --time-budget-s spent"
        if estimate_s <= left:
            return None
        return f"skipped: estimated {estimate_s:.0f} s, {max(left, 0):.0f} s of --time-budget-s left"


def estimate_s(last: dict | None, context: int, decode_tokens: int) -> float | None:
    """An upper bound of a request's seconds at `context` (prefill, then decode_tokens tokens) from
    `last`, a measured row at a context at most as long; None without one."""
    if last is None:
        return None
    ratio = context / last["context"]
    decode = last.get("decode_seconds", 0.0) * ratio * max(decode_tokens - 1, 0) / max(last["decode_tokens"] - 1, 1)
    return last["prefill_seconds"] * ratio ** 2 + decode


def request(llm, prompt: list[int], max_tokens: int) -> dict:
    """One greedy request alone in the engine: its prefill (time to first
    token) and, past the first token, its decode tok/s."""
    from ssd import SamplingParams

    (out,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    if out.finish_reason == "error" or len(out.token_ids) != max_tokens:
        raise RuntimeError(f"generate: finish_reason={out.finish_reason} error={out.error}")
    m = out.metrics
    r = {"context": len(prompt), "decode_tokens": max_tokens, "prefill_seconds": m["time_to_first_token"],
         "prefill_tok_s": len(prompt) / m["time_to_first_token"]}
    if max_tokens > 1:
        r["decode_seconds"] = m["finish_time"] - m["time_to_first_token"]
        r["tok_s"] = (max_tokens - 1) / r["decode_seconds"]
    return r


def random_prompt(vocab: int, tokens: int, seed: int) -> list[int]:
    import torch

    return torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine_length(contexts: list[int], context_tokens: int, prefill_tokens: int) -> int:
    """max_model_len (and KV slots) of the engine that runs them: the longest request and a margin, in 16s."""
    longest = max([c + context_tokens for c in contexts] + [prefill_tokens + 1, sum(WARMUP)])
    return -(-(longest + 16) // 16) * 16


def ar_engine(model, device: str, length: int, **options):
    """An ar engine for one sequence of up to `length` tokens, after an untimed warm-up request."""
    from ssd import LLM

    llm = LLM(model, mode="ar", max_batch=1, dtype="bfloat16", target_device=device, max_model_len=length,
              kv_capacity_tokens=length, **options)
    try:
        request(llm, random_prompt(model.config.vocab_size, WARMUP[0], seed=99), WARMUP[1])
    except BaseException:
        llm.shutdown()
        raise
    return llm


def long_contexts(target, args, deadline: Deadline, weight_bytes: int) -> dict:
    """Decode at each of args.contexts, the batch-invariant prefill of args.prefill_tokens and the
    share outside kernels, on one ar engine: ``result`` entries "contexts", "prefill" (its
    batch-invariant row) and "outside_kernels"; rows that failed have "error", skipped ones "why"."""
    dev, n = args.device, args.context_tokens
    kv_dtype = kv_cache_dtype_on(dev)
    vocab = target.config.vocab_size
    contexts = {"decode_tokens": n, "kv_cache_dtype": kv_dtype,
                "kv_bytes_per_token": step_bytes(target.config, 0, 1, kv_dtype), "runs": []}
    outside = {"fraction": None, "why": "no context was measured" if dev.startswith("cuda")
               else f"not measured on {dev}: needs CUDA kernel times"}
    prefill = {"tok_s": None, "why": "--prefill-tokens 0"}
    if not args.contexts and not args.prefill_tokens:
        return {"contexts": contexts, "prefill": prefill, "outside_kernels": outside}
    started = time.perf_counter()
    try:
        llm = ar_engine(target, dev, engine_length(args.contexts, n, args.prefill_tokens))
    except Exception as e:  # noqa: BLE001 -- recorded; the rest of the bench goes on
        error = f"{type(e).__name__}: {e}"
        contexts["runs"] = [{"context": c, "tok_s": None, "error": error} for c in args.contexts]
        return {"contexts": contexts, "prefill": {"tok_s": None, "error": error}, "outside_kernels": outside}
    measured = []
    with llm:
        print(f"decode at long contexts: ar, batch 1, {n} tokens after a prompt of each length "
              f"(KV cache {kv_dtype}; engine ready in {time.perf_counter() - started:.1f} s)", flush=True)
        print(f"{'context':>8}{'prefill tok/s':>15}{'decode tok/s':>14}{'step MB':>10}", flush=True)
        for context in sorted(args.contexts):
            row = _measured(lambda: request(llm, random_prompt(vocab, context, seed=context), n),
                            deadline.why_skip(estimate_s(measured[-1] if measured else None, context, n)),
                            context=context)
            if "error" not in row and "why" not in row:
                row["mean_context"] = mean_context(context, n)
                row["step_bytes"] = step_bytes(target.config, weight_bytes, row["mean_context"], kv_dtype)
                row.update(bound_tok_s=None, fraction_of_bound=None)
                measured.append(row)
                print(f"{context:>8}{row['prefill_tok_s']:>15.1f}{row['tok_s']:>14.1f}"
                      f"{row['step_bytes'] / 1e6:>10.1f}", flush=True)
            else:
                print(f"{context:>8}  {row.get('error') or row['why']}", flush=True)
            contexts["runs"].append(row)
            if dev.startswith("cuda") and len(measured) == 1 and row is measured[0]:
                outside = outside_kernels(llm, random_prompt(vocab, context, seed=context), row, deadline)
        if args.prefill_tokens:
            prefill = prefill_row(llm, args.prefill_tokens, vocab, measured, deadline)
    return {"contexts": contexts, "prefill": prefill, "outside_kernels": outside}


def _measured(fn, why_skip: str | None, **row) -> dict:
    """fn()'s row, or `row` with why it was skipped or the error it raised."""
    if why_skip is not None:
        return {**row, "tok_s": None, "why": why_skip}
    started = time.perf_counter()
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 -- recorded per measurement; the others go on
        return {**row, "tok_s": None, "error": f"{type(e).__name__}: {e}"}
    return {**r, "seconds": time.perf_counter() - started}


def prefill_row(llm, tokens: int, vocab: int, measured: list[dict], deadline: Deadline) -> dict:
    """Prefill tok/s of a `tokens`-token prompt on `llm`: the context run of that length, else a request of it."""
    same = next((r for r in measured if r["context"] == tokens), None)
    if same is not None:
        return {"tok_s": same["prefill_tok_s"], "seconds": same["prefill_seconds"],
                "from": f"the {tokens}-token context run"}
    shorter = [r for r in measured if r["context"] < tokens]
    row = _measured(lambda: request(llm, random_prompt(vocab, tokens, seed=tokens), 1),
                    deadline.why_skip(estimate_s(shorter[-1] if shorter else None, tokens, 1)))
    if "prefill_tok_s" in row:
        row = {"tok_s": row["prefill_tok_s"], "seconds": row["prefill_seconds"], "from": "its own request"}
    return row


def stock_prefill(stock, args) -> dict:
    """Prefill tok/s of an args.prefill_tokens prompt with stock cuBLAS products (``batch_invariant=False``)."""
    if not args.device.startswith("cuda"):
        return {"tok_s": None, "why": f"not measured on {args.device}: its products are always batch-invariant"}
    if not args.prefill_tokens:
        return {"tok_s": None, "why": "--prefill-tokens 0"}

    def measure():
        with ar_engine(stock, args.device, engine_length([], 0, args.prefill_tokens),
                       batch_invariant=False) as llm:
            r = request(llm, random_prompt(stock.config.vocab_size, args.prefill_tokens, seed=args.prefill_tokens), 1)
        return {"tok_s": r["prefill_tok_s"], "seconds": r["prefill_seconds"]}

    return _measured(measure, None)


def outside_kernels(llm, prompt: list[int], row: dict, deadline: Deadline) -> dict:
    """The share of a decode step at len(prompt) outside CUDA kernels (the module's docstring)."""
    why = deadline.why_skip(2 * row["prefill_seconds"] + row["decode_seconds"])
    if why is not None:
        return {"fraction": None, "why": why}
    try:
        first, first_n = cuda_kernels(lambda: request(llm, prompt, 1))
        more, more_n = cuda_kernels(lambda: request(llm, prompt, 1 + PROFILED_STEPS))
    except Exception as e:  # noqa: BLE001 -- the profiler's or the engine's failure, recorded
        return {"fraction": None, "error": f"{type(e).__name__}: {e}"}
    if more_n == 0:
        return {"fraction": None, "why": "torch.profiler recorded no CUDA kernels"}
    kernel_s = (more - first) / PROFILED_STEPS
    wall_s = row["decode_seconds"] / (row["decode_tokens"] - 1)
    return {"fraction": 1 - kernel_s / wall_s, "context": len(prompt), "steps": PROFILED_STEPS,
            "kernel_seconds_per_step": kernel_s, "wall_seconds_per_step": wall_s,
            "kernels_per_step": (more_n - first_n) / PROFILED_STEPS}


def format_outside(outside: dict) -> str:
    if outside["fraction"] is None:
        return f"outside kernels: {outside.get('error') or outside['why']}"
    kernel_ms, wall_ms = outside["kernel_seconds_per_step"] * 1e3, outside["wall_seconds_per_step"] * 1e3
    return (f"outside kernels: {outside['fraction']:.1%} of a decode step at context {outside['context']} "
            f"(kernels {kernel_ms:.2f} ms of {wall_ms:.2f} ms; {outside['kernels_per_step']:.0f} kernels a step; "
            f"torch.profiler over {outside['steps']} steps)")


def format_prefill(prefill: dict) -> str:
    def one(r):
        return f"{r['tok_s']:.0f} tok/s" if r.get("tok_s") is not None else (r.get("error") or r["why"])

    return (f"prefill of a {prefill['tokens']}-token prompt (ar, batch 1): batch-invariant "
            f"{one(prefill['batch_invariant'])}; stock cuBLAS {one(prefill['stock_cublas'])}")


def linear_bandwidth(device: str, shape: dict, repeats: int = 20) -> list[dict]:
    """Batch-1 bf16 matrix-vector products of each of the forward's matrices
    of `shape` (fused qkv, o, fused gate_up, down, lm_head) through the
    backend's linear step: the weight bytes a call streams over the median
    call time (a call includes its stream synchronization; on the CPU it also
    packs the matrix, so the CPU's GB/s are not the product's) and, on CUDA,
    over the call's kernel time (torch.profiler over `repeats` calls)."""
    import torch

    from ssd import _C

    steps = _C.testing.BackendSteps(device)
    h, f, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    rows = []
    for name, n, k in [("qkv", (shape["num_heads"] + 2 * shape["num_kv_heads"]) * d, h),
                       ("o", h, shape["num_heads"] * d), ("gate_up", 2 * f, h), ("down", h, f),
                       ("lm_head", shape["vocab_size"], h)]:
        w = torch.randn(n, k, device=device).to(torch.bfloat16)
        x = torch.randn(1, k, device=device)
        steps.linear(x, w, None, bf16=True)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            steps.linear(x, w, None, bf16=True)
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        row = {"matrix": name, "n": n, "k": k, "seconds": sec, "gb_s": n * k * 2 / sec / 1e9,
               "kernel_seconds": None, "kernel_gb_s": None}
        line = f"linear {name} [{n}, {k}] bf16, 1 row: {sec * 1e6:.0f} us, {row['gb_s']:.0f} GB/s"
        if device.startswith("cuda"):
            kernel_s, _ = cuda_kernels(lambda: [steps.linear(x, w, None, bf16=True) for _ in range(repeats)])
            if kernel_s > 0:
                row.update(kernel_seconds=kernel_s / repeats, kernel_gb_s=n * k * 2 * repeats / kernel_s / 1e9)
                line += f"; kernels {row['kernel_seconds'] * 1e6:.1f} us, {row['kernel_gb_s']:.0f} GB/s"
        rows.append(row)
        print(line, flush=True)
        del w
    return rows


def errors(result: dict) -> list[str]:
    """The failed measurements of this module in `result`, as ``result["errors"]`` lists them."""
    out = [f"context {r['context']}: {r['error']}" for r in result["contexts"]["runs"] if "error" in r]
    out += [f"prefill {key}: {r['error']}" for key, r in result["prefill"].items()
            if isinstance(r, dict) and "error" in r]
    if "error" in result["outside_kernels"]:
        out.append(f"outside_kernels: {result['outside_kernels']['error']}")
    return out


def format_goals(measured: list[dict]) -> str:
    return "\n".join(f"goal: {g['goal']}: {'not measured' if g['met'] is None else 'met' if g['met'] else 'NOT met'}"
                     + ("" if g["value"] is None else f" ({g['value']:.3g})") for g in measured)


def goals(result: dict) -> list[dict]:
    """The first GPU run's goals (GOALS) against `result`: each with its value and whether it is met
    (None: not measured, e.g. on the CPU or skipped)."""
    out = []
    for what, key, op, threshold in GOALS:
        value = None
        if key[0] == "contexts":
            row = next((r for r in result.get("contexts", {}).get("runs", []) if r["context"] == key[1]), {})
            value = row.get(key[2])
        elif key[0] == "prefill":
            if result.get("prefill", {}).get("tokens") == key[1]:
                value = result["prefill"][key[2]].get("tok_s")
        else:
            value = result.get("outside_kernels", {}).get("fraction")
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        out.append({"goal": what, "value": value, "met": met})
    return out
