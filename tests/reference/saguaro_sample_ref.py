"""Pure-torch reference of SAGUARO sampling (the oracle for torch.ops.ssd.saguaro_sample).

sigma_{F,C}: from the processed distribution p, the F best-ranked tokens of p's
support get C * p_t, the rest keep p_t, and the row is renormalised. Ranking is
(z desc, token id asc) with z = logit / temperature in float32: the order of
the exact probabilities, so two tokens whose p rounds to the same float keep
their true order. When those F tokens are the whole support -- which covers
C = 0 with no mass left outside them -- sigma = p. The support is where the
float32 row is nonzero, as in the engine. Computed in float64.
"""
from __future__ import annotations

import torch

from tests.reference.sampling_ref import processed_probs


def ranked_ids(values: torch.Tensor) -> torch.Tensor:
    """Token ids sorted by (value desc, id asc). values: [vocab]."""
    return torch.sort(-values, stable=True).indices


def saguaro_probs(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    fanout: int = 0,
    downweight: float = 1.0,
) -> torch.Tensor:
    """logits: [vocab] -> sigma as float64 [vocab]."""
    p = processed_probs(logits, temperature, top_k, top_p)
    if temperature == 0 or fanout == 0 or downweight == 1.0:
        return p
    z = logits.to(torch.float32) / torch.tensor(temperature, dtype=torch.float32)
    support = ranked_ids(z)
    support = support[p.to(torch.float32)[support] > 0]
    if support.numel() <= fanout:
        return p
    sigma = p.clone()
    sigma[support[:fanout]] *= downweight
    return sigma / sigma.sum()


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token an inverse-CDF draw of u picks in token-id order. probs: [vocab]."""
    cum = torch.cumsum(probs.to(torch.float64), 0)
    idx = int(torch.searchsorted(cum, u * float(cum[-1]), right=True).item())
    return min(idx, probs.numel() - 1)
