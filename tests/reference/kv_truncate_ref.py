"""Pure-torch reference of kv_truncate (the oracle for the CPU and CUDA ops)."""
from __future__ import annotations

from collections import Counter

import torch


def kv_truncate_ref(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_refcount: torch.Tensor,
                    seq_ids: torch.Tensor, new_lens: torch.Tensor, block_size: int):
    """The state after the truncation, as new tensors (tables, lens, refcount).

    block_tables: [S, max_blocks] int32 (-1 = none); seq_lens: [S] int32;
    block_refcount: [blocks] int32; seq_ids, new_lens: [n] int64. Sequence
    seq_ids[i] gets length new_lens[i]; each of its table entries at index
    >= ceil(new_lens[i] / block_size) that is not -1 loses one reference and
    becomes -1. Raises ValueError, in the op's order of checks: a seq id outside
    [0, S) or repeated, a new length outside [0, current length], a released
    entry that is not a block id, a refcount that would fall below 0.
    """
    tables, lens, refcount = block_tables.clone(), seq_lens.clone(), block_refcount.clone()
    seqs, targets = seq_ids.tolist(), new_lens.tolist()
    seen: dict[int, int] = {}
    for i, (seq, new_len) in enumerate(zip(seqs, targets)):
        if not 0 <= seq < tables.shape[0]:
            raise ValueError(f"seq_ids[{i}] = {seq} is outside the block tables' rows [0, {tables.shape[0]})")
        if seq in seen:
            raise ValueError(f"seq_ids[{i}] = {seq} repeats seq_ids[{seen[seq]}]")
        seen[seq] = i
        if not 0 <= new_len <= int(lens[seq]):
            raise ValueError(f"new_lens[{i}] = {new_len} is outside [0, {int(lens[seq])}]")
    released = [(i, j) for i, (seq, new_len) in enumerate(zip(seqs, targets))
                for j in range(-(-new_len // block_size), tables.shape[1]) if int(tables[seq, j]) != -1]
    for i, j in released:
        block = int(tables[seqs[i], j])
        if not 0 <= block < refcount.numel():
            raise ValueError(f"the block table of seq_ids[{i}] holds block {block} "
                             f"outside [0, {refcount.numel()})")
    drops = Counter(int(tables[seqs[i], j]) for i, j in released)
    for i, j in released:
        block = int(tables[seqs[i], j])
        if int(refcount[block]) < drops[block]:
            raise ValueError(f"releasing the blocks of seq_ids[{i}] would drive the refcount "
                             f"of block {block} below 0")
    for block, count in drops.items():
        refcount[block] -= count
    for i, j in released:
        tables[seqs[i], j] = -1
    for seq, new_len in zip(seqs, targets):
        lens[seq] = new_len
    return tables, lens, refcount


def freed_blocks(refcount_before: torch.Tensor, refcount_after: torch.Tensor) -> list[int]:
    """Blocks a truncation freed (refcount went from > 0 to 0), ascending."""
    return torch.nonzero((refcount_before > 0) & (refcount_after == 0)).flatten().tolist()
