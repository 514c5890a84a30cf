"""Times torch.ops.ssd.gumbel_sample and gumbel_top on the CPU over representative shapes.

The draw hashes every token of the support; the CPU kernel skips the
logarithms of tokens that provably cannot win, so a full-support row costs
about one hash per token. gumbel_top (the ssd tree's ranking, here its
deepest list, 33 tokens) prunes against its list's worst score the same way.
Rows beside them: saguaro_sample's inverse-CDF draw of the same rows (F = 0),
the rejection coupling's per-row sampling cost.

Usage: python bench/kernels/bench_gumbel_sample.py [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from ssd.bench.record import write_result
from ssd.bench.timing import time_call

# name -> (temperature, top_k, top_p) of the processed rows drawn from
SETTINGS = {
    "full support (T=1)": (1.0, 0, 1.0),
    "top-k 50": (1.0, 50, 1.0),
    "top-p 0.95": (0.8, 0, 0.95),
}


def processed(vocab: int, rows: int, setting: tuple) -> tuple[torch.Tensor, tuple]:
    """The processed rows (saguaro_sample with F = 0 is process_logits) and that call's arguments."""
    t, k, p = setting
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    full = lambda v, dtype: torch.full((rows,), v, dtype=dtype)  # noqa: E731
    probs = torch.empty_like(logits)
    args = (logits, full(t, torch.float64), full(k, torch.int64), full(p, torch.float64), full(0, torch.int64),
            full(1.0, torch.float64), torch.rand(rows, dtype=torch.float64), probs)
    torch.ops.ssd.saguaro_sample(*args)
    return probs, args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    print(f"{'vocab':>7} {'rows':>5}  {'setting':<20} {'gumbel ms':>10} {'us/row':>8} {'top-33 ms':>10} "
          f"{'inverse-CDF ms':>15}")
    for vocab in (49152, 151936):
        for rows in (1, 8, 64):
            for name, setting in SETTINGS.items():
                probs, saguaro_args = processed(vocab, rows, setting)
                seeds = torch.arange(rows, dtype=torch.int64) * 7919
                positions = torch.arange(rows, dtype=torch.int64) + 100
                gumbel = time_call(lambda: torch.ops.ssd.gumbel_sample(probs, seeds, positions))
                top = time_call(lambda: torch.ops.ssd.gumbel_top(probs, seeds, positions, 33))
                inverse = time_call(lambda: torch.ops.ssd.saguaro_sample(*saguaro_args))
                results.append({"vocab": vocab, "rows": rows, "setting": name, "gumbel_median_s": gumbel,
                                "gumbel_top33_median_s": top, "saguaro_sample_median_s": inverse})
                print(f"{vocab:>7} {rows:>5}  {name:<20} {gumbel * 1e3:>10.3f} {gumbel * 1e6 / rows:>8.1f} "
                      f"{top * 1e3:>10.3f} {inverse * 1e3:>15.3f}")
    if args.json:
        write_result(args.json, {"results": results})


if __name__ == "__main__":
    main()
