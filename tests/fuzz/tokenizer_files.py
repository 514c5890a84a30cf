"""A small valid tokenizer's files, as a HuggingFace model directory holds them (for tests/fuzz)."""
from __future__ import annotations

import json

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.json",
         "chat_template.jinja")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = "Hello ab, <|im_start|>world 12 é\n"


def _tokenizer_json() -> str:
    vocab = {t: i for i, t in enumerate(["a", "b", "ab", "\u0120", "\u0120ab", "H", "e", "l", "o", "\u0120w"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("\u0120", "ab")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return backend.to_str()


def default_files() -> dict[str, bytes]:
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "chat_template": CHATML,
              "model_max_length": 2048}
    return {
        "tokenizer.json": _tokenizer_json().encode(),
        "tokenizer_config.json": json.dumps(config).encode(),
        "special_tokens_map.json": json.dumps({"eos_token": "<|im_end|>", "pad_token": "a"}).encode(),
        "chat_template.json": json.dumps({"chat_template": [{"name": "default", "template": CHATML},
                                                            {"name": "tool_use", "template": "{{ tools }}"}]}).encode(),
        "chat_template.jinja": CHATML.encode(),
    }
