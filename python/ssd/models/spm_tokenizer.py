"""SentencePiece BPE tokenizers (Llama 2, Mistral, TinyLlama) as ``tokenizers`` backends.

The pieces, scores and types come from a GGUF file (``tokenizer.ggml.model ==
"llama"``, see ``gguf_tokenizer.py``) or from a ``tokenizer.model`` protobuf
(``read_model_file``). SentencePiece's BPE splits text into characters and
repeatedly joins the adjacent pair whose concatenation is the piece of highest
score; ``merges_from_scores`` lists those joins as ranked BPE merges, which
``tokenizers``' BPE then applies in the same order. Characters without a piece
become their UTF-8 bytes (``<0xNN>`` pieces) when the vocabulary has them.

Control and unknown pieces become special tokens and user-defined pieces added
tokens: both are matched whole in the text, and, as in llama.cpp and
HuggingFace's Llama tokenizer, each stretch of text between them gets its own
leading "▁" when the space prefix is on.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, processors

from .errors import ModelLoadError
from .tokenizer import Tokenizer

SPACE = "\u2581"  # "▁", SentencePiece's stand-in for a space

# Piece types, as numbered by SentencePiece's ModelProto and by GGUF's token_type.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class SentencePieceVocab:
    """A SentencePiece BPE vocabulary: piece ``i`` has text ``pieces[i]``, ``scores[i]``, ``types[i]``.

    ``add_space_prefix``: a "▁" is put before the text (SentencePiece's
    ``add_dummy_prefix``) and one leading space is stripped when decoding.
    ``precompiled_charsmap`` / ``remove_extra_whitespaces``: a ``.model``
    file's normaliser (empty / False for Llama's identity normaliser).
    """

    pieces: list[str]
    scores: list[float]
    types: list[int]
    add_space_prefix: bool = True
    precompiled_charsmap: bytes = b""
    remove_extra_whitespaces: bool = False
    unk_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    source: str = ""
    _ids: dict[str, int] = field(default_factory=dict, repr=False)

    def check(self) -> None:
        """ModelLoadError naming the first inconsistency (lengths, types, repeated pieces)."""
        n = len(self.pieces)
        if len(self.scores) != n or len(self.types) != n:
            raise ModelLoadError(f"{self.source}: {n} pieces, {len(self.scores)} scores and "
                                 f"{len(self.types)} token types: they must be as many")
        bad = next((t for t in self.types if not NORMAL <= t <= BYTE), None)
        if bad is not None:
            raise ModelLoadError(f"{self.source}: unknown SentencePiece token type {bad}")
        self._ids = {}
        for i, piece in enumerate(self.pieces):
            if self._ids.setdefault(piece, i) != i:
                raise ModelLoadError(f"{self.source}: piece {piece!r} appears twice "
                                     f"(ids {self._ids[piece]} and {i})")

    def piece(self, token_id: int | None) -> str | None:
        """Text of a piece id, or None when the id is absent or out of range."""
        if token_id is not None and 0 <= token_id < len(self.pieces):
            return self.pieces[token_id]
        return None


def merges_from_scores(vocab: SentencePieceVocab) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's joining by score.

    Every split of a normal piece into two normal pieces is a merge, ranked by
    the score of the joined piece, highest first (ties: the lower piece id
    first, then the shorter left part).
    """
    ids = {p: i for i, (p, t) in enumerate(zip(vocab.pieces, vocab.types)) if t == NORMAL}
    ranked = []
    for piece, piece_id in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-vocab.scores[piece_id], piece_id, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_backend(vocab: SentencePieceVocab) -> tokenizers.Tokenizer:
    """The ``tokenizers`` backend for ``vocab`` (without a post-processor)."""
    vocab.check()
    unk = vocab.piece(vocab.unk_id)
    if unk is None:
        unk = next((p for p, t in zip(vocab.pieces, vocab.types) if t == UNKNOWN), None)
    try:
        backend = tokenizers.Tokenizer(models.BPE(
            vocab=dict(vocab._ids),
            merges=merges_from_scores(vocab),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=BYTE in vocab.types,
        ))
    except Exception as exc:
        raise ModelLoadError(f"{vocab.source}: cannot build the SentencePiece tokenizer: {exc}") from exc
    backend.normalizer = _normalizer(vocab)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    kinds = list(zip(vocab.pieces, vocab.types))
    special = [AddedToken(p, special=True, normalized=False) for p, t in kinds if t in (UNKNOWN, CONTROL)]
    user = [AddedToken(p, special=False, normalized=False) for p, t in kinds if t == USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)
    return backend


def _normalizer(vocab: SentencePieceVocab) -> normalizers.Normalizer:
    """The ``.model`` file's character map and whitespace rule, the "▁" prefix, spaces as "▁"."""
    steps = []
    if vocab.precompiled_charsmap:
        steps.append(normalizers.Precompiled(vocab.precompiled_charsmap))
    if vocab.remove_extra_whitespaces:
        steps += [normalizers.Replace(tokenizers.Regex("^ +| +$"), ""),
                  normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
    if vocab.add_space_prefix:
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(" ", SPACE))
    return normalizers.Sequence(steps)


