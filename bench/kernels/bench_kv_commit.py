"""CPU time of kv_commit per call, and the bytes it moves, on model-like cache shapes.

    python bench/kernels/bench_kv_commit.py [--json FILE]

A call copies n rows per layer and per K/V: bytes moved = 2 (read + write) *
layers * 2 * n * kv_heads * head_dim * 4. tree "own": separate tree pages;
"in_cache": the tree pages are slots of the cache itself (the overlap check
runs; no source is also a destination, so no row is staged).

hot: the same rows every call (they stay in the CPU caches); cold: each call
commits a different random set of rows, so most of them come from memory, as
in a decode loop over a large cache.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import ssd._C  # noqa: F401  (registers torch.ops.ssd)
from ssd.bench.record import write_result

MODELS = {  # name: (layers, kv_heads, head_dim)
    "smollm2-135m": (30, 3, 64),
    "llama-8b": (32, 8, 128),
}
SLOTS = [1, 2, 4, 8, 16, 32]
CACHE_SLOTS = 1024  # 64 blocks of 16
TREE_SLOTS = 256


def median_seconds(fn, warmup: int = 5, repeats: int = 30) -> float:
    """Median time of fn(call_index) over `repeats` calls after `warmup` calls."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(warmup + i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_model(name: str, layers: int, kv_heads: int, head_dim: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(layers, 2, CACHE_SLOTS, kv_heads, head_dim, generator=gen)
    tree = torch.randn(layers, 2, TREE_SLOTS, kv_heads, head_dim, generator=gen)
    row_bytes = kv_heads * head_dim * 4
    rows = []
    for n in SLOTS:
        # Tree slots stay clear of cache slots 0..TREE_SLOTS-1, so the in-cache tree never overlaps dst.
        picks = [(torch.randperm(TREE_SLOTS, generator=gen)[:n],
                  TREE_SLOTS + torch.randperm(CACHE_SLOTS - TREE_SLOTS, generator=gen)[:n]) for _ in range(64)]
        for placement, tree_arg in (("own", tree), ("in_cache", cache)):
            def commit(src, dst, tree_arg=tree_arg):
                torch.ops.ssd.kv_commit(cache, tree_arg, src, dst)

            hot = median_seconds(lambda i: commit(*picks[0]))
            cold = median_seconds(lambda i: commit(*picks[i % len(picks)]))
            moved = 2 * layers * 2 * n * row_bytes
            rows.append({"model": name, "tree": placement, "n": n, "hot_us": hot * 1e6,
                         "cold_us": cold * 1e6, "bytes": moved, "cold_gb_s": moved / cold / 1e9})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args()
    rows = [row for name, shape in MODELS.items() for row in bench_model(name, *shape)]
    print(f"{'model':<14}{'tree':<10}{'n':>4}{'hot us':>10}{'cold us':>10}{'bytes':>12}{'cold GB/s':>11}")
    for r in rows:
        print(f"{r['model']:<14}{r['tree']:<10}{r['n']:>4}{r['hot_us']:>10.1f}{r['cold_us']:>10.1f}"
              f"{r['bytes']:>12,}{r['cold_gb_s']:>11.2f}")
    if args.json:
        write_result(args.json, {"torch_threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
