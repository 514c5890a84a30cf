"""Load a HuggingFace model directory (config.json + safetensors + tokenizer).

config.json, the safetensors weights (single file or sharded index) and the
eos / bos ids of generation_config.json and config.json are read by the one
HF checkpoint loader, in C++ (``csrc/model/checkpoint.h``, reached as
``ssd._C.load_checkpoint``); the C++ program ``ssd_generate`` uses the same
code. What needs the ``tokenizers`` library stays here: the tokenizer, its
special tokens and the chat template.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch

from .config import ModelConfig
from .errors import ModelLoadError
from .loaded import LoadedModel, end_of_sequence_ids
from .tokenizer import Tokenizer


def load_hf_dir(model_dir: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load the model in ``model_dir`` with weights in ``dtype`` on ``device``."""
    tokenizer, chat_template = load_tokenizer_files(model_dir)
    checkpoint = _load_checkpoint(model_dir, dtype)  # last: the slow part
    bos_id = checkpoint["bos_token_id"]
    if bos_id is None and tokenizer is not None:
        bos_id = tokenizer.bos_token_id
    return LoadedModel(
        config=ModelConfig.from_dict(checkpoint["config"]),
        weights={name: t.to(device) for name, t in checkpoint["weights"].items()},
        tokenizer=tokenizer,
        eos_token_ids=end_of_sequence_ids(checkpoint["eos_token_ids"], tokenizer),
        bos_token_id=bos_id,
        chat_template=chat_template,
        source=str(model_dir),
        name=model_dir.name,
    )


def _load_checkpoint(model_dir: Path, dtype: torch.dtype) -> dict[str, Any]:
    """``_C.load_checkpoint``'s result; its ValueError becomes ModelLoadError."""
    from ssd import _C

    try:
        return _C.load_checkpoint(str(model_dir), str(dtype).removeprefix("torch."))
    except ValueError as exc:
        raise ModelLoadError(f"{exc}{_gguf_hint(model_dir)}") from exc


def _gguf_hint(model_dir: Path) -> str:
    """For a directory without config.json but with a GGUF file: how to load that file."""
    if (model_dir / "config.json").is_file():
        return ""
    ggufs = sorted(p.name for p in model_dir.glob("*.gguf"))
    return f"; to load a GGUF file pass its path, e.g. {model_dir / ggufs[0]}" if ggufs else ""


# --------------------------------------------------------------- tokenizer


def load_tokenizer_files(model_dir: Path) -> tuple[Tokenizer | None, str | None]:
    """The tokenizer (None without tokenizer.json) and the chat template (None without one).

    Reads tokenizer.json, tokenizer_config.json, special_tokens_map.json and
    chat_template.{jinja,json}; ModelLoadError names the file that cannot be read.
    """
    tokenizer_config = _tokenizer_config(model_dir)
    chat_template = _chat_template(model_dir, tokenizer_config)
    return _load_tokenizer(model_dir, tokenizer_config, chat_template), chat_template


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """``special_tokens_map.json`` overlaid with ``tokenizer_config.json`` (both optional)."""
    merged = dict(_optional_json(model_dir / "special_tokens_map.json"))
    merged.update(_optional_json(model_dir / "tokenizer_config.json"))
    return merged


def _chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The chat template: ``chat_template.jinja``, ``chat_template.json`` or tokenizer_config."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read {jinja_file}: {exc}") from exc
    template = _optional_json(model_dir / "chat_template.json").get("chat_template")
    if template is None:
        template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template
                 if isinstance(t, dict) and isinstance(t.get("name"), str)}
        template = named.get("default", next(iter(named.values()), None))
    return template if isinstance(template, str) else None


def _load_tokenizer(model_dir: Path, tokenizer_config: dict[str, Any],
                    chat_template: str | None) -> Tokenizer | None:
    """The tokenizer from ``tokenizer.json`` (else a SentencePiece ``tokenizer.model``), or None."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        from .spm_tokenizer import hf_tokenizer

        return hf_tokenizer(model_dir, tokenizer_config, chat_template)
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


def _optional_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, ``{}`` when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    except RecursionError as exc:
        raise ModelLoadError(f"cannot read {path}: JSON nested too deeply") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data
