"""Load a GGUF file (llama.cpp's format): config, dequantised weights, tokenizer.

Supported: ``general.architecture`` ``llama`` and ``qwen3``, any tensor type
``gguf.quants.dequantize`` handles, and byte-level BPE tokenizers
(``tokenizer.ggml.model == "gpt2"``).

Two llama.cpp conventions are undone so that the weights equal a HuggingFace
checkpoint's:

* names: ``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.q_proj.weight``, ...
* rows of Q and K (``llama`` only): llama.cpp's converter interleaves the two
  rotary halves of every head (``permute`` in ``convert_hf_to_gguf.py``);
  ``unpermute_rope_rows`` puts them back.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import tokenizers
import torch
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from .config import ModelConfig
from .errors import ModelLoadError
from .loaded import LoadedModel, end_of_sequence_ids
from .tokenizer import Tokenizer
from .weights import check_config, check_names, expected_shapes, finish_tensor

GGUF_MAGIC = b"GGUF"

# general.architecture -> ModelConfig.architecture
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}

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

# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# Split patterns of the pre-tokenizers named by tokenizer.ggml.pre, as in the
# models' own tokenizer.json files (Llama 3, Qwen2).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3")
_QWEN2_PRE = ("qwen2", "deepseek-r1-qwen")
SUPPORTED_PRE_TOKENIZERS = ("gpt2", "smollm", *_LLAMA3_PRE, *_QWEN2_PRE)


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file starting with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load the GGUF file at ``path`` with weights in ``dtype`` on ``device``."""
    reader = _open_reader(path)
    meta = _Metadata(reader, str(path))
    tensors = {t.name: t for t in reader.tensors}
    config = gguf_config(meta, set(tensors))
    tokenizer = build_tokenizer(meta)
    weights = _read_weights(tensors, config, meta.architecture, dtype, device, str(path))
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
    try:
        return _CheckedReader(path)
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
                                 f"got {_short(value)}")
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
                                 f"got {_short(value)}")
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


def _short(value: Any) -> str:
    """``repr(value)`` cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------ config


def gguf_config(meta: _Metadata, tensor_names: set[str]) -> ModelConfig:
    """``ModelConfig`` from GGUF metadata; ``tensor_names`` decides embedding tying."""
    source = meta.source
    _check_rope_scaling(meta, tensor_names)
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
        tie_word_embeddings="output.weight" not in tensor_names,
        max_position_embeddings=meta.arch_int("context_length", 2048),
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        mlp_bias="blk.0.ffn_up.bias" in tensor_names,
        qk_norm=meta.architecture == "qwen3",
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


def _check_rope_scaling(meta: _Metadata, tensor_names: set[str]) -> None:
    """Reject rope scaling; GGUF carries llama3 scaling only as a ``rope_freqs`` tensor."""
    kind = meta.get(f"{meta.architecture}.rope.scaling.type", kind=str)
    if kind not in (None, "none"):
        raise ModelLoadError(f"{meta.source}: unsupported rope scaling type {kind!r} in GGUF")
    if "rope_freqs.weight" in tensor_names:
        raise ModelLoadError(
            f"{meta.source}: rope scaling stored as a rope_freqs tensor (e.g. llama3) is not "
            "supported for GGUF files; load the HuggingFace directory instead"
        )


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


def _read_weights(tensors: dict[str, Any], config: ModelConfig, architecture: str,
                  dtype: torch.dtype, device: torch.device, source: str) -> dict[str, torch.Tensor]:
    """Dequantised, renamed (and for llama un-permuted) weights named as HF names them."""
    unknown = sorted(name for name in tensors if hf_tensor_name(name) is None)
    if unknown:
        raise ModelLoadError(f"{source}: unexpected tensor {unknown[0]} for a {architecture} model")
    gguf_name_of = {hf_tensor_name(name): name for name in tensors}
    check_names(gguf_name_of, config, source)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        tensor = finish_tensor(name, dequantize(tensors[gguf_name_of[name]], source), shape, dtype, device, source)
        if architecture == "llama":  # after finish_tensor's shape check: the rows split into heads
            tensor = _undo_rope_permutation(name, tensor, config).contiguous()
        weights[name] = tensor
    return weights


def dequantize(tensor: Any, source: str) -> torch.Tensor:
    """A GGUF tensor as float32, shape reversed from GGML's order (``[rows, cols]``)."""
    try:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:  # NotImplementedError for unsupported quant types
        kind = getattr(tensor.tensor_type, "name", tensor.tensor_type)
        raise ModelLoadError(f"{source}: cannot dequantize tensor {tensor.name} "
                             f"of type {kind}: {exc}") from exc
    array = np.asarray(array, dtype=np.float32)
    if not array.flags.writeable or not array.flags.c_contiguous:
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


