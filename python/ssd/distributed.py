"""Tensor parallelism's collective over ``torch.distributed``.

A tensor-parallel model (``LoadedModel.core_model(tensor_parallel=(rank, size,
all_gather, broadcast))``; csrc/model/tensor_parallel.h for the split) needs
two collectives: every rank's partial sum [T, hidden] after o_proj and
down_proj, gathered in rank order (the model adds them in that order on every
rank), and, when rank 0 leads (``Model.lead`` / ``Model.follow``), each
forward's input sent from rank 0. ``tensor_parallel`` makes both from an
initialised process group (gloo on CPUs, NCCL on GPUs: the same calls).
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


def broadcast_fn(group=None) -> Callable[[torch.Tensor], None]:
    """``t -> None``: rank 0's ``t`` (of ``group``) copied into every other rank's, in place."""
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0) if group is not None else 0

    def broadcast(t: torch.Tensor) -> None:
        dist.broadcast(t, src=src, group=group)

    return broadcast


def tensor_parallel(group=None) -> tuple:
    """``(rank, size, all_gather, broadcast)`` of ``group`` for ``core_model(tensor_parallel=...)``."""
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group), all_gather_fn(group), broadcast_fn(group)
