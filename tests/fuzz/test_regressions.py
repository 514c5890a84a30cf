"""The inputs the fuzz targets found crashing (or that crash the same way), fixed at their cause.

Each test fails on the code before its fix: with an exception other than the
documented one, a numpy message instead of the file's problem, or a hang.
"""
from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from ssd import _C
from ssd.models import ChatTemplateError, ModelLoadError, Tokenizer, load
from ssd.models.hf import load_tokenizer_files
from tests.fuzz import gguf_files, tokenizer_files

T = gguf_files.T


# ------------------------------------------------------------------- C++ parsers


def test_parse_json_binding_raises_value_error_at_a_byte():
    assert _C.testing.parse_json(b'{"a": [1, 2.5, "\\u00e9", null, true]}') == {"a": [1, 2.5, "é", None, True]}
    for bad in (b"", b"[1,]", b'{"a":1,"a":2}', b"NaN", b'"\\ud800"', b"\xff", b"[" * 300 + b"]" * 300):
        with pytest.raises(ValueError, match="at byte"):
            _C.testing.parse_json(bad)


def test_parse_safetensors_binding_checks_offsets():
    header = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    data = struct.pack("<Q", len(header)) + header + bytes(8)
    start, tensors = _C.testing.parse_safetensors(data)
    assert start == 8 + len(header) and tensors == {"a": ("F32", 4, [2], 0, 8)}
    with pytest.raises(ValueError, match="truncated"):
        _C.testing.parse_safetensors(data[:-1])
    with pytest.raises(ValueError, match="truncated"):
        _C.testing.parse_safetensors(data[:5])


# ----------------------------------------------------------------------- GGUF


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return gguf_files.write(gguf_files.spec("llama"), tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def edited(tmp_path: Path, **metadata) -> Path:
    spec = gguf_files.spec("llama")
    spec.metadata.update({key.replace("__", "."): value for key, value in metadata.items()})
    return gguf_files.write(spec, tmp_path / "edited.gguf")


@pytest.mark.parametrize("keep", [10, 30, 200, 1000, -8])
def test_gguf_truncated_names_the_problem(tmp_path, tiny_gguf, keep):
    """Was: numpy's "cannot reshape array of size 0" or "size must be a divisor" as the message."""
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:keep])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: the file is truncated or corrupt") as info:
        load(path)
    assert "reshape" not in str(info.value) and "divisor" not in str(info.value)


def test_gguf_array_count_past_the_end_does_not_hang(tmp_path):
    """Was an endless loop: the reader read empty items of a 2**62-item array for ever."""
    path = tmp_path / "count.gguf"
    key = b"general.architecture"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IIQ", 9, 0, 2**62))
    started = time.monotonic()
    with pytest.raises(ModelLoadError, match="truncated"):
        load(path)
    assert time.monotonic() - started < 5


def test_gguf_merge_of_unknown_tokens(tmp_path):
    """Was the tokenizers library's bare Exception ("Token `eb` out of vocabulary")."""
    path = edited(tmp_path, tokenizer__ggml__merges=(["a c"], T.ARRAY, T.STRING))
    with pytest.raises(ModelLoadError, match="cannot build the tokenizer"):
        load(path)


def test_gguf_size_beyond_int64(tmp_path):
    """Was RuntimeError: pybind11's "Unable to cast Python instance of type int"."""
    with pytest.raises(ModelLoadError, match="num_layers: must be an integer within int64"):
        load(edited(tmp_path, llama__block_count=(2**63 + 5, T.UINT64, None)))
    with pytest.raises(ModelLoadError, match="vocab_size: is too large"):
        load(edited(tmp_path, llama__embedding_length=(2**62, T.UINT64, None)))


def test_gguf_billions_of_layers_fail_fast(tmp_path):
    """Was a list of 9 weights per claimed layer built before any check: gigabytes, minutes."""
    started = time.monotonic()
    with pytest.raises(ModelLoadError, match=r"missing tensor model\.layers\.1\..* 4294967295 layers"):
        load(edited(tmp_path, llama__block_count=(2**32 - 1, T.UINT32, None)))
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("key, value, message", [
    ("general__architecture", (["llama"], T.ARRAY, T.STRING), "'general.architecture' must be a string"),
    ("tokenizer__ggml__tokens", ([1, 2], T.ARRAY, T.INT32), "must be a list of strings"),
    ("tokenizer__ggml__merges", ([3], T.ARRAY, T.INT32), "must be a list of strings"),
    ("tokenizer__ggml__bos_token_id", ("x", T.STRING, None), "'tokenizer.ggml.bos_token_id' must be an integer"),
    ("tokenizer__ggml__eos_token_id", (-3, T.INT32, None), "must be a token id"),
    ("tokenizer__ggml__eot_token_id", (2**40, T.UINT64, None), "must be a token id"),
    ("llama__rope__freq_base", ("x", T.STRING, None), "must be a number"),
    ("tokenizer__ggml__pre", (7, T.UINT8, None), "must be a string"),
    ("tokenizer__chat_template", (1.5, T.FLOAT32, None), "must be a string"),
])
def test_gguf_metadata_of_the_wrong_type(tmp_path, key, value, message):
    """Were TypeError (unhashable list, enumerate an int), AttributeError (int.split), ValueError."""
    with pytest.raises(ModelLoadError, match=message):
        load(edited(tmp_path, **{key: value}))


