"""Fuzz target: GGUF files through ssd.models.load (python/ssd/models/gguf_loader.py).

Input modes (the first byte's low bit):

* raw: the rest is the file itself, mutated from the seed files' bytes;
* structured: the rest drives edits to a seed file's metadata (values of other
  types, other values, removed keys) before gguf.GGUFWriter writes it, so the
  fuzzer reaches the loader's checks beyond the byte layout.

Documented error: ModelLoadError (load's one error type). A loaded model's
tokenizer must then encode and decode, and its chat template render or fail
with ChatTemplateError.
"""
from __future__ import annotations

import copy
import logging
import tempfile
from pathlib import Path

import atheris
import gguf

from ssd.models import ChatTemplateError, ModelLoadError, load
from tests.fuzz import gguf_files

DOCUMENTED = (ModelLoadError,)
T = gguf.GGUFValueType
logging.getLogger("gguf").setLevel(logging.ERROR)  # the writer warns about odd values; they are the point

_DIR = Path(tempfile.mkdtemp(prefix="ssd-fuzz-gguf-"))  # under $TMPDIR: the pytest run removes it
_SPECS = gguf_files.seed_specs()
_KEYS = sorted({k for s in _SPECS for k in s.metadata} | {
    "llama.rope.scaling.type", "llama.attention.value_length", "llama.rope.dimension_count",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.add_eos_token",
    "qwen3.vocab_size", "general.architecture"})
_SCALARS = [T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.FLOAT32, T.BOOL, T.UINT64, T.INT64, T.FLOAT64]
_counter = 0


def _scalar(fdp: atheris.FuzzedDataProvider, vtype: gguf.GGUFValueType):
    if vtype == T.BOOL:
        return fdp.ConsumeBool()
    if vtype in (T.FLOAT32, T.FLOAT64):
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    bits = {T.UINT8: 8, T.INT8: 8, T.UINT16: 16, T.INT16: 16, T.UINT32: 32, T.INT32: 32}.get(vtype, 64)
    signed = vtype in (T.INT8, T.INT16, T.INT32, T.INT64)
    value = fdp.ConsumeIntInRange(0, 2**bits - 1)
    return value - 2 ** (bits - 1) if signed else value


def _value(fdp: atheris.FuzzedDataProvider):
    """(value, type, sub type) of a random kind."""
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        vtype = fdp.PickValueInList(_SCALARS)
        return _scalar(fdp, vtype), vtype, None
    if kind == 1:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40)), T.STRING, None
    if kind == 2:
        items = [fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8)) for _ in range(fdp.ConsumeIntInRange(0, 12))]
        return items, T.ARRAY, T.STRING
    if kind == 3:
        vtype = fdp.PickValueInList(_SCALARS)
        return [_scalar(fdp, vtype) for _ in range(fdp.ConsumeIntInRange(0, 12))], T.ARRAY, vtype
    return fdp.PickValueInList(gguf_files.TOKENS + ["gpt2", "llama", "qwen3", "llama-bpe", "none", "linear"]), T.STRING, None


def _structured(data: bytes, path: Path) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    spec = copy.deepcopy(_SPECS[fdp.ConsumeIntInRange(0, len(_SPECS) - 1)])
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        key = fdp.PickValueInList(_KEYS)
        if fdp.ConsumeIntInRange(0, 4) == 0:
            spec.metadata.pop(key, None)
        else:
            spec.metadata[key] = _value(fdp)
    if fdp.ConsumeBool() and spec.tensors:  # drop a tensor
        names = sorted(spec.tensors)
        del spec.tensors[names[fdp.ConsumeIntInRange(0, len(names) - 1)]]
    try:
        gguf_files.write(spec, path)
    except (ValueError, OverflowError, TypeError):  # a value the writer cannot encode: not an input
        path.write_bytes(b"")


def _exercise(model) -> None:
    tokenizer = model.tokenizer
    if tokenizer is None:
        return
    ids = tokenizer.encode(" ab abc <|im_end|>")
    tokenizer.decode(ids)
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "ab"}])
    except (ChatTemplateError, ModelLoadError):
        pass


def test_one_input(data: bytes) -> None:
    global _counter
    if not data:
        return
    _counter += 1
    path = _DIR / f"input-{_counter % 2}.gguf"  # a fresh file: an earlier reader may still map the last one
    path.unlink(missing_ok=True)
    if data[0] % 2:
        _structured(data[1:], path)
    else:
        path.write_bytes(data[1:])
    if path.stat().st_size < 4:
        return
    try:
        model = load(path)
    except DOCUMENTED:
        return
    _exercise(model)


def seeds() -> list[bytes]:
    out = []
    for i, s in enumerate(_SPECS):
        out.append(b"\x00" + gguf_files.write(s, _DIR / f"seed-{i}.gguf").read_bytes())
        out.append(bytes([1, i]) + bytes(8))
    return out


DICTIONARY = [b"GGUF", b"\x03\x00\x00\x00", b"\x08\x00\x00\x00", b"\x09\x00\x00\x00", b"\xff\xff\xff\xff",
              b"\xff\xff\xff\xff\xff\xff\xff\x7f", "tokenizer.ggml.", "llama.", "qwen3.", "blk.0.", ".weight"]
