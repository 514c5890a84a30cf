"""Times torch.ops.ssd.saguaro_sample on the CPU over representative shapes.

Usage: python bench/kernels/bench_saguaro_sample.py [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from ssd.bench.record import write_result
from ssd.bench.timing import time_call

# name -> (temperature, top_k, top_p, fanout, downweight)
SETTINGS = {
    "p only (F=0)": (0.8, 0, 1.0, 0, 1.0),
    "sigma F=4 C=0.5": (0.8, 0, 1.0, 4, 0.5),
    "top-k 50, top-p 0.9, F=4": (0.8, 50, 0.9, 4, 0.5),
    "top-p 0.95, F=8": (0.8, 0, 0.95, 8, 0.3),
    "greedy": (0.0, 0, 1.0, 4, 0.5),
}


def bench(vocab: int, rows: int, setting: tuple) -> float:
    t, k, p, f, c = setting
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    full = lambda v, dtype: torch.full((rows,), v, dtype=dtype)  # noqa: E731
    args = (logits, full(t, torch.float64), full(k, torch.int64), full(p, torch.float64), full(f, torch.int64),
            full(c, torch.float64), torch.rand(rows, dtype=torch.float64), torch.empty_like(logits))
    return time_call(lambda: torch.ops.ssd.saguaro_sample(*args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    print(f"{'vocab':>7} {'rows':>5}  {'setting':<26} {'median ms':>10} {'us/row':>9}")
    for vocab in (49152, 151936):
        for rows in (1, 8, 64):
            for name, setting in SETTINGS.items():
                seconds = bench(vocab, rows, setting)
                results.append({"vocab": vocab, "rows": rows, "setting": name, "median_s": seconds})
                print(f"{vocab:>7} {rows:>5}  {name:<26} {seconds * 1e3:>10.3f} {seconds * 1e6 / rows:>9.1f}")
    if args.json:
        write_result(args.json, {"results": results})


if __name__ == "__main__":
    main()
