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
    """A decoder's shape and numerics.

    ``architecture`` is one of ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
    ``Qwen3ForCausalLM`` and ``MistralForCausalLM``; they share one forward
    and differ only in the flags below.
    """

    architecture: str
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
    # Divisors of the rotary inverse frequencies, [head_dim / 2]: a GGUF file's
    # rope_freqs tensor (llama3 scaling as llama.cpp stores it). Excludes rope_scaling.
    rope_freq_factors: list[float] | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    attention_bias: bool = False  # biases on q, k, v and o (Llama's attention_bias)
    qkv_bias: bool = False  # biases on q, k and v only (Qwen2); excludes attention_bias
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rope
    # > 0: the query at position i attends keys i - sliding_window < j <= i (Mistral)
    sliding_window: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> ModelConfig:
        """The inverse of ``to_dict``: ``rope_scaling`` a dict or None."""
        scaling = fields.get("rope_scaling")
        return cls(**{**fields, "rope_scaling": None if scaling is None else RopeScaling(**scaling)})
