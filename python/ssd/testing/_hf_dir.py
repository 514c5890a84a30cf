"""Write a Llama model as an ordinary HuggingFace directory, streaming the weights.

``model.safetensors`` is written tensor by tensor (header first, offsets known
from the shapes), so a target several times the base model's size never sits
in memory at once.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ssd.models import LoadedModel, ModelConfig

_ALIGN = 8


def write_safetensors(path: Path, tensors: Iterable[tuple[str, Callable[[], torch.Tensor], tuple[int, ...]]],
                      progress: Callable[[int], None] | None = None) -> int:
    """Writes fp32 tensors ``(name, make, shape)`` to ``path``; returns bytes written.

    ``make()`` is called once per tensor, in order, right before its bytes are
    written. ``progress(n)`` is called after each tensor.
    """
    entries = list(tensors)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, _, shape in entries:
        nbytes = 4 * _numel(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, make, shape in entries:
            tensor = make().detach().to(torch.float32).contiguous()
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{name}: made shape {tuple(tensor.shape)}, planned {shape}")
            f.write(tensor.view(torch.uint8).numpy().tobytes())
            if progress is not None:
                progress(1)
    return 8 + len(raw) + offset


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def hf_config(config: ModelConfig, num_layers: int, bos_id: int | None, eos_ids: list[int]) -> dict:
    """config.json for ``LlamaForCausalLM`` with ``num_layers`` decoder layers."""
    if config.architecture != "LlamaForCausalLM":
        raise ValueError(f"only LlamaForCausalLM can be written, got {config.architecture}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "torch_dtype": "float32",
    }


def write_hf_dir(out: Path, model: LoadedModel, num_layers: int,
                 tensors: Iterable[tuple[str, Callable[[], torch.Tensor], tuple[int, ...]]],
                 progress: Callable[[int], None] | None = None) -> None:
    """A HF directory: config, generation config, tokenizer files and the weights."""
    tok = model.require_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    eos_ids = list(model.eos_token_ids)
    _write_json(out / "config.json", hf_config(model.config, num_layers, model.bos_token_id, eos_ids))
    _write_json(out / "generation_config.json", {
        "bos_token_id": model.bos_token_id,
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
    })
    tok.backend.save(str(out / "tokenizer.json"))
    turn_end = tok.chat_turn_end_token()
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": tok.bos_token,
        "eos_token": turn_end or tok.eos_token,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model.config.max_position_embeddings,
        "chat_template": model.chat_template,
    })
    write_safetensors(out / "model.safetensors", tensors, progress)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
