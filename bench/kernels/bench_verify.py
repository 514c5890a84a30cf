"""CPU time of torch.ops.ssd.verify over representative shapes.

Plain sampling (temperature 1, no top-k/top-p). The cost grows with the number
of positions a row processes (accepted + 1), so the table shows the mean
accepted count next to each time. Usage:
    python bench/kernels/bench_verify.py [--json FILE] [--repeats N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import ssd._C  # noqa: F401  (registers torch.ops.ssd)
from ssd.bench.record import write_result

BATCHES = (1, 8, 64)
KS = (4, 8)
VOCABS = (49_152, 151_936)


def make_inputs(batch: int, k: int, vocab: int, one_hot: bool, seed: int = 0) -> tuple:
    """Peaked targets (one likely token per position, as in real text); plain rows
    propose from a noisy copy q of the target, one-hot rows propose q's argmax (as a
    prompt-lookup guess would)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 2
    likely = torch.randint(0, vocab, (batch, k + 1, 1), generator=g)
    logits.scatter_add_(2, likely, 12 + 6 * torch.rand(batch, k + 1, 1, generator=g))
    q = torch.softmax(logits[:, :k] + 0.5 * torch.randn(batch, k, vocab, generator=g), -1)
    if one_hot:
        proposals = q.argmax(-1)
    else:
        proposals = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    return (
        logits,
        proposals,
        torch.full((batch,), k),
        q,
        torch.full((batch,), one_hot),
        torch.ones(batch, dtype=torch.float64),
        torch.zeros(batch, dtype=torch.int64),
        torch.ones(batch, dtype=torch.float64),
        torch.rand(batch, k, generator=g, dtype=torch.float64),
        torch.rand(batch, generator=g, dtype=torch.float64),
    )


def time_op(args: tuple, repeats: int) -> tuple[float, float]:
    """Median seconds per call and mean accepted count."""
    accepted, _ = torch.ops.ssd.verify(*args)  # warmup
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.ops.ssd.verify(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), float(accepted.double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    print(f"torch.ops.ssd.verify on CPU, {torch.get_num_threads()} threads, median of {opts.repeats}")
    print(f"{'B':>3} {'K':>2} {'V':>7} {'q':>8} {'ms':>9} {'ms/row':>8} {'accepted':>8}")
    rows = []
    for vocab in VOCABS:
        for k in KS:
            for batch in BATCHES:
                for one_hot in (False, True):
                    seconds, accepted = time_op(make_inputs(batch, k, vocab, one_hot), opts.repeats)
                    kind = "one-hot" if one_hot else "plain"
                    ms = seconds * 1e3
                    print(f"{batch:>3} {k:>2} {vocab:>7} {kind:>8} {ms:>9.2f} {ms / batch:>8.3f} {accepted:>8.2f}")
                    rows.append(dict(batch=batch, k=k, vocab=vocab, q=kind, ms=ms, mean_accepted=accepted))
    if opts.json:
        write_result(opts.json, {"threads": torch.get_num_threads(), "results": rows})


if __name__ == "__main__":
    main()
