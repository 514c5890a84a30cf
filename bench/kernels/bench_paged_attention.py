"""CPU time and achieved memory bandwidth of torch.ops.ssd.paged_attention.

Bytes counted are what the op must move at least: K and V of every attended
position of every sequence (once, however many queries or heads share it),
q and out. Bandwidth is reported as a fraction of the machine's copy
bandwidth (bytes read + written by a large tensor copy) at the same thread
count. Caches are cycled so that each call reads from memory, not L2/L3. GFLOP/s
counts 4 * head_dim per (query head, attended key): q.k and the value sum.
Run with THP_MEM_ALLOC_ENABLE=1 to back the caches with transparent huge pages.
--kv-dtype bfloat16 times bf16 caches (kv_cache_dtype="bfloat16": 2 bytes a
value, widened as they are read).

    python bench/kernels/bench_paged_attention.py [--quick] [--kv-dtype float32|bfloat16] [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from attention_bench_common import copy_bandwidth, median_time, num_threads, print_table, scattered_caches, write_json

MODELS = {"SmolLM2-135M": (9, 3, 64), "Llama-3-8B": (32, 8, 128)}  # q heads, kv heads, head dim
BLOCK_SIZE = 16
VERIFY_TOKENS = 5  # K + 1 with K = 4 draft tokens


def workloads(quick: bool):
    """(name, context, batch, tokens per sequence): decode rows, then verify chunks."""
    contexts = [512, 4096] if quick else [512, 1024, 2048, 4096]
    for ctx in contexts:
        for batch in (1, 4, 8):
            yield "decode", ctx, batch, 1
    for ctx in (512, 4096):
        yield "verify", ctx, 4, VERIFY_TOKENS


def bench_one(model: str, kind: str, ctx: int, batch: int, per_seq: int, threads: list[int], copy_bw: dict,
              kv_dtype: torch.dtype = torch.float32) -> list[dict]:
    hq, hkv, d = MODELS[model]
    tokens = batch * per_seq
    kv_bytes = batch * ctx * hkv * d * kv_dtype.itemsize * 2
    io_bytes = 2 * tokens * hq * d * 4
    flops = 4 * d * hq * batch * sum(range(ctx - per_seq + 1, ctx + 1))  # q.k and p.v per (head, key)
    caches = [(k.to(kv_dtype), v.to(kv_dtype), tables)
              for k, v, tables in scattered_caches([ctx] * batch, BLOCK_SIZE, hkv, d, kv_bytes)]
    seq_of_token = torch.arange(batch, dtype=torch.int32).repeat_interleave(per_seq)
    positions = (torch.arange(ctx - per_seq, ctx, dtype=torch.int32)).repeat(batch)
    q = torch.randn(tokens, hq, d)
    out = torch.empty_like(q)

    def call(i):
        k, v, tables = caches[i % len(caches)]
        torch.ops.ssd.paged_attention(q, k, v, tables, seq_of_token, positions, d**-0.5, out)

    rows = []
    for n in threads:
        with num_threads(n):
            t = median_time(call, calls=5)
        gbs = (kv_bytes + io_bytes) / t / 1e9
        rows.append(dict(model=model, kind=kind, context=ctx, batch=batch, tokens=tokens, threads=n, ms=t * 1e3,
                         mbytes=(kv_bytes + io_bytes) / 1e6, gbs=gbs, fraction=gbs / copy_bw[n],
                         gflops=flops / t / 1e9))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer contexts")
    parser.add_argument("--kv-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the caches' element type (default float32)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    kv_dtype = getattr(torch, args.kv_dtype)
    threads = sorted({1, torch.get_num_threads()})
    copy_bw = {n: copy_bandwidth(n) for n in threads}
    print("copy bandwidth (read + write): " + ", ".join(f"{n} thread(s) {bw:.1f} GB/s" for n, bw in copy_bw.items()))
    rows = []
    for model in MODELS:
        for kind, ctx, batch, per_seq in workloads(args.quick):
            rows += bench_one(model, kind, ctx, batch, per_seq, threads, copy_bw, kv_dtype)
    print_table(rows, [("model", "model", ""), ("kind", "kind", ""), ("context", "ctx", "d"), ("batch", "batch", "d"),
                       ("tokens", "tokens", "d"), ("threads", "thr", "d"), ("ms", "ms/call", ".3f"),
                       ("mbytes", "MB", ".1f"), ("gbs", "GB/s", ".2f"), ("fraction", "of copy", ".0%"),
                       ("gflops", "GFLOP/s", ".1f")])
    write_json(args.json, {"copy_bandwidth_gbs": copy_bw, "block_size": BLOCK_SIZE, "kv_dtype": args.kv_dtype,
                           "results": rows})


if __name__ == "__main__":
    main()
