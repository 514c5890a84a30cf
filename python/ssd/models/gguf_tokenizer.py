"""The tokenizer a GGUF file describes (``tokenizer.ggml.*``), as a ``tokenizers`` backend.

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE with the pre-tokenizers
  named by ``tokenizer.ggml.pre``.
* ``"llama"``: SentencePiece BPE (Llama 2, Mistral, TinyLlama) from the
  pieces' scores and types (``spm_tokenizer.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from . import spm_tokenizer
from .errors import ModelLoadError
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .gguf_loader import _Metadata

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



def build_tokenizer(meta: _Metadata) -> Tokenizer | None:
    """The tokenizer described by ``tokenizer.ggml.*``, or None when there is none."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None
    if kind == "llama":
        return _sentencepiece_tokenizer(meta)
    if kind != "gpt2":
        raise ModelLoadError(f"{meta.source}: unsupported GGUF tokenizer model {short_repr(kind)}; "
                             "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE)")
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


def _sentencepiece_tokenizer(meta: _Metadata) -> Tokenizer:
    """A SentencePiece BPE tokenizer (``tokenizer.ggml.model == "llama"``).

    Defaults as in llama.cpp: a space prefix and a BOS token, no EOS token.
    """
    tokens: list[str] = meta.require("tokenizer.ggml.tokens", kind=list, item=str)
    vocab = spm_tokenizer.SentencePieceVocab(
        pieces=tokens,
        scores=meta.require("tokenizer.ggml.scores", kind=list, item=float),
        types=meta.get("tokenizer.ggml.token_type", [spm_tokenizer.NORMAL] * len(tokens), kind=list, item=int),
        add_space_prefix=meta.get("tokenizer.ggml.add_space_prefix", True, kind=bool),
        unk_id=meta.token_id("tokenizer.ggml.unknown_token_id"),
        source=meta.source,
    )
    backend = spm_tokenizer.build_backend(vocab)
    bos_id, eos_id = (meta.token_id(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos"))
    bos, eos = _token_at(tokens, bos_id), _token_at(tokens, eos_id)
    add_bos = meta.get("tokenizer.ggml.add_bos_token", True, kind=bool) and bos is not None
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False, kind=bool) and eos is not None
    try:
        backend.post_processor = spm_tokenizer.bos_eos_processor(
            (bos, bos_id) if add_bos else None, (eos, eos_id) if add_eos else None)
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
    return spm_tokenizer.bos_eos_processor(
        (bos, meta.token_id("tokenizer.ggml.bos_token_id")) if add_bos else None,
        (eos, meta.token_id("tokenizer.ggml.eos_token_id")) if add_eos else None)


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
