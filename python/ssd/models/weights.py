"""The weights a ``ModelConfig`` needs, for loaders written in Python (GGUF).

Names, shapes and the name check are the C++ loader's
(``csrc/model/checkpoint.h``, reached through ``ssd._C``), so a GGUF file is
held to exactly the rule a HuggingFace checkpoint is. Shapes use PyTorch's
``nn.Linear`` layout, ``[out_features, in_features]``.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from .config import ModelConfig
from .errors import ModelLoadError


def check_config(config: ModelConfig, source: str) -> None:
    """Raise ModelLoadError when ``config`` describes no valid model."""
    from ssd import _C

    try:
        _C.validate_model_config(config.to_dict())
    except ValueError as exc:
        raise ModelLoadError(f"{source}: {exc}") from exc


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HuggingFace parameter name -> shape for every weight the model needs.

    ``lm_head.weight`` is absent when embeddings are tied; biases appear only
    when ``attention_bias`` (q, k, v, o), ``qkv_bias`` (q, k, v) or
    ``mlp_bias`` is set; ``q_norm`` / ``k_norm`` only when ``qk_norm`` is set.
    """
    from ssd import _C

    return {name: tuple(shape) for name, shape in _C.expected_weight_shapes(config.to_dict())}


def check_names(available: Iterable[str], config: ModelConfig, source: str) -> None:
    """Raise ModelLoadError for a missing or an unexpected tensor name.

    A tied checkpoint may still carry ``lm_head.weight``, and recomputed
    buffers (rotary ``inv_freq``) may be present; both are ignored.
    """
    from ssd import _C

    try:
        _C.check_weight_names(set(available), config.to_dict(), source)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def finish_tensor(
    name: str,
    tensor: torch.Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    source: str,
) -> torch.Tensor:
    """Check ``tensor`` has ``shape``; return it contiguous in ``dtype`` on ``device``."""
    if tuple(tensor.shape) != shape:
        raise ModelLoadError(
            f"{source}: tensor {name} has shape {list(tensor.shape)}, expected {list(shape)}"
        )
    if not tensor.is_floating_point():
        raise ModelLoadError(f"{source}: tensor {name} has non-float dtype {tensor.dtype}")
    return tensor.to(device=device, dtype=dtype).contiguous()
