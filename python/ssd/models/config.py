"""Model configuration shared by every loader (HF directories, GGUF files).

The fields mirror ``ssd::ModelConfig`` in ``csrc/include/ssd/config.h``;
``to_dict`` / ``from_dict`` are the form that crosses into ``ssd._C`` and back,
and the C++ core validates the values when a model is built.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class RopeScaling:
    """``llama3`` rope scaling (the only kind supported besides none)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelConfig:
    architecture: str  # "LlamaForCausalLM" or "Qwen3ForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rope

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> ModelConfig:
        """The inverse of ``to_dict``: ``rope_scaling`` a dict or None."""
        scaling = fields.get("rope_scaling")
        return cls(**{**fields, "rope_scaling": None if scaling is None else RopeScaling(**scaling)})
