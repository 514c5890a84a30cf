"""Time of one forward of m new rows on SmolLM2-135M, per dtype and CPU instruction set.

    python bench/kernels/bench_forward_rows.py [--dtypes ...] [--cpu-isas ...] [--threads N] [--json FILE]

Each forward appends m tokens to one sequence holding a 128-token context
(logits for every row, as a verify does) and is undone after timing; the
median of 7 is reported, with its ratio to m = 1. m = 1 is a decode step,
m = 5 a k = 4 verify, m = 64 a prefill chunk: the ratios show how a
product's cost grows with rows once the weights are read.
"""
from __future__ import annotations

import argparse
import statistics
import time

from ssd import _C, assets
from ssd.bench.record import write_result
from ssd.models import load

ROWS = [1, 5, 8, 16, 64]
CONTEXT = 128


def median_forward(runner, seq: int, m: int, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        n = runner.length(seq)
        start = time.perf_counter()
        runner.extend([(seq, [11 + j for j in range(m)])], True)
        times.append(time.perf_counter() - start)
        runner.truncate(seq, n)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "q8_0", "q4_0"])
    parser.add_argument("--cpu-isas", nargs="+", default=None, help="default: every one this CPU runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args()
    isas = args.cpu_isas or _C.cpu_isas()
    if missing := [isa for isa in isas if isa not in _C.cpu_isas()]:
        parser.error(f"--cpu-isas: this CPU cannot run {', '.join(missing)} (it runs: {', '.join(_C.cpu_isas())})")
    rows = []
    print(f"{'dtype':<10}{'isa':<13}" + "".join(f"{f'm={m} ms':>11}" for m in ROWS))
    for dtype in args.dtypes:
        core = load(assets.smollm2_gguf_path(), dtype=dtype).core_model()
        for isa in isas:
            _C.set_cpu_isa(isa)
            runner = _C.SequenceRunner(core, (CONTEXT + max(ROWS)) // 16 + 2, 16, args.threads)
            seq = runner.add_sequence()
            runner.extend([(seq, [(7 * i + 3) % 1000 for i in range(CONTEXT)])], False)
            ms = [median_forward(runner, seq, m) * 1e3 for m in ROWS]
            rows += [{"dtype": dtype, "cpu_isa": isa, "threads": args.threads, "rows": m, "ms": t,
                      "vs_one_row": t / ms[0]} for m, t in zip(ROWS, ms)]
            print(f"{dtype:<10}{isa:<13}" + "".join(f"{t:>11.1f}" for t in ms), flush=True)
    if args.json:
        write_result(args.json, {"context": CONTEXT, "rows": rows})


if __name__ == "__main__":
    main()
