"""Fuzz target: a model directory's tokenizer files (python/ssd/models/hf.py).

The first input byte picks the file the rest replaces -- tokenizer.json,
tokenizer_config.json, special_tokens_map.json, chat_template.json or
chat_template.jinja -- in a directory whose other files are a small valid
tokenizer's. The directory is loaded the way ssd.models.load reads it
(``load_tokenizer_files``), then the tokenizer encodes, decodes, finds its eos
ids and renders the chat template, as ``LLM.chat`` would.

Documented errors: ModelLoadError (loading the files), ChatTemplateError
(rendering). Anything else, a hang over 5 s or a crash of the tokenizers
library is a crash.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ssd.models import ChatTemplateError, ModelLoadError
from ssd.models.hf import load_tokenizer_files
from ssd.models.loaded import end_of_sequence_ids
from tests.fuzz.tokenizer_files import FILES, TEXT, default_files

DOCUMENTED = (ModelLoadError, ChatTemplateError)

_ROOT = Path(tempfile.mkdtemp(prefix="ssd-fuzz-tokenizer-"))  # under $TMPDIR: the pytest run removes it
_DEFAULTS = default_files()
_DIRS = []
for _name in FILES:  # one directory per fuzzed file; the others keep the defaults
    _dir = _ROOT / _name.replace(".", "_")
    _dir.mkdir()
    for _file, _content in _DEFAULTS.items():
        if _file != "chat_template.jinja" or _name == _file:  # a .jinja file overrides every other template
            (_dir / _file).write_bytes(_content)
    _DIRS.append(_dir)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    index = data[0] % len(FILES)
    directory = _DIRS[index]
    (directory / FILES[index]).write_bytes(data[1:])
    try:
        tokenizer, _ = load_tokenizer_files(directory)
    except ModelLoadError:
        return
    if tokenizer is None:
        return
    ids = tokenizer.encode(TEXT)
    tokenizer.decode(ids, skip_special_tokens=False)
    tokenizer.encode(TEXT, add_special_tokens=True)
    if tokenizer.chat_template is not None:
        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "ab"}])
        except ChatTemplateError:
            return  # rendering again (for the eos ids) could only fail again, after up to another 2 s
    end_of_sequence_ids([], tokenizer)


def seeds() -> list[bytes]:
    return [bytes([i]) + _DEFAULTS[name] for i, name in enumerate(FILES)]


DICTIONARY = ['"model"', '"type"', '"BPE"', '"WordPiece"', '"Unigram"', '"pre_tokenizer"', '"normalizer"',
              '"post_processor"', '"decoder"', '"added_tokens"', '"special": true', '"Split"', '"Regex"',
              '"pattern"', '"ByteLevel"', '"Sequence"', '"TemplateProcessing"', '"vocab"', '"merges"', '"unk_token"',
              '"bos_token"', '"eos_token"', '"chat_template"', '"content"', '"name"', '"template"', 'null', '[]', '{}',
              '"id"', '-1', '4294967296']
