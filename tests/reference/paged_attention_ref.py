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
    branch_seq: torch.Tensor, prefix_len: torch.Tensor, path_k: torch.Tensor, path_v: torch.Tensor,
    path_len: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Tree attention with an explicit mask over one key set shared by all branches.

    Keys: every sequence's prefix (as long as its longest branch needs), then every
    branch's path. Branch n may see positions < prefix_len[n] of sequence
    branch_seq[n] and slots < path_len[n] of its own path, nothing else.
    q: [N, Hq, D]; path_k, path_v: [N, P, Hkv, D]. Returns [N, Hq, D] float64.
    """
    keys, values, owner_seq, owner_branch, index = [], [], [], [], []
    for s in branch_seq.unique().tolist():
        n = int(prefix_len[branch_seq == s].max())
        keys.append(gather_positions(k_cache, block_tables[s], n))
        values.append(gather_positions(v_cache, block_tables[s], n))
        owner_seq += [s] * n
        owner_branch += [-1] * n
        index += range(n)
    for b in range(q.shape[0]):
        n = int(path_len[b])
        keys.append(path_k[b, :n])
        values.append(path_v[b, :n])
        owner_seq += [-1] * n
        owner_branch += [b] * n
        index += range(n)
    owner_seq, owner_branch, index = (torch.tensor(x) for x in (owner_seq, owner_branch, index))
    sees_prefix = (owner_seq[None, :] == branch_seq[:, None].long()) & (index[None, :] < prefix_len[:, None])
    sees_path = (owner_branch[None, :] == torch.arange(q.shape[0])[:, None]) & (index[None, :] < path_len[:, None])
    return dense_attention(q, torch.cat(keys), torch.cat(values), sees_prefix | sees_path, scale)
