"""SentencePiece BPE tokenizers (Llama 2, Mistral, TinyLlama): GGUF metadata and tokenizer.model files.

The oracle is the ``sentencepiece`` package itself: a tiny BPE model with
byte fallback is trained in the test, its pieces written into a GGUF file (or
its ``.model`` file into a HF directory), and ssd's encode, decode and
streamed decode are compared with SentencePiece's over varied text.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import gguf
import pytest
import sentencepiece as spm

from ssd.models import ModelLoadError, load_tokenizer

USER, END = "<|user|>", "<|end|>"  # a user-defined and a control piece

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "Hello, world! 123 456 7890",
    "def f(x):\n    return x ** 2",
    "naïve café résumé",
    "  spaced   out  text ",
    "Привет мир",
] * 20

TEXTS = [
    "hello world",
    " leading space",
    "trailing spaces  ",
    "multiple   inner    spaces",
    "   ",
    "",
    "line one\nline two\n\n",
    "\ttab and\r\ncrlf",
    "digits 1234567890 and 3.14",
    "Hello, world! (ok?) [x] {y} #z",
    "naïve café résumé",
    "Привет мир",
    "你好，世界",  # no pieces: byte fallback
    "emoji 🙂🚀 done",
    "mixed 中文 and ☃ snow",
    "def f(x):\n    return x ** 2",
]


def train(add_dummy_prefix: bool = True, **options) -> spm.SentencePieceProcessor:
    """A tiny SentencePiece BPE model with byte fallback and Llama's identity normaliser."""
    settings = dict(normalization_rule_name="identity", remove_extra_whitespaces=False)
    settings.update(options)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=400,
        byte_fallback=True, character_coverage=1.0, add_dummy_prefix=add_dummy_prefix,
        user_defined_symbols=[USER], control_symbols=[END], split_digits=True,
        allow_whitespace_only_pieces=True, hard_vocab_limit=False, minloglevel=2, **settings)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def piece_types(sp: spm.SentencePieceProcessor) -> list[int]:
    """GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""
    def kind(i: int) -> int:
        if sp.is_unknown(i):
            return 2
        if sp.is_control(i):
            return 3
        if sp.is_byte(i):
            return 6
        if sp.is_unused(i):
            return 5
        return 4 if sp.id_to_piece(i) == USER else 1

    return [kind(i) for i in range(sp.get_piece_size())]


def write_gguf(path: Path, sp: spm.SentencePieceProcessor, *, add_space_prefix: bool = True,
               add_bos: bool = True, scores: bool = True, types: list[int] | None = None) -> Path:
    """A GGUF file holding only a llama tokenizer's metadata, as llama.cpp's converter writes it."""
    n = sp.get_piece_size()
    return write_pieces_gguf(
        path, [sp.id_to_piece(i) for i in range(n)], [sp.get_score(i) for i in range(n)] if scores else None,
        piece_types(sp) if types is None else types, add_space_prefix=add_space_prefix, add_bos=add_bos)


def write_pieces_gguf(path: Path, pieces: list[str], scores: list[float] | None, types: list[int], *,
                      add_space_prefix: bool = True, add_bos: bool = True) -> Path:
    """Pieces 0, 1, 2 are unk, bos and eos (SentencePiece's default ids)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    if scores is not None:
        writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def sp() -> spm.SentencePieceProcessor:
    return train()


@pytest.fixture(scope="module")
def gguf_tokenizer(sp, tmp_path_factory):
    return load_tokenizer(write_gguf(tmp_path_factory.mktemp("spm") / "tok.gguf", sp))


@pytest.fixture(scope="module")
def model_file_tokenizer(sp, tmp_path_factory):
    """The tokenizer of a HF directory with tokenizer.model and no tokenizer.json."""
    directory = tmp_path_factory.mktemp("spm_dir")
    (directory / "tokenizer.model").write_bytes(sp.serialized_model_proto())
    return load_tokenizer(directory)


SOURCES = ["gguf_tokenizer", "model_file_tokenizer"]


def test_texts_exercise_byte_fallback_and_space_merges(sp):
    """The texts reach byte pieces and pieces of several '▁' (else the comparisons prove less)."""
    pieces = {sp.id_to_piece(i) for text in TEXTS for i in sp.encode(text)}
    assert any(re.fullmatch(r"<0x[0-9A-F]{2}>", p) for p in pieces)
    assert "▁▁" in pieces or "▁▁▁▁" in pieces


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_match_sentencepiece(request, sp, source, text):
    tokenizer = request.getfixturevalue(source)
    ids = sp.encode(text)
    assert tokenizer.encode(text) == ids
    assert tokenizer.decode(ids) == sp.decode(ids)
    assert tokenizer.decode([sp.bos_id(), *ids, sp.eos_id()]) == sp.decode([sp.bos_id(), *ids, sp.eos_id()])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_joins_into_sentencepiece_decode(request, sp, source, text):
    """Token by token, as ssd streams a reply: the pieces join into SentencePiece's decode,
    the first one without the space prefix's space, bytes of a character held until complete."""
    tokenizer = request.getfixturevalue(source)
    ids = sp.encode(text)
    step = tokenizer.stream_decoder()
    pieces = [step(i) or "" for i in ids]
    assert "".join(pieces) == sp.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("source", SOURCES)
def test_special_tokens_in_text(request, sp, source):
    """Control and user-defined pieces written in the text are matched whole; as in llama.cpp, each
    stretch of text after one gets its own space prefix (SentencePiece encodes each stretch alone)."""
    tokenizer = request.getfixturevalue(source)
    user, end = sp.piece_to_id(USER), sp.piece_to_id(END)
    text = f"{USER}hi there{END} y<s>"
    assert tokenizer.encode(text) == [user, *sp.encode("hi there"), end, *sp.encode(" y"), sp.bos_id()]
    ids = [user, *sp.encode("hi there"), end, *sp.encode("y")]
    assert tokenizer.decode(ids) == sp.decode(ids) == f"{USER} hi there y"


@pytest.mark.parametrize("source", SOURCES)
def test_bos_added_on_request(request, sp, source):
    tokenizer = request.getfixturevalue(source)
    assert tokenizer.encode("hello world", add_special_tokens=True) == sp.encode("hello world", add_bos=True)
    assert tokenizer.encode("hello world") == sp.encode("hello world")
    assert tokenizer.bos_token_id == sp.bos_id() and tokenizer.eos_token_id == sp.eos_id()
    assert tokenizer.vocab_size == sp.get_piece_size()


@pytest.mark.parametrize("scores, expected", [
    ((-5.0, -1.0), ["a", "bc"]),  # bc scores higher: joined first, then no piece abc ...
    ((-1.0, -5.0), ["ab", "c"]),  # ... whatever the pieces' order or length
])
def test_pairs_join_by_score(tmp_path, scores, expected):
    """SentencePiece joins the adjacent pair whose piece scores highest (hand-worked: 'abc')."""
    pieces = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "bca"]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 1]
    tokenizer = load_tokenizer(write_pieces_gguf(
        tmp_path / "t.gguf", pieces, [0.0, 0.0, 0.0, -10.0, -11.0, -12.0, *scores, 0.0], types,
        add_space_prefix=False))
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("abc")] == expected
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("bca")] == ["bca"]
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("x")] == ["<unk>"]  # no byte pieces


