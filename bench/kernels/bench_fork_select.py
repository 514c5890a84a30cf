"""Times torch.ops.ssd.fork_select on the CPU over representative shapes.

Usage: python bench/kernels/bench_fork_select.py [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from ssd.bench.record import write_result
from ssd.bench.timing import time_call

K = 5
# name -> fanout F_0..F_K (geometric, as SAGUARO plans it)
FANOUTS = {
    "F=[8,6,4,3,2,12]": [8, 6, 4, 3, 2, 12],
    "F=[32,24,16,12,8,48]": [32, 24, 16, 12, 8, 48],
}


def bench(vocab: int, batch: int, fanout: list[int]) -> float:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(batch, K + 1, vocab, generator=g) * 3, -1)
    drafted = torch.randint(0, vocab, (batch, K), generator=g)
    f = torch.tensor(fanout, dtype=torch.int64)
    return time_call(lambda: torch.ops.ssd.fork_select(probs, drafted, f, max(fanout)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    print(f"{'vocab':>7} {'B':>4} {'K':>2}  {'fanout':<22} {'median ms':>10} {'us/row':>8}")
    for vocab in (49152, 151936):
        for batch in (1, 8, 64):
            for name, fanout in FANOUTS.items():
                seconds = bench(vocab, batch, fanout)
                rows = batch * (K + 1)
                results.append({"vocab": vocab, "batch": batch, "k": K, "fanout": fanout, "median_s": seconds})
                print(f"{vocab:>7} {batch:>4} {K:>2}  {name:<22} {seconds * 1e3:>10.3f} {seconds * 1e6 / rows:>8.1f}")
    if args.json:
        write_result(args.json, {"results": results})


if __name__ == "__main__":
    main()
