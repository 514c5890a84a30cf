"""A tokenizer written as a HuggingFace tokenizer directory (``ssd tokenizer MODEL --out DIR``).

For clients that count tokens as the server does (load generators such as
aiperf or guidellm load ``AutoTokenizer.from_pretrained(DIR)``):

* ``tokenizer.json``: the tokenizer ssd runs, without its post-processor:
  ssd encodes a prompt without added special tokens (a chat template writes
  the ones it wants), and HuggingFace adds the post-processor's by default;
* ``tokenizer_config.json``: the generic fast-tokenizer class, the bos and eos
  tokens, no clean-up of spaces in decoding (ssd does none), and the chat template;
* ``special_tokens_map.json``: the bos and eos tokens.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import tokenizers

from .tokenizer import Tokenizer


def write_hf_tokenizer(tokenizer: Tokenizer, out: str | os.PathLike) -> list[Path]:
    """Writes the files above into ``out`` (created); returns their paths."""
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())  # a copy: the model's stays as it is
    backend.post_processor = None
    special = {k: v for k, v in (("bos_token", tokenizer.bos_token), ("eos_token", tokenizer.eos_token)) if v}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **special}
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    files = {"tokenizer.json": backend.to_str(pretty=False), "tokenizer_config.json": json.dumps(config, indent=2),
             "special_tokens_map.json": json.dumps(special, indent=2)}
    written = []
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written
