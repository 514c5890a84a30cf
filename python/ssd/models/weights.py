"""The weights a ``ModelConfig`` needs: HuggingFace names, shapes, checks.

Shapes use PyTorch's ``nn.Linear`` layout, ``[out_features, in_features]``.
Notation: ``H`` hidden size, ``I`` intermediate size, ``V`` vocab size,
``Nq`` / ``Nkv`` query / key-value heads, ``D`` head dim.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from .config import ModelConfig
from .errors import ModelLoadError

# Tensors some checkpoints carry that the model recomputes; never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def check_config(config: ModelConfig, source: str) -> None:
    """Raise ModelLoadError when ``config`` describes no valid model."""
    positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                "num_heads", "num_kv_heads", "head_dim")
    for name in positive:
        value = getattr(config, name)
        if not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{source}: {name} must be a positive integer, got {value!r}")
    if config.num_heads % config.num_kv_heads:
        raise ModelLoadError(
            f"{source}: num_heads ({config.num_heads}) is not a multiple of "
            f"num_kv_heads ({config.num_kv_heads})"
        )
    if config.head_dim % 2:
        raise ModelLoadError(f"{source}: head_dim must be even for rotary embeddings, got {config.head_dim}")


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HuggingFace parameter name -> shape for every weight the model needs.

    ``lm_head.weight`` ``[V, H]`` is absent when embeddings are tied; biases
    appear only when ``attention_bias`` / ``mlp_bias`` is set; ``q_norm`` /
    ``k_norm`` ``[D]`` only when ``qk_norm`` is set.
    """
    h = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        shapes.update(_layer_shapes(config, f"model.layers.{i}."))
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def _layer_shapes(config: ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """Shapes of one decoder layer's weights, names starting with ``prefix``."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q_out, kv_out = config.num_heads * d, config.num_kv_heads * d
    attn = prefix + "self_attn."
    mlp = prefix + "mlp."
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "input_layernorm.weight": (h,),
        attn + "q_proj.weight": (q_out, h),
        attn + "k_proj.weight": (kv_out, h),
        attn + "v_proj.weight": (kv_out, h),
        attn + "o_proj.weight": (h, q_out),
        prefix + "post_attention_layernorm.weight": (h,),
        mlp + "gate_proj.weight": (i, h),
        mlp + "up_proj.weight": (i, h),
        mlp + "down_proj.weight": (h, i),
    }
    if config.attention_bias:
        shapes.update({attn + "q_proj.bias": (q_out,), attn + "k_proj.bias": (kv_out,),
                       attn + "v_proj.bias": (kv_out,), attn + "o_proj.bias": (h,)})
    if config.mlp_bias:
        shapes.update({mlp + "gate_proj.bias": (i,), mlp + "up_proj.bias": (i,),
                       mlp + "down_proj.bias": (h,)})
    if config.qk_norm:
        shapes.update({attn + "q_norm.weight": (d,), attn + "k_norm.weight": (d,)})
    return shapes


def check_names(available: Iterable[str], config: ModelConfig, source: str) -> None:
    """Raise ModelLoadError for a missing or an unexpected tensor name.

    A tied checkpoint may still carry ``lm_head.weight``; it is ignored, as
    are buffers listed in ``_IGNORED_SUFFIXES``.
    """
    available = set(available)
    expected = expected_shapes(config)
    missing = [name for name in expected if name not in available]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{source}: missing tensor {missing[0]}{more}")
    unexpected = sorted(n for n in available if n not in expected and not _ignorable(n, config))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(
            f"{source}: unexpected tensor {unexpected[0]}{more} for a "
            f"{config.architecture} with this config"
        )


def _ignorable(name: str, config: ModelConfig) -> bool:
    """Whether an extra tensor in a checkpoint may be skipped silently."""
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return True
    return name.endswith(_IGNORED_SUFFIXES)


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
