"""Pure-torch references of paged and fork attention (oracles for the C++ and CUDA ops).

Both are dense softmax attention in float64 over explicitly gathered keys with an
explicit boolean mask; neither knows how the kernels order or split their work.
Cache layout: k_cache, v_cache [blocks, block_size, Hkv, D]; position p of
sequence s lives at block block_tables[s, p // block_size], slot p % block_size.
"""
from __future__ import annotations

import torch


def random_paged_cache(
    seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int, generator: torch.Generator,
    spare_blocks: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V for sequences of the given lengths, their blocks scattered over the cache.

    Returns k_cache, v_cache [blocks, block_size, Hkv, D] f32 and block_tables
    [S, max_blocks] i32 (unused entries -1). Slots past each sequence's end and
    the spare blocks hold NaN, so a kernel that reads them produces NaN.
    """
    per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    tables = torch.full((len(seq_lens), max(max(per_seq), 1)), -1, dtype=torch.int32)
    start = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = order[start : start + n]
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, float("nan")) for _ in range(2)]
    for s, n in enumerate(seq_lens):
        slots = tables[s, : per_seq[s]].long()
        for cache in caches:
            flat = cache[slots].reshape(-1, num_kv_heads, head_dim)
            flat[:n] = torch.randn(n, num_kv_heads, head_dim, generator=generator)
            cache[slots] = flat.view(-1, block_size, num_kv_heads, head_dim)
    return caches[0], caches[1], tables


def gather_positions(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """Positions 0..n-1 of one sequence: cache [blocks, bs, Hkv, D], table [max_blocks] -> [n, Hkv, D]."""
    block_size = cache.shape[1]
    blocks = table[: (n + block_size - 1) // block_size].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:n]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + M) v per head, M = 0 where mask else -inf; float64.

    q: [T, Hq, D]; k, v: [N, Hkv, D] (query head h uses kv head h // (Hq / Hkv));
    mask: [T, N] bool, True = attend. Returns [T, Hq, D].
    """
    group = q.shape[1] // k.shape[1]
    k = k.to(torch.float64).repeat_interleave(group, dim=1)
    v = v.to(torch.float64).repeat_interleave(group, dim=1)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    scores = torch.einsum("thd,nhd->htn", q.to(torch.float64), k) * scale + additive
    return torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v)


def paged_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_of_token: torch.Tensor, positions: torch.Tensor, scale: float, window: int = 0,
) -> torch.Tensor:
    """Causal attention per sequence: query t sees keys 0..positions[t] of sequence seq_of_token[t].

    With ``window`` > 0 (sliding-window attention) query t sees only keys j with
    positions[t] - window < j <= positions[t].
    q: [T, Hq, D]; seq_of_token, positions: [T]. Returns [T, Hq, D] float64.
    """
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in seq_of_token.unique().tolist():
        rows = (seq_of_token == s).nonzero().flatten()
        pos = positions[rows].long()
        n = int(pos.max()) + 1
        k = gather_positions(k_cache, block_tables[s], n)
        v = gather_positions(v_cache, block_tables[s], n)
        mask = torch.arange(n)[None, :] <= pos[:, None]
        if window > 0:
            mask &= torch.arange(n)[None, :] > pos[:, None] - window
        out[rows] = dense_attention(q[rows], k, v, mask, scale)
    return out


def fork_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_of_token: torch.Tensor, positions: torch.Tensor, prefix_seq: torch.Tensor, prefix_len: torch.Tensor,
    scale: float, window: int = 0,
) -> torch.Tensor:
    """Tree attention with an explicit mask over one key set shared by all rows.

    Keys: every forked-from sequence's prefix (as long as its longest fork needs),
    then every row's own keys from its fork to its position. Row t may see
    positions < prefix_len[t] of sequence prefix_seq[t] and positions
    prefix_len[t]..positions[t] of its own table seq_of_token[t], nothing else
    (with ``window`` > 0 only positions > positions[t] - window).
    q: [T, Hq, D]; the others [T]. Returns [T, Hq, D] float64.
    """
    keys, values, kind, owner, index = [], [], [], [], []  # kind 0: a sequence's prefix, 1: a row's own keys
    for s in prefix_seq.unique().tolist():
        n = int(prefix_len[prefix_seq == s].max())
        keys.append(gather_positions(k_cache, block_tables[s], n))
        values.append(gather_positions(v_cache, block_tables[s], n))
        kind += [0] * n
        owner += [s] * n
        index += range(n)
    for t in range(q.shape[0]):
        own = range(int(prefix_len[t]), int(positions[t]) + 1)
        table = block_tables[int(seq_of_token[t])]
        keys.append(gather_positions(k_cache, table, own.stop)[own.start:])
        values.append(gather_positions(v_cache, table, own.stop)[own.start:])
        kind += [1] * len(own)
        owner += [t] * len(own)
        index += own
    kind, owner, index = (torch.tensor(x, dtype=torch.long) for x in (kind, owner, index))
    rows = torch.arange(q.shape[0])[:, None]
    sees_prefix = (kind == 0) & (owner == prefix_seq.long()[:, None]) & (index < prefix_len.long()[:, None])
    mask = sees_prefix | ((kind == 1) & (owner == rows))
    if window > 0:
        mask &= index[None, :] > positions.long()[:, None] - window
    return dense_attention(q, torch.cat(keys), torch.cat(values), mask, scale)
