"""Load a GGUF file (llama.cpp's format): config, weights, tokenizer.

Supported: ``general.architecture`` ``llama`` (Llama and Mistral files),
``qwen2`` and ``qwen3``, any tensor type ``gguf.quants.dequantize`` handles,
and the tokenizers of ``gguf_tokenizer.py`` (byte-level BPE and SentencePiece).
Weights are dequantised, or with ``keep_blocks`` the matrices in a format ssd
multiplies natively (``quantized.py``) stay in their blocks: zero-copy views
of the file's (copy-on-write) memory map.

Two llama.cpp conventions are undone so that the weights equal a HuggingFace
checkpoint's:

* names: ``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.q_proj.weight``, ...
* rows of Q and K (``llama`` only): llama.cpp's converter interleaves the two
  rotary halves of every head (``permute`` in ``convert_hf_to_gguf.py``);
  ``unpermute_rope_rows`` puts them back.

What the file holds outside the weights' names becomes config: biases on
q, k, v without one on the output (Qwen2) set ``qkv_bias``; a ``rope_freqs``
tensor (llama3 rope scaling, stored as per-dimension frequency divisors)
becomes ``rope_freq_factors``; ``<arch>.attention.sliding_window`` becomes
``sliding_window``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from .config import ModelConfig
from .errors import ModelLoadError
from .loaded import LoadedModel, end_of_sequence_ids
from . import quantized
from .gguf_tokenizer import short_repr, build_tokenizer
from .tokenizer import Tokenizer
from .weights import check_config, check_names, expected_shapes, finish_tensor

GGUF_MAGIC = b"GGUF"

# general.architecture -> ModelConfig.architecture (Mistral files say "llama")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# Tensors read into the config rather than the weights.
ROPE_FREQS = "rope_freqs.weight"

# Names outside the decoder blocks.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Per-block names: blk.N.<key>.{weight,bias} -> model.layers.N.<value>.{weight,bias}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file starting with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype, keep_blocks: bool = False) -> LoadedModel:
    """Load the GGUF file at ``path`` with weights in ``dtype`` on ``device``.

    keep_blocks: matrices stored in a format of ``quantized.FORMATS`` stay in
    their GGUF rows (``LoadedModel.formats`` names them), F16 and BF16
    matrices stay float16 / bfloat16 tensors; every other tensor is
    dequantised to ``dtype``, with one warning naming the types that were not
    plain float32.
    """
    reader = _open_reader(path)
    meta = _Metadata(reader, str(path))
    tensors = {t.name: t for t in reader.tensors}
    config = gguf_config(meta, tensors)
    tokenizer = build_tokenizer(meta)
    weights, formats = _read_weights(tensors, config, meta.architecture, dtype, device, str(path), keep_blocks)
    eos_ids = end_of_sequence_ids(
        [meta.token_id(f"tokenizer.ggml.{kind}_token_id") for kind in ("eos", "eot", "eom")], tokenizer)
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        eos_token_ids=eos_ids,
        bos_token_id=meta.token_id("tokenizer.ggml.bos_token_id"),
        chat_template=meta.get("tokenizer.chat_template", kind=str),
        source=str(path),
        name=path.stem,
        formats=formats,
    )


def load_gguf_tokenizer(path: Path) -> Tokenizer | None:
    """The tokenizer of the GGUF file at ``path`` (its metadata only; no weights are read)."""
    return build_tokenizer(_Metadata(_open_reader(path), str(path)))


class _Truncated(ValueError):
    """A read past the end of the file: ``needed`` bytes wanted, ``size`` there."""

    def __init__(self, needed: int, size: int) -> None:
        super().__init__(f"needs {needed} bytes, has {size}")
        self.needed, self.size = needed, size


class _CheckedReader(gguf.GGUFReader):
    """``GGUFReader`` whose every read is bounds-checked.

    The stock reader slices its memory map without checking the end, so a
    truncated file fails later with numpy's shape errors -- or not at all: an
    array whose count runs past the end reads empty items forever.
    """

    def _get(self, offset, dtype, count=1, *args, **kwargs):
        needed = int(offset) + np.dtype(dtype).itemsize * int(count)
        if needed > len(self.data):
            raise _Truncated(needed, len(self.data))
        return super()._get(offset, dtype, count, *args, **kwargs)


def _open_reader(path: Path) -> gguf.GGUFReader:
    """A GGUF reader for ``path``; ModelLoadError naming the problem when the file is unreadable."""
    try:  # copy-on-write: the blocks kept as tensors are writable views, never written back
        return _CheckedReader(path, "c")
    except _Truncated as exc:
        raise ModelLoadError(
            f"cannot read GGUF file {path}: the file is truncated or corrupt: its contents need at "
            f"least {exc.needed} bytes, but it has {exc.size}") from exc
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    except Exception as exc:  # bad magic or version, unknown value or tensor types, bad UTF-8, ...
        raise ModelLoadError(f"cannot read GGUF file {path}: corrupt or unsupported GGUF file "
                             f"({type(exc).__name__}: {exc})") from exc


class _Metadata:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: gguf.GGUFReader, source: str) -> None:
        self.fields = reader.fields
        self.source = source
        self.architecture = self.require("general.architecture", kind=str)
        if self.architecture not in ARCHITECTURES:
            raise ModelLoadError(
                f"{source}: unsupported GGUF architecture {self.architecture!r}; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )

    def get(self, key: str, default: Any = None, kind: type | None = None, item: type | None = None) -> Any:
        """The value of ``key``, or ``default`` when absent.

        ``kind`` (``int``, ``float``, ``bool``, ``str`` or ``list``) is the type
        the value must have (an int passes as a float, a bool as nothing but a
        bool); ``item`` the type of every element of a list. ModelLoadError
        names the key when the file holds something else.
        """
        field = self.fields.get(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except Exception as exc:
            raise ModelLoadError(f"{self.source}: cannot read metadata {key!r}: {exc}") from exc
        if kind is not None and not _has_type(value, kind, item):
            wanted = _TYPE_NAMES[kind] + (f" of {_TYPE_NAMES[item].split()[1]}s" if item else "")
            raise ModelLoadError(f"{self.source}: metadata {key!r} must be {wanted}, "
                                 f"got {short_repr(value)}")
        return value

    def require(self, key: str, kind: type | None = None, item: type | None = None) -> Any:
        """The value of ``key`` (see ``get``); ModelLoadError when absent."""
        value = self.get(key, kind=kind, item=item)
        if value is None:
            raise ModelLoadError(f"{self.source}: missing metadata {key!r}")
        return value

    def token_id(self, key: str) -> int | None:
        """A token id (an int32 >= 0, as the engine holds ids), or None when absent."""
        value = self.get(key, kind=int)
        if value is not None and not 0 <= value < 2**31:
            raise ModelLoadError(f"{self.source}: metadata {key!r} must be a token id, got {value}")
        return value

    def arch_int(self, key: str, default: int | None = None) -> int:
        """Positive int ``<architecture>.<key>``."""
        full = f"{self.architecture}.{key}"
        value = self.get(full, default)
        if value is None:
            raise ModelLoadError(f"{self.source}: missing metadata {full!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{self.source}: metadata {full!r} must be a positive integer, "
                                 f"got {short_repr(value)}")
        return value

    def arch_float(self, key: str, default: float) -> float:
        """``<architecture>.<key>`` as the shortest decimal of its float32 value.

        GGUF stores these as float32; ``1e-5`` reads back as
        ``9.99999974e-06``. Rounding recovers the value the config was written with.
        """
        value = self.get(f"{self.architecture}.{key}", kind=float)
        return default if value is None else float(str(np.float32(value)))


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a bool", str: "a string", list: "a list"}


def _has_type(value: Any, kind: type, item: type | None) -> bool:
    """Whether ``value`` is a ``kind`` (of ``item``s); bools are only bools, ints are floats too."""
    def is_a(v: Any, t: type) -> bool:
        if isinstance(v, bool):
            return t is bool
        return isinstance(v, t) or (t is float and isinstance(v, int))

    if not is_a(value, kind):
        return False
    return item is None or all(is_a(v, item) for v in value)


# ------------------------------------------------------------------ config


def gguf_config(meta: _Metadata, tensors: dict[str, Any]) -> ModelConfig:
    """``ModelConfig`` from GGUF metadata and ``tensors`` (name -> reader tensor).

    Which tensors exist decides embedding tying and the biases; the
    ``rope_freqs`` tensor, when present, is read into ``rope_freq_factors``.
    """
    source = meta.source
    tensor_names = set(tensors)
    _check_rope_scaling(meta)
    hidden = meta.arch_int("embedding_length")
    heads = meta.arch_int("attention.head_count")
    head_dim = meta.arch_int("attention.key_length", _default_head_dim(hidden, heads, source))
    value_dim = meta.arch_int("attention.value_length", head_dim)
    rope_dim = meta.arch_int("rope.dimension_count", head_dim)
    if value_dim != head_dim or rope_dim != head_dim:
        raise ModelLoadError(
            f"{source}: key length {head_dim}, value length {value_dim} and rope dimension "
            f"{rope_dim} differ; only equal sizes (full rotary) are supported"
        )
    output_bias = "blk.0.attn_output.bias" in tensor_names
    config = ModelConfig(
        architecture=ARCHITECTURES[meta.architecture],
        vocab_size=meta.arch_int("vocab_size", _vocab_size(meta)),
        hidden_size=hidden,
        intermediate_size=meta.arch_int("feed_forward_length"),
        num_layers=meta.arch_int("block_count"),
        num_heads=heads,
        num_kv_heads=meta.arch_int("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=meta.arch_float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=meta.arch_float("rope.freq_base", 10000.0),
        rope_scaling=None,
        rope_freq_factors=_rope_freq_factors(tensors, head_dim, source),
        tie_word_embeddings="output.weight" not in tensor_names,
        max_position_embeddings=meta.arch_int("context_length", 2048),
        # q, k, v and output biases (Llama's attention_bias), or q, k, v only (Qwen2)
        attention_bias=output_bias,
        qkv_bias=not output_bias and "blk.0.attn_q.bias" in tensor_names,
        mlp_bias="blk.0.ffn_up.bias" in tensor_names,
        qk_norm=meta.architecture == "qwen3",
        sliding_window=_sliding_window(meta),
    )
    check_config(config, source)
    return config


def _default_head_dim(hidden: int, heads: int, source: str) -> int:
    """``hidden / heads``; ModelLoadError when it does not divide."""
    if hidden % heads:
        raise ModelLoadError(f"{source}: embedding length {hidden} is not divisible by "
                             f"{heads} heads and no attention.key_length is given")
    return hidden // heads


def _vocab_size(meta: _Metadata) -> int | None:
    """Vocabulary size from the token list, when the file has one."""
    tokens = meta.get("tokenizer.ggml.tokens", kind=list)
    return len(tokens) if tokens else None


def _check_rope_scaling(meta: _Metadata) -> None:
    """Reject rope scaling metadata; llama3 scaling comes as a ``rope_freqs`` tensor instead."""
    kind = meta.get(f"{meta.architecture}.rope.scaling.type", kind=str)
    if kind not in (None, "none"):
        raise ModelLoadError(f"{meta.source}: unsupported rope scaling type {kind!r} in GGUF")


def _rope_freq_factors(tensors: dict[str, Any], head_dim: int, source: str) -> list[float] | None:
    """The ``rope_freqs`` tensor's values: llama.cpp's rotary frequency divisors, [head_dim / 2].

    llama.cpp's converter stores llama3 rope scaling this way (and no scaling
    metadata): rotary inverse frequency i becomes ``base_i / rope_freqs[i]``.
    """
    if ROPE_FREQS not in tensors:
        return None
    factors = dequantize(tensors[ROPE_FREQS], source).flatten()
    if factors.numel() != head_dim // 2:
        raise ModelLoadError(f"{source}: tensor {ROPE_FREQS} has {factors.numel()} values, expected "
                             f"head_dim / 2 = {head_dim // 2}")
    if not bool(torch.isfinite(factors).all() and (factors > 0).all()):
        raise ModelLoadError(f"{source}: tensor {ROPE_FREQS} must hold finite factors > 0")
    return factors.tolist()


def _sliding_window(meta: _Metadata) -> int:
    """``<arch>.attention.sliding_window`` (0: absent, or 0 in the file: no window)."""
    key = f"{meta.architecture}.attention.sliding_window"
    window = meta.get(key, kind=int)
    if window is None or window == 0:
        return 0
    if window < 0:
        raise ModelLoadError(f"{meta.source}: metadata {key!r} must be >= 0, got {window}")
    return window


# ----------------------------------------------------------------- weights


def hf_tensor_name(gguf_name: str) -> str | None:
    """HuggingFace name of a GGUF tensor, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_PATTERN.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def _read_weights(tensors: dict[str, Any], config: ModelConfig, architecture: str, dtype: torch.dtype,
                  device: torch.device, source: str,
                  keep_blocks: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Renamed (and for llama un-permuted) weights named as HF names them, and
    the formats of those kept in blocks (see ``load_gguf``)."""
    tensors = {name: t for name, t in tensors.items() if name != ROPE_FREQS}  # read into the config
    unknown = sorted(name for name in tensors if hf_tensor_name(name) is None)
    if unknown:
        raise ModelLoadError(f"{source}: unexpected tensor {unknown[0]} for a {architecture} model")
    gguf_name_of = {hf_tensor_name(name): name for name in tensors}
    check_names(gguf_name_of, config, source)
    weights: dict[str, torch.Tensor] = {}
    formats: dict[str, str] = {}
    dequantised_types: list[str] = []
    for name, shape in expected_shapes(config).items():
        tensor = tensors[gguf_name_of[name]]
        fmt = quantized.native_format(tensor.tensor_type) if keep_blocks and quantized.is_matrix(name) else None
        sixteen = quantized.sixteen_bit_dtype(tensor.tensor_type) if keep_blocks and quantized.is_matrix(name) else None
        if fmt is not None:
            value = _blocks(tensor, fmt, name, shape, source)
            formats[name] = fmt
        elif sixteen is not None:  # the file's 16-bit values, a view of its map
            data = tensor.data if sixteen == torch.float16 else tensor.data.view(np.uint16)
            value = finish_tensor(name, torch.from_numpy(data).view(sixteen), shape, sixteen, device, source)
        else:
            if keep_blocks and not quantized.is_float_type(tensor.tensor_type):
                dequantised_types.append(getattr(tensor.tensor_type, "name", str(tensor.tensor_type)))
            value = finish_tensor(name, dequantize(tensor, source), shape, dtype, device, source)
        if architecture == "llama":  # after the shape check: the rows split into heads
            value = _undo_rope_permutation(name, value, config).contiguous()
        weights[name] = value
    quantized.warn_dequantized(dequantised_types, source)
    return weights, formats


def _blocks(tensor: Any, fmt: str, name: str, shape: tuple[int, ...], source: str) -> torch.Tensor:
    """A matrix's GGUF rows, uint8 [n, row_bytes], viewing the file's map; ModelLoadError on a wrong shape."""
    n, k = shape
    data = tensor.data
    whole = k % quantized.block_weights(fmt) == 0
    if not whole or tuple(data.shape) != (n, quantized.row_bytes(fmt, k)):
        raise ModelLoadError(f"{source}: tensor {name} ({fmt}) holds {list(data.shape)} bytes of rows, "
                             f"expected [{n}, {quantized.row_bytes(fmt, k) if whole else '?'}] "
                             f"for shape {list(shape)}")
    return torch.from_numpy(data)


def dequantize(tensor: Any, source: str) -> torch.Tensor:
    """A GGUF tensor as float32, shape reversed from GGML's order (``[rows, cols]``)."""
    try:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:  # NotImplementedError for unsupported quant types
        kind = getattr(tensor.tensor_type, "name", tensor.tensor_type)
        raise ModelLoadError(f"{source}: cannot dequantize tensor {tensor.name} "
                             f"of type {kind}: {exc}") from exc
    array = np.asarray(array, dtype=np.float32)
    if not array.flags.writeable or not array.flags.c_contiguous or np.may_share_memory(array, tensor.data):
        array = np.array(array, dtype=np.float32, order="C")  # own copy, not the file's mmap
    return torch.from_numpy(array)


def _undo_rope_permutation(name: str, tensor: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Un-permute Q and K projections (weights and biases); other tensors unchanged."""
    if ".self_attn.q_proj." in name:
        return unpermute_rope_rows(tensor, config.num_heads)
    if ".self_attn.k_proj." in name:
        return unpermute_rope_rows(tensor, config.num_kv_heads)
    return tensor


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row interleaving of a Q or K projection.

    Within each head of ``D`` rows, llama.cpp stores row ``s * D/2 + j`` of the
    HF layout (half ``s``, pair index ``j``) at position ``2 * j + s``.

    Args:
        weight: ``[num_heads * D, ...]`` (a weight ``[N*D, H]`` or a bias ``[N*D]``).
        num_heads: heads in this projection (``Nq`` for Q, ``Nkv`` for K).

    Returns: ``[num_heads * D, ...]`` in HuggingFace row order.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
    half = rows // num_heads // 2
    rest = weight.shape[1:]
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(weight.shape)
