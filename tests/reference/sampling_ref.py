"""Pure-torch reference of the logits-processing law (the oracle for the C++ routine).

Order: temperature, then top-k, then top-p. Candidates rank by (value desc,
token id asc), so ties at a cut keep the lowest ids. Computed in float64.
"""
from __future__ import annotations

import torch


def _rank(z: torch.Tensor) -> torch.Tensor:
    """Token ids sorted by (z desc, id asc). z: [vocab]."""
    ids = torch.arange(z.numel())
    # A stable sort on -z keeps ascending ids among equal values.
    return ids[torch.sort(-z, stable=True).indices]


def processed_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits: [vocab] -> float64 probabilities [vocab]."""
    z = logits.to(torch.float64)
    vocab = z.numel()
    if temperature == 0:
        out = torch.zeros(vocab, dtype=torch.float64)
        out[_rank(z)[0]] = 1.0
        return out
    z = logits.to(torch.float32) / torch.tensor(temperature, dtype=torch.float32)
    z = z.to(torch.float64)
    order = _rank(z)
    keep = order if not 0 < top_k < vocab else order[:top_k]
    if top_p < 1.0:
        e = torch.exp(z[keep] - z[keep].max())
        cum = torch.cumsum(e, 0)
        n = int(torch.searchsorted(cum, top_p * e.sum()).item()) + 1
        keep = keep[: min(n, keep.numel())]
    out = torch.zeros(vocab, dtype=torch.float64)
    e = torch.exp(z[keep] - z[keep].max())
    out[keep] = e / e.sum()
    return out
