"""CPU time and achieved memory bandwidth of torch.ops.ssd.fork_attention.

One tree-decode step: S sequences x F branches; branch (j, c) forks after j
of the K drafted tokens, so its prefix is the sequence's context plus j
positions (ragged), and its path holds its K + 1 decoded positions in blocks
of its own (its table: the sequence's full blocks before the fork, then
fresh ones). Bytes counted are what the op must move at least: K and V of
every sequence's longest prefix (once, however many branches share it),
every branch's path, q and out; as a fraction of the machine's copy bandwidth (read + written bytes of a
large tensor copy) at the same thread count. Caches are cycled so that each
call reads from memory, not L2/L3. GFLOP/s counts 4 * head_dim per (query
head, attended key): q.k and the value sum. With 16 branches sharing each
prefix the op does ~16 FLOP per byte and is compute-bound on a CPU. Run with
THP_MEM_ALLOC_ENABLE=1 to back the caches with transparent huge pages.
"paged ms" is the same step as the tree ran it before fork attention: every
branch through its own table in paged attention, no prefix pass shared.

    python bench/kernels/bench_fork_attention.py [--quick] [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from attention_bench_common import copy_bandwidth, median_time, num_threads, print_table, scattered_caches, write_json

MODELS = {"SmolLM2-135M": (9, 3, 64), "Llama-3-8B": (32, 8, 128)}  # q heads, kv heads, head dim
BLOCK_SIZE = 16
SEQUENCES, BRANCHES, K = 8, 16, 4


def bench_one(model: str, ctx: int, threads: list[int], copy_bw: dict) -> list[dict]:
    hq, hkv, d = MODELS[model]
    n = SEQUENCES * BRANCHES
    row_bytes = hkv * d * 4 * 2  # K and V of one position
    seq_len = ctx + K  # the context and the K drafted tokens are in the cache
    prefix_bytes = SEQUENCES * seq_len * row_bytes
    path_bytes = n * (K + 1) * row_bytes
    io_bytes = 2 * n * hq * d * 4
    total = prefix_bytes + path_bytes + io_bytes
    branch_seq = torch.arange(SEQUENCES).repeat_interleave(BRANCHES)
    prefix_len = ctx + (torch.arange(n, dtype=torch.int32) % (K + 1))
    path_len = K + 1
    first_block = prefix_len // BLOCK_SIZE
    fresh = (prefix_len + path_len - 1) // BLOCK_SIZE - first_block + 1  # the branch's own blocks
    # The sequences, then one "sequence" per branch holding its fresh blocks.
    caches = scattered_caches([seq_len] * SEQUENCES + (fresh * BLOCK_SIZE).tolist(), BLOCK_SIZE, hkv, d, prefix_bytes)
    tables = []
    for k, v, seq_tables in caches:
        own = torch.zeros(n, seq_tables.shape[1], dtype=torch.int32)
        for b in range(n):
            shared = seq_tables[branch_seq[b], : first_block[b]]
            own[b, : len(shared) + fresh[b]] = torch.cat([shared, seq_tables[SEQUENCES + b, : fresh[b]]])
        tables.append((k, v, torch.cat([seq_tables[:SEQUENCES], own])))
    seq_of_token = torch.arange(SEQUENCES, SEQUENCES + n, dtype=torch.int32)
    positions = prefix_len + path_len - 1
    prefix_seq = branch_seq.to(torch.int32)
    q = torch.randn(n, hq, d)
    out = torch.empty_like(q)
    flops = 4 * d * hq * int((positions + 1).sum())  # q.k and p.v per (head, key)

    def call(i):
        k, v, tabs = tables[i % len(tables)]
        torch.ops.ssd.fork_attention(q, k, v, tabs, seq_of_token, positions, prefix_seq, prefix_len, d**-0.5, out)

    def call_paged(i):
        # The tree before fork attention: each branch through its own table alone.
        k, v, tabs = tables[i % len(tables)]
        torch.ops.ssd.paged_attention(q, k, v, tabs, seq_of_token, positions, d**-0.5, out)

    rows = []
    for t_count in threads:
        with num_threads(t_count):
            t = median_time(call, calls=5)
            t_paged = median_time(call_paged, calls=5)
        gbs = total / t / 1e9
        rows.append(dict(model=model, context=ctx, branches=n, threads=t_count, ms=t * 1e3, mbytes=total / 1e6,
                         gbs=gbs, fraction=gbs / copy_bw[t_count], gflops=flops / t / 1e9,
                         paged_ms=t_paged * 1e3, speedup=t_paged / t))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer contexts")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    threads = sorted({1, torch.get_num_threads()})
    copy_bw = {n: copy_bandwidth(n) for n in threads}
    print("copy bandwidth (read + write): " + ", ".join(f"{n} thread(s) {bw:.1f} GB/s" for n, bw in copy_bw.items()))
    print(f"{SEQUENCES} sequences x {BRANCHES} branches, K = {K}, path_len = K + 1, block size {BLOCK_SIZE}")
    rows = []
    for model in MODELS:
        for ctx in [512, 4096] if args.quick else [512, 1024, 2048, 4096]:
            rows += bench_one(model, ctx, threads, copy_bw)
    print_table(rows, [("model", "model", ""), ("context", "ctx", "d"), ("branches", "branches", "d"),
                       ("threads", "thr", "d"), ("ms", "ms/call", ".3f"), ("mbytes", "MB", ".1f"),
                       ("gbs", "GB/s", ".2f"), ("fraction", "of copy", ".0%"),
                       ("gflops", "GFLOP/s", ".1f"), ("paged_ms", "paged ms", ".3f"),
                       ("speedup", "x paged", ".2f")])
    write_json(args.json, {"copy_bandwidth_gbs": copy_bw, "block_size": BLOCK_SIZE, "sequences": SEQUENCES,
                           "branches_per_sequence": BRANCHES, "k": K, "results": rows})


if __name__ == "__main__":
    main()
