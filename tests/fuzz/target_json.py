"""Fuzz target: the C++ JSON reader (csrc/model/json.h) via ssd._C.testing.parse_json.

Documented error: ValueError (std::invalid_argument, "malformed JSON: ... at byte N").
Oracle (differential, against Python's json): whatever the C++ reader accepts,
json accepts with the same value, and the C++ reader accepts json's own
serialization of every value json reads that the C++ rules allow (no NaN,
no lone surrogates, nesting within 256). The reader is stricter than json on
purpose (duplicate keys, NaN, lone surrogates, numbers beyond double), so the
comparison only runs in the directions where the two must agree.

The C++ code is not instrumented (no clang here, so no libFuzzer coverage of
the extension); coverage guidance comes from json's pure-Python decoder, which
parses every input as the oracle.
"""
from __future__ import annotations

import json
import json.decoder
import json.scanner
import math

import atheris

from ssd import _C

DOCUMENTED = (ValueError,)
MAX_DEPTH = 256  # csrc/model/json.cpp kMaxDepth

for _fn in (json.decoder.py_scanstring, json.decoder.JSONObject, json.decoder.JSONArray,
            json.scanner.py_make_scanner):
    atheris.instrument_func(_fn)


def _python_decoder() -> json.JSONDecoder:
    """json's decoder with its pure-Python scanner (instrumented; the C one is not)."""
    decoder = json.JSONDecoder()
    decoder.parse_string = json.decoder.py_scanstring
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder


_DECODER = _python_decoder()
_REJECTED = object()


def python_value(data: bytes):
    try:
        return _DECODER.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _REJECTED


def cpp_value(data: bytes):
    try:
        return _C.testing.parse_json(data)
    except DOCUMENTED:
        return _REJECTED


def same(a, b) -> bool:
    """Equal as JSON values; an integer beyond int64 is read by C++ as the nearest double."""
    if isinstance(b, bool) or b is None or isinstance(b, str):
        return type(a) is type(b) and a == b
    if isinstance(b, int):
        if -(2**63) <= b < 2**63:
            return type(a) is int and a == b
        return type(a) is float and a == float(b)
    if isinstance(b, float):
        return type(a) is float and (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(b, list):
        return type(a) is list and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return (type(a) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b))


def depth(v) -> int:
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    return 0


def canonical(value, ascii_only: bool) -> bytes | None:
    """json's text of ``value`` when the C++ rules admit it, else None."""
    if depth(value) > MAX_DEPTH + 1 or not all(_utf8(s) for s in _strings(value)):
        return None
    try:
        return json.dumps(value, ensure_ascii=ascii_only, allow_nan=False).encode("utf-8")
    except ValueError:  # NaN or infinity
        return None


def _utf8(s: str) -> bool:
    """False for a string holding a lone surrogate (which the C++ reader rejects)."""
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def test_one_input(data: bytes) -> None:
    got = cpp_value(data)
    want = python_value(data)
    if got is not _REJECTED:
        assert want is not _REJECTED, f"C++ accepted JSON that json rejects: {data!r}"
        assert same(got, want), f"C++ read {got!r}, json {want!r}, from {data!r}"
    if want is _REJECTED:
        return
    text = canonical(want, ascii_only=len(data) % 2 == 0)
    if text is not None:
        again = cpp_value(text)
        assert again is not _REJECTED, f"C++ rejected json's serialization {text!r}"
        assert same(again, want), f"C++ read {again!r} from json's serialization {text!r}"


def _strings(v):
    """Every string in ``v``, object keys included."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)


def seeds() -> list[bytes]:
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "rms_norm_eps": 1e-05,
              "rope_scaling": None, "tie_word_embeddings": True, "eos_token_id": [2, 3],
              "rope_theta": 100000.0, "torch_dtype": "bfloat16"}
    header = {"__metadata__": {"format": "pt"},
              "model.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    return [
        json.dumps(config).encode(),
        json.dumps(header, indent=1).encode(),
        b'{"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}, "metadata": {"total_size": 12}}',
        '["\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/", "é😀", "\\u0000"]'.encode(),
        b"[0, -0, -0.0, 1e308, 2.5E-3, 9223372036854775807, -9223372036854775808, 18446744073709551616]",
        b" \t\r\n[[[[{}]]], true, false, null, {\"\": [], \"k\": {}}] ",
        b"[" * 40 + b"]" * 40,
    ]


DICTIONARY = ['{', '}', '[', ']', ':', ',', '"', '\\u', '\\ud83d\\ude00', '\\ud800', 'true', 'false', 'null',
              '1e308', '1e-400', '-0', '0.0', 'E+', '9223372036854775808', '\\"', '\\\\', b'\xc3\xa9',
              b'\xed\xa0\x80', b'\xf4\x90\x80\x80', b'\xc0\xaf', '"__metadata__"', 'NaN']
