"""Bridge from a loaded checkpoint to the C++ core model."""
from __future__ import annotations

import ctypes
import ctypes.util

import torch


def build_core_model(config, weights: dict[str, torch.Tensor], device: str = "cpu", backend: str = "auto",
                     batch_invariant: bool = True, formats: dict[str, str] | None = None,
                     int8_activations: bool = True, tensor_parallel=None, cuda_graphs: bool = True,
                     draft_sm_share: float = 0.0):
    """Builds the C++ ``ssd._C.Model`` from a ModelConfig and HF-named weights,
    placed on ``device`` ("cpu", "cuda", "cuda:N") with ``backend`` ("auto" or
    "aten"; see ``LoadedModel.core_model``); ``formats`` names the weights
    held as GGUF blocks (``ssd.models.quantized``), multiplied with int8
    activations or (``int8_activations=False``) fp32 ones. ``tensor_parallel``:
    None, or ``(rank, size, all_gather, broadcast)`` to build that rank's shard
    (``ssd.distributed``). ``cuda_graphs``: the cuda backend replays a CUDA
    graph per padded forward shape (``EngineConfig.cuda_graphs``); ``draft_sm_share``:
    its draft role's kernels on that share of the SMs (``EngineConfig.draft_sm_share``).

    Raises ValueError naming a missing or mis-shaped tensor, or an unusable device.
    """
    from ssd import _C

    return _C.Model(config.to_dict(), weights, device=device, backend=backend, batch_invariant=batch_invariant,
                    formats=formats or {}, int8_activations=int8_activations,
                    tensor_parallel=tensor_parallel, cuda_graphs=cuda_graphs, draft_sm_share=draft_sm_share)


def sequence_logits(core_model, token_ids: list[int], block_size: int = 16, num_threads: int = 1) -> torch.Tensor:
    """Scores a whole sequence through the paged path: returns [len, vocab] fp32."""
    from ssd import _C

    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("token_ids: must contain at least one token")
    num_blocks = (len(ids) + block_size - 1) // block_size
    runner = _C.SequenceRunner(core_model, num_blocks, block_size, num_threads)
    seq = runner.add_sequence()
    return runner.extend([(seq, ids)], True)


def release_freed_memory() -> None:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim; a no-op elsewhere).

    Loading frees far more than it keeps (a GGUF reader's per-token metadata
    objects, fused matrices' parts), scattered between what stays; without
    this those pages stay resident.
    """
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
