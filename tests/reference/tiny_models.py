"""Random tiny HuggingFace checkpoints built with transformers (the parity oracle).

    spec = TinySpec(arch="qwen3", num_heads=4, num_kv_heads=2, tie_word_embeddings=True)
    model_dir, hf_model = build_tiny_model(spec, tmp_path / "qwen3")
    ssd_model = ssd.models.load(model_dir)

Weights are drawn from ``spec.seed`` with a larger std than transformers' default
(0.02): with the default, logits of a tiny random model are all close to 0 and a
wrong rope, norm or head mapping can hide inside a 1e-4 tolerance.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "mistral": "MistralForCausalLM"}


@dataclass(frozen=True)
class TinySpec:
    """A tiny decoder's hyper-parameters.

    head_dim None means hidden_size // num_heads. llama3_rope adds llama3 rope
    scaling with a small original context (``rope_original_max``), so the
    scaled and the smoothed frequency bands both occur at head_dim >= 8.
    attention_bias / mlp_bias are honoured where the architecture has them
    (Qwen3 has no mlp_bias; Qwen2 always has q, k, v biases and Mistral none,
    so neither takes them). sliding_window > 0 windows every layer's attention
    (Mistral; Qwen2 with use_sliding_window from layer 0).
    """

    arch: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    llama3_rope: bool = False
    rope_original_max: int = 32
    rope_factor: float = 8.0
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1024
    sliding_window: int = 0
    init_std: float = 0.15
    seed: int = 0

    def replace(self, **changes) -> "TinySpec":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """Short id for test parametrisation."""
        parts = [self.arch, f"h{self.hidden_size}", f"q{self.num_heads}kv{self.num_kv_heads}"]
        if self.head_dim is not None:
            parts.append(f"d{self.head_dim}")
        parts.append("tied" if self.tie_word_embeddings else "untied")
        if self.llama3_rope:
            parts.append("llama3rope")
        if self.attention_bias:
            parts.append("abias")
        if self.mlp_bias:
            parts.append("mbias")
        if self.sliding_window:
            parts.append(f"sw{self.sliding_window}")
        parts.append(f"L{self.num_layers}")
        return "-".join(parts)


def hf_config(spec: TinySpec):
    """The transformers config object (LlamaConfig, Qwen2Config, ...) for ``spec``."""
    import transformers

    if spec.arch not in ARCHITECTURES:
        raise ValueError(f"arch: expected one of {ARCHITECTURES}, got {spec.arch!r}")
    head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
    rope: dict = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.llama3_rope:
        rope = {"rope_type": "llama3", "rope_theta": spec.rope_theta, "factor": spec.rope_factor,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": spec.rope_original_max}
    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps, tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters=rope, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    window = spec.sliding_window or None
    if spec.arch in ("llama", "qwen3") and window:
        raise ValueError(f"sliding_window: not a {spec.arch} option here")
    if spec.arch in ("qwen2", "mistral") and (spec.attention_bias or spec.mlp_bias):
        raise ValueError(f"attention_bias, mlp_bias: {spec.arch}'s biases are fixed by the architecture")
    if spec.arch == "llama":
        return transformers.LlamaConfig(mlp_bias=spec.mlp_bias, attention_bias=spec.attention_bias, **common)
    if spec.arch == "qwen2":
        return transformers.Qwen2Config(use_sliding_window=window is not None, sliding_window=window,
                                        max_window_layers=0, **common)
    if spec.arch == "mistral":
        return transformers.MistralConfig(sliding_window=window, **common)
    if spec.mlp_bias:
        raise ValueError("mlp_bias: Qwen3 has no MLP bias")
    return transformers.Qwen3Config(use_sliding_window=False, attention_bias=spec.attention_bias, **common)


def random_hf_model(spec: TinySpec):
    """A transformers model in fp32 (eval mode) with seeded random weights.

    Linear weights, embeddings and biases ~ N(0, init_std); norm weights
    ~ 1 + N(0, init_std), so norms stay near their identity but per-channel
    mistakes still change the output.
    """
    import transformers

    config = hf_config(spec)
    config._attn_implementation = "eager"
    cls = getattr(transformers, _CLASSES[spec.arch])
    model = cls(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * spec.init_std
            param.copy_(1.0 + noise if "norm" in name else noise)
    return model


def build_tiny_model(spec: TinySpec, directory: str | Path):
    """Write a random checkpoint (config.json + model.safetensors) into ``directory``.

    Returns (directory, hf_model); hf_model is the fp32 model whose weights were saved.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = random_hf_model(spec)
    model.save_pretrained(directory)  # transformers 5 writes safetensors only
    if not (directory / "model.safetensors").is_file():
        raise RuntimeError(f"transformers wrote no model.safetensors into {directory}")
    return directory, model


def round_weights_to_bf16(model) -> None:
    """Rounds every parameter to bfloat16 in place, keeping fp32 storage."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).to(torch.float32))


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits for one sequence: [len] -> [len, vocab] fp32."""
    with torch.no_grad():
        ids = torch.tensor([token_ids], dtype=torch.long)
        return model(input_ids=ids).logits[0].to(torch.float32)


def random_tokens(n: int, vocab_size: int, seed: int) -> list[int]:
    """``n`` seeded random token ids in [0, vocab_size)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n,), generator=generator).tolist()


def edit_json(path, **changes) -> None:
    """Sets keys of a JSON file of a checkpoint (created when absent); a value of ``...`` deletes the key."""
    from pathlib import Path

    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
