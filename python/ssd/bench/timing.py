"""Median wall time of a call: the kernel benchmarks' one timing rule."""
from __future__ import annotations

import statistics
import time


def time_call(fn, warmup: int = 2, repeats: int = 7) -> float:
    """Median seconds of fn() after warmup calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
