"""Pure-torch reference of lossless speculative verification (the oracle for torch.ops.ssd.verify).

Per row b with n = num_proposals[b] proposals x_1..x_n:
  p_i = processed_probs(target_logits[b, i-1]) with the row's temperature/top-k/top-p;
  q_i = q_probs[b, i-1], or the point mass on x_i where one_hot[b];
  x_i is accepted iff accept_uniforms[b, i-1] * q_i(x_i) < p_i(x_i), stopping at the
  first rejection; the bonus is drawn by inverse CDF (token-id order) with
  bonus_uniforms[b] from norm(max(p_i - q_i, 0)) at the first rejection i, from p_i
  itself if that residual has no mass (only through rounding), or from p_{n+1}.
Temperature 0: x_i is accepted iff it is argmax p_i (ties: lowest id); the bonus is
the argmax of p at the first rejection or at n+1.

The op keeps processed distributions as float32 (as process_logits stores them), so
p is rounded to float32 here and the residual is formed in float32 as well; all
comparisons and sums are float64. The op's p still differs from this one by up to
~1e-6 relative (process_logits forms z - max in float32, processed_probs in float64),
so a decision can differ where a uniform lands that close to a boundary; seeded
tests compare outcomes exactly and stay clear of those slivers.
"""
from __future__ import annotations

import torch

from .sampling_ref import processed_probs


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """Token drawn by inverse CDF in id order. probs: [vocab] (any non-negative masses)."""
    cum = torch.cumsum(probs.to(torch.float64), 0)
    idx = int(torch.searchsorted(cum, u * float(cum[-1]), right=True).item())
    if idx < probs.numel():
        return idx
    return int(torch.nonzero(probs > 0).max().item()) if bool((probs > 0).any()) else 0


def _row_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    return processed_probs(logits, temperature, top_k, top_p).to(torch.float32)


def verify_row(
    target_logits: torch.Tensor,
    proposals: torch.Tensor,
    n: int,
    q_probs: torch.Tensor | None,
    temperature: float,
    top_k: int,
    top_p: float,
    accept_uniforms: torch.Tensor,
    bonus_uniform: float,
) -> tuple[int, int]:
    """One row. target_logits: [K+1, V]; proposals: [K]; q_probs: [K, V] or None (one-hot);
    accept_uniforms: [K]. Returns (accepted, bonus)."""
    for i in range(n):
        p = _row_probs(target_logits[i], temperature, top_k, top_p)
        x = int(proposals[i])
        if temperature == 0:
            if x != int(torch.argmax(p)):
                return i, int(torch.argmax(p))
            continue
        q = torch.zeros_like(p) if q_probs is None else q_probs[i].to(torch.float32)
        if q_probs is None:
            q[x] = 1.0
        if not float(accept_uniforms[i]) * float(q[x]) < float(p[x]):
            residual = torch.clamp(p - q, min=0.0)
            return i, inverse_cdf(residual if bool((residual > 0).any()) else p, bonus_uniform)
    p = _row_probs(target_logits[n], temperature, top_k, top_p)
    return n, int(torch.argmax(p)) if temperature == 0 else inverse_cdf(p, bonus_uniform)


def verify_ref(
    target_logits: torch.Tensor,
    proposals: torch.Tensor,
    num_proposals: torch.Tensor,
    q_probs: torch.Tensor,
    one_hot: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    accept_uniforms: torch.Tensor,
    bonus_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments as torch.ops.ssd.verify: target_logits [B, K+1, V] f32; proposals [B, K];
    num_proposals [B]; q_probs [B, K, V]; one_hot, temperature, top_k, top_p [B];
    accept_uniforms [B, K]; bonus_uniforms [B]. Returns accepted [B] i64, bonus [B] i64."""
    out = [
        verify_row(
            target_logits[b],
            proposals[b],
            int(num_proposals[b]),
            None if bool(one_hot[b]) else q_probs[b],
            float(temperature[b]),
            int(top_k[b]),
            float(top_p[b]),
            accept_uniforms[b],
            float(bonus_uniforms[b]),
        )
        for b in range(target_logits.shape[0])
    ]
    accepted = torch.tensor([a for a, _ in out], dtype=torch.int64)
    bonus = torch.tensor([t for _, t in out], dtype=torch.int64)
    return accepted, bonus