def test_gguf_flags_without_space_prefix_or_bos(tmp_path):
    """add_space_prefix false: no '▁' before the text, no space stripped when decoding."""
    sp = train(add_dummy_prefix=False)
    tokenizer = load_tokenizer(write_gguf(tmp_path / "t.gguf", sp, add_space_prefix=False, add_bos=False))
    for text in TEXTS:
        ids = sp.encode(text)
        assert tokenizer.encode(text, add_special_tokens=True) == ids
        assert tokenizer.decode(ids) == sp.decode(ids)


def test_model_file_with_nfkc_and_whitespace_removal(tmp_path):
    """SentencePiece's default normaliser: NFKC and extra spaces removed."""
    sp = train(normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
    (tmp_path / "tokenizer.model").write_bytes(sp.serialized_model_proto())
    tokenizer = load_tokenizer(tmp_path)
    for text in [*TEXTS, "ﬁne ① ＡＢＣ", "  a  b  "]:
        ids = sp.encode(text)
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == sp.decode(ids)


def test_model_file_tokenizer_config_names_the_special_tokens(sp, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(sp.serialized_model_proto())
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": "<|end|>", "add_bos_token": false}')
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.eos_token_id == sp.piece_to_id(END)
    assert tokenizer.encode("hello", add_special_tokens=True) == sp.encode("hello")


# ------------------------------------------------------------------ errors


def test_gguf_without_scores(sp, tmp_path):
    with pytest.raises(ModelLoadError, match=r"missing metadata 'tokenizer.ggml.scores'"):
        load_tokenizer(write_gguf(tmp_path / "t.gguf", sp, scores=False))


def test_gguf_token_types_of_other_length(sp, tmp_path):
    with pytest.raises(ModelLoadError, match=r"400 pieces, 400 scores and 3 token types"):
        load_tokenizer(write_gguf(tmp_path / "t.gguf", sp, types=[1, 1, 1]))


def test_model_file_of_unigram_type(tmp_path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, model_type="unigram",
                                   vocab_size=60, minloglevel=2, hard_vocab_limit=False)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    with pytest.raises(ModelLoadError, match=r"SentencePiece model type unigram is not supported; only BPE is"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("content", [b"\x0a\xff", b"not a protobuf \xff\xff", b""])
def test_model_file_not_sentencepiece(tmp_path, content):
    (tmp_path / "tokenizer.model").write_bytes(content)
    with pytest.raises(ModelLoadError, match=r"tokenizer.model is not a SentencePiece model file"):
        load_tokenizer(tmp_path)