def bos_eos_processor(bos: tuple[str, int] | None,
                      eos: tuple[str, int] | None) -> processors.PostProcessor | None:
    """A post-processor that puts ``bos`` before and ``eos`` after the ids (each ``(text, id)`` or None)."""
    if bos is None and eos is None:
        return None
    prefix = [f"{bos[0]}:0"] if bos else []
    suffix = [f"{eos[0]}:0"] if eos else []
    return processors.TemplateProcessing(
        single=[*prefix, "$A:0", *suffix],
        pair=[*prefix, "$A:0", *suffix, *prefix, "$B:1", *suffix],
        special_tokens=list(dict.fromkeys(t for t in (bos, eos) if t is not None)),
    )


# ------------------------------------------------------- tokenizer.model


def read_model_file(path: Path) -> SentencePieceVocab:
    """The vocabulary of a SentencePiece ``tokenizer.model`` (a ``ModelProto``); BPE models only.

    Reads ``pieces`` (piece, score, type), ``trainer_spec`` (model type,
    special ids) and ``normalizer_spec`` (character map, dummy prefix,
    whitespace rule) with a minimal protobuf reader.
    """
    source = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    try:
        fields = _message(data)
        pieces = [_message(m) for m in fields.get(1, [])]
        trainer = _message(_last(fields, 2, b""))
        norm = _message(_last(fields, 3, b""))
        vocab = SentencePieceVocab(
            pieces=[_last(p, 1, b"").decode("utf-8") for p in pieces],
            scores=[struct.unpack("<f", struct.pack("<I", _last(p, 2, 0)))[0] for p in pieces],
            types=[_last(p, 3, NORMAL) for p in pieces],
            add_space_prefix=bool(_last(norm, 3, 1)),
            precompiled_charsmap=_last(norm, 2, b""),
            remove_extra_whitespaces=bool(_last(norm, 4, 1)),
            unk_id=_int32(_last(trainer, 40, 0)),
            bos_id=_int32(_last(trainer, 41, 1)),
            eos_id=_int32(_last(trainer, 42, 2)),
            source=source,
        )
        model_type, escape, suffix = _last(trainer, 3, 1), _last(norm, 5, 1), _last(trainer, 24, 0)
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError, struct.error) as exc:
        raise ModelLoadError(f"{path} is not a SentencePiece model file: {exc}") from exc
    if not vocab.pieces:
        raise ModelLoadError(f"{path} is not a SentencePiece model file: it has no pieces")
    if model_type != 2:
        kind = {1: "unigram", 3: "word", 4: "char"}.get(model_type, str(model_type))
        raise ModelLoadError(f"{path}: SentencePiece model type {kind} is not supported; only BPE is")
    if not escape or suffix:
        raise ModelLoadError(f"{path}: SentencePiece models that keep spaces as spaces or put '▁' "
                             "after words are not supported")
    return vocab


def _int32(value: int) -> int | None:
    """A protobuf int32 read as an unsigned varint; None for negative ids (-1: no such piece)."""
    value = value - (1 << 64) if value >= 1 << 63 else value
    return value if value >= 0 else None


def _last(fields: dict[int, list], number: int, default):
    """The last value of field ``number`` (protobuf's rule for a repeated scalar), or ``default``."""
    values = fields.get(number)
    return values[-1] if values else default


def _message(data: bytes) -> dict[int, list]:
    """Field number -> values of a protobuf message (varints and fixed32 as ints, the rest as bytes)."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = int.from_bytes(_take(data, pos, 8), "little"), pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = bytes(_take(data, pos, size)), pos + size
        elif wire == 5:
            value, pos = int.from_bytes(_take(data, pos, 4), "little"), pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        fields.setdefault(number, []).append(value)
    return fields


def _take(data: bytes, pos: int, size: int) -> memoryview:
    """``size`` bytes at ``pos``; ValueError when the message ends first."""
    if pos + size > len(data):
        raise ValueError(f"truncated protobuf field at byte {pos}")
    return memoryview(data)[pos:pos + size]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError(f"truncated or overlong protobuf varint at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def hf_tokenizer(model_dir: Path, tokenizer_config: dict, chat_template: str | None) -> Tokenizer | None:
    """The tokenizer of a HF directory's ``tokenizer.model`` (for one without tokenizer.json), or None.

    BOS / EOS are tokenizer_config's ``bos_token`` / ``eos_token`` (else the
    model file's); ``add_bos_token`` (default True, as for Llama) and
    ``add_eos_token`` (default False) choose what ``encode(add_special_tokens=True)`` adds.
    """
    path = model_dir / "tokenizer.model"
    if not path.is_file():
        return None
    vocab = read_model_file(path)
    backend = build_backend(vocab)
    bos = _config_token(tokenizer_config.get("bos_token")) or vocab.piece(vocab.bos_id)
    eos = _config_token(tokenizer_config.get("eos_token")) or vocab.piece(vocab.eos_id)
    ends = []
    for text, key, default in ((bos, "add_bos_token", True), (eos, "add_eos_token", False)):
        token_id = backend.token_to_id(text) if text is not None else None
        wanted = tokenizer_config.get(key, default) is True and token_id is not None
        ends.append((text, token_id) if wanted else None)
    backend.post_processor = bos_eos_processor(*ends)
    return Tokenizer(backend, bos_token=bos, eos_token=eos, chat_template=chat_template, source=str(model_dir))


def _config_token(value) -> str | None:
    """A special token as tokenizer_config writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
