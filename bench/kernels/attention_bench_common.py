"""Shared pieces of the attention benchmarks: the machine's copy bandwidth,
scattered paged caches too large to stay in the CPU caches, and timing."""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch

# Each timed call reads a cache copy that has not been touched for at least
# this many bytes of other copies, so it comes from memory, not from L2/L3.
COLD_BYTES = 192 * 2**20


@contextmanager
def num_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_time(fn, calls: int, min_seconds: float = 0.3, max_calls: int = 200) -> float:
    """Median seconds of fn(i) over calls i = 0, 1, ... (two warm-up calls first)."""
    fn(0)
    fn(1)
    times, start, i = [], time.perf_counter(), 0
    while i < max_calls and (i < calls or time.perf_counter() - start < min_seconds):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
        i += 1
    return statistics.median(times)


def copy_bandwidth(threads: int, mib: int = 512) -> float:
    """Bytes read + written per second by a large tensor copy, in GB/s."""
    src = torch.rand(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    with num_threads(threads):
        t = median_time(lambda i: dst.copy_(src), calls=5)
    return 2 * src.numel() * 4 / t / 1e9


def scattered_caches(seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int, touched_bytes: int):
    """Enough independent (k_cache, v_cache, block_tables) copies that cycling
    through them keeps each cold; blocks of each sequence scattered at random."""
    copies = max(1, -(-COLD_BYTES // max(touched_bytes, 1)))
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq)
    out = []
    for _ in range(copies):
        order = torch.randperm(num_blocks, dtype=torch.int32)
        tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32)
        start = 0
        for s, n in enumerate(per_seq):
            tables[s, :n] = order[start : start + n]
            start += n
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        out.append((torch.randn(shape), torch.randn(shape), tables))
    return out


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec)."""
    widths = [max(len(h), *(len(format(r[k], f)) for r in rows)) for k, h, f in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    for r in rows:
        print("  ".join(format(r[k], f).rjust(w) for (k, _, f), w in zip(columns, widths)))


def write_json(path: str | None, payload: dict) -> None:
    """Writes the payload with the command and the machine, as every benchmark result does."""
    if path:
        from ssd.bench.record import write_result

        write_result(path, payload)
