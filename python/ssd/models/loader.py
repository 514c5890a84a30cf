"""``load(path)``: one entry point for HF directories and GGUF files."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import ModelLoadError
from .hub_cache import resolve_model
from .loaded import LoadedModel
from .quantized import DTYPES, LOAD_FORMATS, quantize_matrices
from .tokenizer import Tokenizer

SUPPORTED_DTYPES = DTYPES

_DTYPE_NAMES = {torch.float32: "float32", "fp32": "float32", torch.bfloat16: "bfloat16", "bf16": "bfloat16"}


def load(path: str | os.PathLike, device: str | torch.device = "cpu",
         dtype: torch.dtype | str = "float32") -> LoadedModel:
    """Load a model from a HuggingFace directory or a GGUF file.

    Args:
        path: a directory with ``config.json`` + safetensors, or a ``.gguf`` file; or a
            model name (``org/name``) in the local HuggingFace cache (ssd.models.hub_cache).
        device: where the weights go (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        dtype: ``"float32"`` or ``"bfloat16"`` (or the torch dtypes): every
            weight, norms included, is converted to it; ``"q8_0"``, ``"q4_0"``,
            ``"q4_1"``, ``"q5_0"``, ``"q5_1"``: the matrices are quantized to that GGUF block format
            (norms stay float32); ``"auto"``: a GGUF file's matrices stay in
            their own block format where ssd has kernels for it (see
            ``ssd.models.quantized``), an HF checkpoint loads as float32.

    Returns: a ``LoadedModel``.

    Raises:
        ModelLoadError: for any problem with the path, its files or the arguments.
    """
    model_path = resolve_model(path)
    dtype = _check_dtype(dtype, model_path)
    device = _check_device(device, model_path)
    float_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    if model_path.is_dir():
        from .hf import load_hf_dir

        loaded = load_hf_dir(model_path, device, float_dtype)
    else:
        from .gguf_loader import is_gguf_file, load_gguf

        if not is_gguf_file(model_path):
            raise ModelLoadError(
                f"{model_path} is neither a model directory (with config.json) nor a GGUF file"
            )
        loaded = load_gguf(model_path, device, float_dtype, keep_blocks=dtype == "auto")
    if dtype in LOAD_FORMATS:
        loaded.formats = quantize_matrices(loaded.weights, dtype, str(model_path))
    return loaded


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer (and chat template) of a HuggingFace directory or GGUF file, without its weights.

    Raises:
        ModelLoadError: the path cannot be read, or the model has no tokenizer.
    """
    model_path = resolve_model(path)
    if model_path.is_dir():
        from .hf import load_tokenizer_files

        tokenizer = load_tokenizer_files(model_path)[0]
    else:
        from .gguf_loader import is_gguf_file, load_gguf_tokenizer

        if not is_gguf_file(model_path):
            raise ModelLoadError(f"{model_path} is neither a model directory nor a GGUF file")
        tokenizer = load_gguf_tokenizer(model_path)
    if tokenizer is None:
        raise ModelLoadError(f"model at {model_path} has no tokenizer")
    return tokenizer


def check_same_tokenizer(target: str | os.PathLike | LoadedModel, draft: str | os.PathLike | LoadedModel) -> None:
    """ValueError when the draft's tokenizer maps some token to another id than the target's.

    target / draft: paths (or names) or ``LoadedModel`` s. Only tokenizers are
    read, so a mismatched pair is refused before any weights load. A model
    without a tokenizer (or a path that cannot be read: loading it reports
    that) is not compared; the engine still compares vocabulary sizes.
    """
    found = []
    for model in (target, draft):
        if isinstance(model, LoadedModel):
            found.append(model.tokenizer)
            continue
        try:
            found.append(load_tokenizer(model))
        except ModelLoadError:
            found.append(None)
    if None in found:
        return
    difference = found[0].vocabulary_difference(found[1])
    if difference is not None:
        raise ValueError(f"draft: its tokenizer ({found[1].source}) differs from the target's "
                         f"({found[0].source}): {difference}; a draft must share the target's tokenizer")


def _check_dtype(dtype: torch.dtype | str, path: Path) -> str:
    """``dtype`` as the name of a supported load dtype (``quantized.DTYPES``)."""
    resolved = _DTYPE_NAMES.get(dtype, dtype)
    if resolved not in SUPPORTED_DTYPES:
        raise ModelLoadError(
            f"cannot load {path} as {dtype}: supported dtypes are {', '.join(SUPPORTED_DTYPES)} "
            "(or torch.float32, torch.bfloat16)"
        )
    return resolved


def _check_device(device: str | torch.device, path: Path) -> torch.device:
    """``device`` as a ``torch.device`` that exists on this machine."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"cannot load {path} onto device {device!r}: {exc}") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"cannot load {path} onto {resolved}: CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(f"cannot load {path} onto {resolved}: "
                                 f"only {torch.cuda.device_count()} CUDA device(s)")
    return resolved
