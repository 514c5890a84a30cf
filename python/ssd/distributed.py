"""Tensor parallelism's collective over ``torch.distributed``.

A tensor-parallel model (``LoadedModel.core_model(tensor_parallel=(rank, size,
all_gather))``; csrc/model/tensor_parallel.h for the split) needs one
collective: every rank's partial sum [T, hidden] after o_proj and down_proj,
gathered in rank order, which the model adds in that order on every rank.
``all_gather_fn`` makes it from an initialised process group (gloo on CPUs,
NCCL on GPUs: the same call).
"""
from __future__ import annotations

from collections.abc import Callable

import torch


def all_gather_fn(group=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``part -> [size, *part.shape]``: every rank's part of ``group`` (default:
    the whole world of ``torch.distributed``, which must be initialised), stacked
    in rank order."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
    size = dist.get_world_size(group)

    def all_gather(part: torch.Tensor) -> torch.Tensor:
        part = part.contiguous()
        out = torch.empty((size, *part.shape), dtype=part.dtype, device=part.device)
        dist.all_gather(list(out.unbind(0)), part, group=group)
        return out

    return all_gather


def tensor_parallel(group=None) -> tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]:
    """``(rank, size, all_gather)`` of ``group`` for ``core_model(tensor_parallel=...)``."""
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group), all_gather_fn(group)
