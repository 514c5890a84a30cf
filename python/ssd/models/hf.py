"""Load a HuggingFace model directory (config.json + safetensors + tokenizer).

Supported: ``LlamaForCausalLM`` and ``Qwen3ForCausalLM``, weights in
``model.safetensors`` or sharded via ``model.safetensors.index.json``.
Both config layouts are read: the older ``rope_theta`` / ``rope_scaling`` keys
and transformers 5's ``rope_parameters``.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors import safe_open

from .config import SUPPORTED_ARCHITECTURES, ModelConfig, RopeScaling
from .errors import ModelLoadError
from .loaded import LoadedModel, end_of_sequence_ids
from .tokenizer import Tokenizer
from .weights import check_config, check_names, expected_shapes, finish_tensor

# config.json "model_type" -> architecture, for configs without "architectures".
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# transformers' defaults for keys a config.json may omit, per architecture.
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen3ForCausalLM": 32768}

_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load_hf_dir(model_dir: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load the model in ``model_dir`` with weights in ``dtype`` on ``device``."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        ggufs = sorted(p.name for p in model_dir.glob("*.gguf"))
        hint = f"; to load a GGUF file pass its path, e.g. {model_dir / ggufs[0]}" if ggufs else ""
        raise ModelLoadError(f"{model_dir} has no config.json (not a HuggingFace model directory){hint}")
    raw_config = read_json(config_path)
    config = parse_config(raw_config, str(config_path))
    generation = _optional_json(model_dir / "generation_config.json")
    tokenizer_config = _tokenizer_config(model_dir)
    chat_template = _chat_template(model_dir, tokenizer_config)
    tokenizer = _load_tokenizer(model_dir, tokenizer_config, chat_template)
    weights = read_weights(model_dir, config, dtype, device)  # last: the slow part
    eos_ids = end_of_sequence_ids(
        generation.get("eos_token_id"),
        raw_config.get("eos_token_id"),
        tokenizer.eos_token_id if tokenizer else None,
        tokenizer=tokenizer,
    )
    bos_candidates = [generation.get("bos_token_id"), raw_config.get("bos_token_id"),
                      tokenizer.bos_token_id if tokenizer else None]
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        eos_token_ids=eos_ids,
        bos_token_id=next((b for b in bos_candidates if isinstance(b, int)), None),
        chat_template=chat_template,
        source=str(model_dir),
        name=model_dir.name,
    )


# ------------------------------------------------------------------ config


def parse_config(cfg: dict[str, Any], source: str) -> ModelConfig:
    """``ModelConfig`` from a config.json dict; ``source`` names the file in errors."""
    arch = _architecture(cfg, source)
    hidden = _positive_int(cfg, "hidden_size", source)
    heads = _positive_int(cfg, "num_attention_heads", source)
    kv_heads = _positive_int(cfg, "num_key_value_heads", source, default=heads)
    _check_supported_features(cfg, arch, source)
    rope_theta, rope_scaling = _rope(cfg, source)
    config = ModelConfig(
        architecture=arch,
        vocab_size=_positive_int(cfg, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=_positive_int(cfg, "intermediate_size", source),
        num_layers=_positive_int(cfg, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(cfg, hidden, heads, source),
        rms_norm_eps=_positive_float(cfg, "rms_norm_eps", 1e-6, source),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=_positive_int(
            cfg, "max_position_embeddings", source, default=_DEFAULT_MAX_POSITIONS[arch]),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)) if arch == "LlamaForCausalLM" else False,
        qk_norm=arch == "Qwen3ForCausalLM",
    )
    check_config(config, source)
    return config


def _architecture(cfg: dict[str, Any], source: str) -> str:
    """The supported architecture named by ``architectures`` (or ``model_type``)."""
    names = cfg.get("architectures")
    if names is None:
        model_type = cfg.get("model_type")
        if model_type in _MODEL_TYPES:
            return _MODEL_TYPES[model_type]
        raise ModelLoadError(
            f"{source} names no architecture (no 'architectures', model_type={model_type!r}); "
            f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names:
        raise ModelLoadError(f"{source}: 'architectures' must be a non-empty list, got {names!r}")
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    raise ModelLoadError(
        f"{source}: unsupported architecture {names[0]!r}; "
        f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _positive_int(cfg: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    """``cfg[key]`` as a positive int (``default`` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ModelLoadError(f"{source} has no {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    return value


def _positive_float(cfg: dict[str, Any], key: str, default: float, source: str) -> float:
    """``cfg[key]`` as a positive float (``default`` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ModelLoadError(f"{source}: {key!r} must be a positive number, got {value!r}")
    return float(value)


def _head_dim(cfg: dict[str, Any], hidden: int, heads: int, source: str) -> int:
    """Explicit ``head_dim`` when given, else ``hidden_size / num_attention_heads``."""
    if cfg.get("head_dim") is not None:
        return _positive_int(cfg, "head_dim", source)
    if hidden % heads:
        raise ModelLoadError(
            f"{source}: hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) "
            "and no head_dim is given"
        )
    return hidden // heads


def _check_supported_features(cfg: dict[str, Any], arch: str, source: str) -> None:
    """Reject config features the engine does not implement."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"{source}: unsupported hidden_act {act!r} (only 'silu')")
    if cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{source}: sliding-window attention is not supported")
    layer_types = cfg.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ModelLoadError(f"{source}: unsupported layer types {other} (only 'full_attention')")


def _rope(cfg: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` from ``rope_parameters`` or the legacy keys."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):  # the newer layout wins
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ModelLoadError(f"{source}: {key!r} must be an object, got {value!r}")
        if value and not ({"rope_type", "type", "rope_theta"} & value.keys()):
            raise ModelLoadError(f"{source}: per-layer-type {key!r} is not supported")
        params.update(value)
    theta = _positive_float({**cfg, **params}, "rope_theta", 10000.0, source)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ModelLoadError(
            f"{source}: unsupported rope type {rope_type!r} (supported: 'default', 'llama3')"
        )
    missing = [k for k in _LLAMA3_ROPE_KEYS if params.get(k) is None]
    if missing:
        raise ModelLoadError(f"{source}: llama3 rope scaling lacks {missing[0]!r}")
    scaling = RopeScaling(
        factor=_positive_float(params, "factor", 0.0, source),
        low_freq_factor=_positive_float(params, "low_freq_factor", 0.0, source),
        high_freq_factor=_positive_float(params, "high_freq_factor", 0.0, source),
        original_max_position_embeddings=_positive_int(params, "original_max_position_embeddings",
                                                       source),
    )
    return theta, scaling


# ----------------------------------------------------------------- weights


def read_weights(model_dir: Path, config: ModelConfig, dtype: torch.dtype,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Every weight ``config`` needs, from the directory's safetensors file(s)."""
    file_of = tensor_files(model_dir)
    check_names(file_of, config, str(model_dir))
    shapes = expected_shapes(config)
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in shapes:
        by_file[file_of[name]].append(name)
    weights: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        for name, tensor in _read_safetensors(path, names):
            weights[name] = finish_tensor(name, tensor, shapes[name], dtype, device, str(path))
    return {name: weights[name] for name in shapes}  # canonical order


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it (single file or sharded index)."""
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return {name: single for name in _safetensors_keys(single)}
    index = model_dir / INDEX_FILE
    if index.is_file():
        return _index_files(index)
    hint = ""
    if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
        hint = " (only safetensors weights are supported, not PyTorch .bin/.pt files)"
    raise ModelLoadError(f"{model_dir} has no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def _index_files(index: Path) -> dict[str, Path]:
    """Tensor name -> shard file from a ``model.safetensors.index.json``."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index} has no 'weight_map' object")
    if not all(isinstance(shard, str) for shard in weight_map.values()):
        raise ModelLoadError(f"{index}: 'weight_map' values must be file names")
    shards = {shard: index.parent / shard for shard in set(weight_map.values())}
    for shard, path in sorted(shards.items()):
        if not path.is_file():
            raise ModelLoadError(f"{index} lists shard {shard!r}, but {path} does not exist")
    return {name: shards[shard] for name, shard in weight_map.items()}


def _safetensors_keys(path: Path) -> list[str]:
    """Tensor names stored in one safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises its own error types
        raise ModelLoadError(f"cannot read safetensors file {path}: {exc}") from exc


def _read_safetensors(path: Path, names: list[str]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for ``names`` from one safetensors file, on CPU."""
    try:
        with safe_open(str(path), framework="pt") as f:
            present = set(f.keys())
            absent = [n for n in names if n not in present]
            if absent:
                raise ModelLoadError(f"{path}: missing tensor {absent[0]}")
            return [(name, f.get_tensor(name)) for name in names]
    except ModelLoadError:
        raise
    except Exception as exc:  # corrupt or truncated file
        raise ModelLoadError(f"cannot read safetensors file {path}: {exc}") from exc


# --------------------------------------------------------------- tokenizer


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """``special_tokens_map.json`` overlaid with ``tokenizer_config.json`` (both optional)."""
    merged = dict(_optional_json(model_dir / "special_tokens_map.json"))
    merged.update(_optional_json(model_dir / "tokenizer_config.json"))
    return merged


def _chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The chat template: ``chat_template.jinja``, ``chat_template.json`` or tokenizer_config."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _optional_json(model_dir / "chat_template.json").get("chat_template")
    if template is None:
        template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    return template if isinstance(template, str) else None


def _load_tokenizer(model_dir: Path, tokenizer_config: dict[str, Any],
                    chat_template: str | None) -> Tokenizer | None:
    """The tokenizer from ``tokenizer.json``, or None when the directory has none."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read tokenizer file {path}: {exc}") from exc
    return Tokenizer(
        backend,
        bos_token=_token_text(tokenizer_config.get("bos_token")),
        eos_token=_token_text(tokenizer_config.get("eos_token")),
        chat_template=chat_template,
        source=str(model_dir),
    )


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# -------------------------------------------------------------------- json


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ModelLoadError when unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data


def _optional_json(path: Path) -> dict[str, Any]:
    """``read_json(path)``, or ``{}`` when the file does not exist."""
    return read_json(path) if path.is_file() else {}
