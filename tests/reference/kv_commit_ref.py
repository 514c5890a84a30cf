"""Pure-torch reference of kv_commit (the oracle for the CPU and CUDA ops), and
the paged-cache layout both KV ops work on.

A paged KV storage is [layers, 2, num_blocks, block_size, kv_heads, head_dim]
(index 0 of dim 1 is K, 1 is V); a slot is block * block_size + offset, so the
storage viewed as [layers, 2, num_blocks * block_size, kv_heads, head_dim] is
what kv_commit's ``cache`` argument expects.
"""
from __future__ import annotations

import torch


def slot_view(storage: torch.Tensor) -> torch.Tensor:
    """[L, 2, blocks, block_size, Hkv, D] -> [L, 2, blocks * block_size, Hkv, D] (a view)."""
    layers, kinds, blocks, block_size, heads, dim = storage.shape
    return storage.view(layers, kinds, blocks * block_size, heads, dim)


def sequence_slots(blocks: list[int], positions: range | list[int], block_size: int) -> list[int]:
    """Cache slots of ``positions`` in a sequence whose block table is ``blocks``."""
    return [blocks[p // block_size] * block_size + p % block_size for p in positions]


def sequence_kv(storage: torch.Tensor, blocks: list[int], length: int) -> torch.Tensor:
    """K/V rows of positions 0..length-1: storage [L, 2, blocks, bs, Hkv, D] -> [L, 2, length, Hkv, D]."""
    slots = sequence_slots(blocks, range(length), storage.shape[3])
    return slot_view(storage)[:, :, slots].clone()


def kv_commit_ref(cache: torch.Tensor, tree: torch.Tensor, src_slots: torch.Tensor,
                  dst_slots: torch.Tensor) -> torch.Tensor:
    """The cache after the commit, as a new tensor; the inputs are left alone.

    cache: [L, 2, slots, Hkv, D]; tree: [L, 2, tree_slots, Hkv, D];
    src_slots, dst_slots: [n] int64. out[:, :, dst[i]] = tree[:, :, src[i]], all
    rows read before any is written. Raises ValueError on an index outside its
    tensor's slots or a dst slot used twice (the first bad i is named).
    """
    src, dst = src_slots.tolist(), dst_slots.tolist()
    seen: dict[int, int] = {}
    for i, (s, d) in enumerate(zip(src, dst)):
        if not 0 <= s < tree.shape[2]:
            raise ValueError(f"src_slots[{i}] = {s} is outside the tree's slots [0, {tree.shape[2]})")
        if not 0 <= d < cache.shape[2]:
            raise ValueError(f"dst_slots[{i}] = {d} is outside the cache's slots [0, {cache.shape[2]})")
        if d in seen:
            raise ValueError(f"dst_slots[{i}] = {d} repeats dst_slots[{seen[d]}]")
        seen[d] = i
    rows = tree[:, :, src].clone()
    out = cache.clone()
    out[:, :, dst] = rows
    return out