# --------------------------------------------------------------- tokenizer


def build_tokenizer(meta: _Metadata) -> Tokenizer | None:
    """The tokenizer described by ``tokenizer.ggml.*``, or None when there is none."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None
    if kind != "gpt2":
        raise ModelLoadError(f"{meta.source}: unsupported GGUF tokenizer model {_short(kind)}; "
                             "supported: 'gpt2' (byte-level BPE)")
    tokens: list[str] = meta.require("tokenizer.ggml.tokens", kind=list, item=str)
    pre = meta.get("tokenizer.ggml.pre", "gpt2", kind=str)
    pre_tokenizer = _pre_tokenizer(pre, meta.source)
    merges = _merges(meta)
    token_types = meta.get("tokenizer.ggml.token_type", [], kind=list, item=int)
    bos, eos = (_token_at(tokens, meta.token_id(f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos"))
    try:  # the tokenizers library checks what it is given (merges of unknown tokens, ...)
        backend = tokenizers.Tokenizer(models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            ignore_merges=pre in _LLAMA3_PRE,
        ))
        backend.normalizer = _normalizer(pre)
        backend.pre_tokenizer = pre_tokenizer
        backend.decoder = decoders.ByteLevel()
        _add_special_tokens(backend, tokens, token_types, meta.source)
        backend.post_processor = _post_processor(meta, bos, eos)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{meta.source}: cannot build the tokenizer its metadata describes: {exc}") from exc
    return Tokenizer(backend, bos_token=bos, eos_token=eos,
                     chat_template=meta.get("tokenizer.chat_template", kind=str), source=meta.source)


def _merges(meta: _Metadata) -> list[tuple[str, str]]:
    """BPE merges ``"a b"`` -> ``("a", "b")``."""
    pairs = []
    for merge in meta.require("tokenizer.ggml.merges", kind=list, item=str):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ModelLoadError(f"{meta.source}: malformed tokenizer merge {merge!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def _pre_tokenizer(pre: str, source: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for ``tokenizer.ggml.pre``.

    * ``gpt2``: GPT-2's byte-level split.
    * ``smollm``: digits split one by one, then GPT-2's byte-level split
      (SmolLM2's own tokenizer.json; llama.cpp does the same).
    * ``llama-bpe`` / ``qwen2`` (and aliases): the model's split regex, then
      byte-level mapping without GPT-2's regex.
    """
    if pre == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ])
    split = _LLAMA3_SPLIT if pre in _LLAMA3_PRE else _QWEN2_SPLIT if pre in _QWEN2_PRE else None
    if split is None:
        raise ModelLoadError(f"{source}: unsupported GGUF pre-tokenizer {pre!r}; "
                             f"supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}")
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _normalizer(pre: str) -> normalizers.Normalizer | None:
    """Qwen2's tokenizer applies NFC before splitting; the others normalise nothing."""
    return normalizers.NFC() if pre in _QWEN2_PRE else None


def _add_special_tokens(backend: tokenizers.Tokenizer, tokens: list[str],
                        token_types: list[int], source: str) -> None:
    """Control tokens become special tokens, user-defined ones plain added tokens.

    Both are then matched whole in text instead of being split by BPE.
    """
    if not token_types:
        return
    if len(token_types) != len(tokens):
        raise ModelLoadError(f"{source}: {len(token_types)} token types for {len(tokens)} tokens")
    kinds = list(zip(tokens, token_types, strict=True))
    special = [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == _TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in kinds if k == _TOKEN_USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)


def _token_at(tokens: list[str], token_id: int | None) -> str | None:
    """``tokens[token_id]``, or None when the id is absent or out of range."""
    if isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return None


def _post_processor(meta: _Metadata, bos: str | None,
                    eos: str | None) -> processors.PostProcessor | None:
    """BOS/EOS added by ``encode(add_special_tokens=True)``, as the metadata asks."""
    add_bos = meta.get("tokenizer.ggml.add_bos_token", False, kind=bool) and bos is not None
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False, kind=bool) and eos is not None
    if not (add_bos or add_eos):
        return None
    prefix = [f"{bos}:0"] if add_bos else []
    suffix = [f"{eos}:0"] if add_eos else []
    specials = ([(bos, meta.token_id("tokenizer.ggml.bos_token_id"))] if add_bos else []) + \
               ([(eos, meta.token_id("tokenizer.ggml.eos_token_id"))] if add_eos else [])
    return processors.TemplateProcessing(
        single=[*prefix, "$A:0", *suffix],
        pair=[*prefix, "$A:0", *suffix, *prefix, "$B:1", *suffix],
        special_tokens=list(dict.fromkeys(specials)),
    )
