"""Fuzz target: safetensors headers (csrc/model/safetensors.h) via ssd._C.testing.parse_safetensors.

The input is a whole file: [u64 header length][JSON header][data]. Inputs whose
first byte is odd are taken as a header alone, wrapped in a correct length
prefix and a data section, so mutations work on the JSON instead of mostly
breaking the prefix.

Documented error: ValueError (std::invalid_argument naming the file and tensor).
Oracle: every accepted tensor lies inside the data section with exactly
itemsize * prod(shape) bytes; and where the header is JSON both readers take,
the C++ verdict (accept or reject) equals ``accepts`` below, a Python model of
the rules (which also gives atheris its coverage signal: the C++ code is not
instrumented).
"""
from __future__ import annotations

import json
import math
import struct

from ssd import _C

DOCUMENTED = (ValueError,)
MAX_HEADER = 100_000_000
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
            "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8}


def as_file(data: bytes) -> bytes:
    if not data or data[0] % 2 == 0:
        return data
    header, pad = data[1:], data[0] // 2  # data section of 0..127 bytes
    return struct.pack("<Q", len(header)) + header + bytes(pad)


def _reject_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def python_header(header: bytes):
    """The header as the C++ JSON reader would read it, or None where the two readers may differ."""
    try:
        return json.loads(header.decode("utf-8"), object_pairs_hook=_reject_duplicates,
                          parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _dtype(entry: dict) -> str | None:
    dtype = entry.get("dtype")
    return dtype if isinstance(dtype, str) and dtype in ITEMSIZE else None


def accepts(root, data_size: int) -> bool:
    """The rules of read_header on a parsed header, in Python."""
    if not isinstance(root, dict):
        return False
    for name, entry in root.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                return False
            continue
        if not isinstance(entry, dict) or _dtype(entry) is None:
            return False
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(_int(d) and d >= 0 for d in shape):
            return False
        size = ITEMSIZE[entry["dtype"]] * math.prod(shape)
        if size >= 2**64:
            return False
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_int(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            return False
        if offsets[1] - offsets[0] != size or offsets[1] > data_size:
            return False
    return True


def _overflows_on_the_way(root) -> bool:
    """A shape whose byte count passes 2**64 before a later 0 dim brings it back: C++ stops at the overflow."""
    for name, entry in root.items():
        if name == "__metadata__" or not isinstance(entry, dict) or _dtype(entry) is None:
            continue
        shape = entry.get("shape")
        if isinstance(shape, list) and all(_int(d) and d >= 0 for d in shape):
            size = ITEMSIZE[entry["dtype"]]
            for d in shape:
                if d and size * d >= 2**64:
                    return True
                size *= d
    return False


def test_one_input(data: bytes) -> None:
    file = as_file(data)
    try:
        data_start, tensors = _C.testing.parse_safetensors(file)
    except DOCUMENTED:
        data_start, tensors = None, None
    if tensors is not None:
        data_size = len(file) - data_start
        for name, (dtype, itemsize, shape, begin, end) in tensors.items():
            assert ITEMSIZE[dtype] == itemsize, (name, dtype)
            assert 0 <= begin <= end <= data_size, (name, begin, end, data_size)
            assert end - begin == itemsize * math.prod(shape), (name, shape, begin, end)
    if len(file) < 8:
        return
    (n,) = struct.unpack("<Q", file[:8])
    if n > min(MAX_HEADER, len(file) - 8):
        assert tensors is None, "accepted a header length past the end of the file"
        return
    header = file[8:8 + n]
    root = python_header(header)
    try:
        _C.testing.parse_json(header)
        cpp_json_ok = True
    except DOCUMENTED:
        cpp_json_ok = False
    if root is None or not cpp_json_ok or (isinstance(root, dict) and _overflows_on_the_way(root)):
        return
    expected = accepts(root, len(file) - 8 - n)
    assert (tensors is not None) == expected, f"C++ {'accepted' if tensors is not None else 'rejected'} {header!r}"


def _file(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _header_only(header: dict, pad: int = 16) -> bytes:
    return bytes([2 * pad + 1]) + json.dumps(header).encode()


def seeds() -> list[bytes]:
    two = {"__metadata__": {"format": "pt"},
           "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
           "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
    out = [_file(two, bytes(22)), _file({}, b""), _header_only(two, pad=22), _header_only({"__metadata__": {}})]
    for dtype, size in ITEMSIZE.items():
        out.append(_header_only({"t": {"dtype": dtype, "shape": [1, 2], "data_offsets": [2, 2 + 2 * size]}}, pad=20))
    out.append(_header_only({"z": {"dtype": "F64", "shape": [0, 7], "data_offsets": [5, 5]}}, pad=5))
    out.append(_header_only({"s": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}}, pad=1))
    return out


DICTIONARY = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"BF16"', '"F8_E4M3"', '"U64"',
              '[0, 0]', '[]', '18446744073709551615', '9223372036854775807', '-1', '4611686018427387904']
