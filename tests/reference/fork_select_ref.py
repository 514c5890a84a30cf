"""Pure-torch reference of fork selection (the oracle for torch.ops.ssd.fork_select).

Row (b, j) of the draft probabilities gets its top-F_j tokens ranked by
(probability desc, token id asc), best first, skipping the drafted token
x_{j+1} when j < K (a rejected token is never the bonus); -1 pads to
max_fanout.
"""
from __future__ import annotations

import torch


def fork_candidates(
    probs: torch.Tensor, drafted: torch.Tensor, fanout: torch.Tensor, max_fanout: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """probs: [B, K+1, V]; drafted: [B, K]; fanout: [K+1]
    -> candidates [B, K+1, max_fanout] (-1 padded), counts [B, K+1]."""
    b, positions, _ = probs.shape
    order = torch.sort(-probs, dim=-1, stable=True).indices
    candidates = torch.full((b, positions, max_fanout), -1, dtype=torch.int64)
    counts = torch.zeros((b, positions), dtype=torch.int64)
    for s in range(b):
        for j in range(positions):
            ids = order[s, j]
            if j < positions - 1:
                ids = ids[ids != drafted[s, j]]
            chosen = ids[: int(fanout[j])]
            candidates[s, j, : chosen.numel()] = chosen
            counts[s, j] = chosen.numel()
    return candidates, counts