def test_gguf_projection_rows_not_in_heads(tmp_path):
    """Was a bare ValueError from un-permuting rows that do not split into heads."""
    spec = gguf_files.spec("llama")
    spec.tensors["blk.0.attn_q.weight"] = spec.tensors["blk.0.attn_q.weight"][:3]
    with pytest.raises(ModelLoadError, match=r"q_proj\.weight has shape \[3, 4\], expected \[4, 4\]"):
        load(gguf_files.write(spec, tmp_path / "rows.gguf"))


# ------------------------------------------------------------- tokenizer files


@pytest.fixture()
def tokenizer_dir(tmp_path) -> Path:
    for name, content in tokenizer_files.default_files().items():
        if name != "chat_template.jinja":
            (tmp_path / name).write_bytes(content)
    return tmp_path


def test_tokenizer_files_load(tokenizer_dir):
    tokenizer, template = load_tokenizer_files(tokenizer_dir)
    assert template == tokenizer_files.CHATML and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_turn_end_token() == "<|im_end|>"


def test_chat_template_jinja_not_utf8(tokenizer_dir):
    """Was UnicodeDecodeError (the fuzzer's first tokenizer crash)."""
    (tokenizer_dir / "chat_template.jinja").write_bytes(b"{% for m in messages %}\xb6{% endfor %}")
    with pytest.raises(ModelLoadError, match="chat_template.jinja"):
        load_tokenizer_files(tokenizer_dir)


def test_chat_template_list_with_odd_names(tokenizer_dir):
    """Was TypeError: unhashable type: 'list'."""
    (tokenizer_dir / "chat_template.json").write_text(
        '{"chat_template": [{"name": ["x"], "template": "a"}, {"name": "default", "template": "b"}]}')
    assert load_tokenizer_files(tokenizer_dir)[1] == "b"


def test_tokenizer_config_nested_too_deep(tokenizer_dir):
    """Was RecursionError from json.loads."""
    (tokenizer_dir / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelLoadError, match="nested too deeply"):
        load_tokenizer_files(tokenizer_dir)


# -------------------------------------------------------------- chat templates


def render(template: str) -> str:
    return Tokenizer(None, chat_template=template, source="t").apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("template, message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "within 2 s"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "size limit"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "size limit"),
    ("{% set a = 'x' * 10000000 %}{% set b %}{{ a }}{{ a }}{% endset %}", "size limit"),
    ("{% set a = 'x' * 10000000 %}{% for i in range(3) %}{{ a }}{% endfor %}", "size limit"),
    ("{{ 'a' * 10**10 }}", "size limit"),
    ("{{ 7 ** 100000000 }}", "size limit"),
    ("{{ ('x' * 1000000).replace('', 'y' * 1000000) }}", "size limit"),
    ("{{ 'a'|center(1000000000) }}", "size limit"),
    ("{{ 'a'.ljust(1000000000) }}", "size limit"),
    ("{{ '%0999999999d' % 1 }}", "size limit"),
    ("{{ '{:>999999999}'.format(1) }}", "size limit"),
    ("{{ '{:>{w}}'.format(1, w=999999999) }}", "size limit"),
    ("{{ messages|tojson(indent=1000000000) }}", "indent"),
    ("{{ range(20000)|map('string')|join('y' * 1000) }}", "size limit"),
    ("{{ ('y' * 1000).join(range(20000)|map('string')) }}", "size limit"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    ("{{" + "(" * 5000 + "1" + ")" * 5000 + "}}", "does not compile"),
])
def test_hostile_chat_templates_fail_in_bounds(template, message):
    """Were hangs, gigabyte allocations (the process killed) or a RecursionError from compiling."""
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=message):
        render(template)
    assert time.monotonic() - started < 4


def test_bounded_environment_renders_ordinary_templates():
    template = ("{{ bos_token }}{% for m in messages %}{{ m | tojson }}{{ '%s-%d'|format('x', 3) }}"
                "{{ 'a,b'|replace(',', ';') }}{{ ['a', 'b']|join(', ') }}{{ '{:>4}'.format(7) }}"
                "{{ 'ab'|center(6) }}{{ 'x' ~ 'y' }}{{ 2 ** 10 }}{% endfor %}")
    assert render(template) == '{"role": "user", "content": "hi"}x-3a;ba, b   7  ab  xy1024'
