"""Pure-Python reference of the Gumbel-max coupling (the oracle for torch.ops.ssd.gumbel_sample
and gumbel_top).

Noise: splitmix64's finalizer mix64 keys one stream per (seed, position) and one
52-bit uniform per token of it,
    row_key = mix64(mix64(mix64(seed) ^ position) ^ 5)      (5: the Gumbel purpose)
    m_t = mix64(row_key ^ t) >> 12,  u_t = (m_t + 0.5) * 2^-52 in (0, 1),
    E_t = -log(u_t) ~ Exp(1),
all in 64-bit unsigned arithmetic (Python ints masked to 64 bits here). The
draw is argmax over the support (p_t > 0) of p_t / E_t -- the argmax of
log p_t + Gumbel noise, so a draw from p -- with ties to the lowest id; a row
without support gives token 0. Scores in float64 over the float32 row.
gumbel_top lists the `depth` best tokens of the support by that score
(descending, ties to the lowest id) with their scores.
"""
from __future__ import annotations

import math

import torch

MASK64 = (1 << 64) - 1
GUMBEL_PURPOSE = 5


def mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def row_key(seed: int, position: int) -> int:
    """seed: a uint64 (0 <= seed < 2^64); position >= 0."""
    return mix64(mix64(mix64(seed & MASK64) ^ position) ^ GUMBEL_PURPOSE)


def uniform(seed: int, position: int, token: int) -> float:
    """u_t in (0, 1); exact in float64 (52 bits plus one half)."""
    m = mix64(row_key(seed, position) ^ token) >> 12
    return (m + 0.5) * 2.0**-52


def exponential(seed: int, position: int, token: int) -> float:
    return -math.log(uniform(seed, position, token))


def gumbel_token(probs_row: torch.Tensor, seed: int, position: int) -> int:
    """probs_row: [vocab] float32 -> the token drawn at (seed, position). Full scan, no pruning."""
    key = row_key(seed, position)
    best, best_id = -1.0, 0
    for t, p in enumerate(probs_row.to(torch.float32).tolist()):
        if not p > 0.0:
            continue
        m = mix64(key ^ t) >> 12
        score = p / -math.log((m + 0.5) * 2.0**-52)
        if score > best:  # strict: ties keep the lowest id
            best, best_id = score, t
    return best_id


def gumbel_top_ref(probs_row: torch.Tensor, seed: int, position: int, depth: int) -> tuple[list[int], list[float]]:
    """probs_row: [vocab] float32 -> (ids, scores) of the min(depth, support) best tokens. Full scan."""
    key = row_key(seed, position)
    scored = [(p / -math.log(((mix64(key ^ t) >> 12) + 0.5) * 2.0**-52), t)
              for t, p in enumerate(probs_row.to(torch.float32).tolist()) if p > 0.0]
    best = sorted(scored, key=lambda x: (-x[0], x[1]))[:depth]
    return [t for _, t in best], [s for s, _ in best]
