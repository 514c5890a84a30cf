"""Tiny GGUF files for the gguf fuzz target, written with gguf.GGUFWriter (no downloads).

A file is a ``Spec``: metadata (key -> (value, GGUF type)) and tensors, so the
target can also write files whose metadata it changed structurally (wrong
types, missing keys, odd values) instead of only flipping bytes.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np

T = gguf.GGUFValueType
TOKENS = ["<|im_start|>", "<|im_end|>", "a", "b", "ab", "\u0120", "c", "\u0120ab"]
MERGES = ["a b", "\u0120 ab"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@dataclasses.dataclass
class Spec:
    metadata: dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]]
    tensors: dict[str, np.ndarray]


def spec(arch: str = "llama", tokenizer: bool = True, half: bool = False, tied: bool = False) -> Spec:
    """A one-layer model: hidden 4, 2 heads of 2, 1 kv head, vocab 8."""
    hidden, heads, kv_heads, head_dim, inter, vocab = 4, 2, 1, 2, 4, len(TOKENS)
    meta = {
        "general.architecture": (arch, T.STRING, None),
        "general.alignment": (32, T.UINT32, None),
        f"{arch}.vocab_size": (vocab, T.UINT32, None),
        f"{arch}.block_count": (1, T.UINT32, None),
        f"{arch}.context_length": (64, T.UINT32, None),
        f"{arch}.embedding_length": (hidden, T.UINT32, None),
        f"{arch}.feed_forward_length": (inter, T.UINT32, None),
        f"{arch}.attention.head_count": (heads, T.UINT32, None),
        f"{arch}.attention.head_count_kv": (kv_heads, T.UINT32, None),
        f"{arch}.attention.key_length": (head_dim, T.UINT32, None),
        f"{arch}.rope.freq_base": (10000.0, T.FLOAT32, None),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-6, T.FLOAT32, None),
    }
    if tokenizer:
        meta.update({
            "tokenizer.ggml.model": ("gpt2", T.STRING, None),
            "tokenizer.ggml.pre": ("qwen2" if arch == "qwen3" else "smollm", T.STRING, None),
            "tokenizer.ggml.tokens": (TOKENS, T.ARRAY, T.STRING),
            "tokenizer.ggml.token_type": ([3, 3, 1, 1, 1, 1, 4, 1], T.ARRAY, T.INT32),
            "tokenizer.ggml.merges": (MERGES, T.ARRAY, T.STRING),
            "tokenizer.ggml.bos_token_id": (0, T.UINT32, None),
            "tokenizer.ggml.eos_token_id": (1, T.UINT32, None),
            "tokenizer.ggml.add_bos_token": (True, T.BOOL, None),
            "tokenizer.chat_template": (CHATML, T.STRING, None),
        })
    dtype = np.float16 if half else np.float32
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    tensors = {"token_embd.weight": w(vocab, hidden), "output_norm.weight": w(hidden)}
    if not tied:
        tensors["output.weight"] = w(vocab, hidden)
    tensors.update({
        "blk.0.attn_norm.weight": w(hidden), "blk.0.ffn_norm.weight": w(hidden),
        "blk.0.attn_q.weight": w(heads * head_dim, hidden), "blk.0.attn_k.weight": w(kv_heads * head_dim, hidden),
        "blk.0.attn_v.weight": w(kv_heads * head_dim, hidden), "blk.0.attn_output.weight": w(hidden, heads * head_dim),
        "blk.0.ffn_gate.weight": w(inter, hidden), "blk.0.ffn_up.weight": w(inter, hidden),
        "blk.0.ffn_down.weight": w(hidden, inter),
    })
    if arch == "qwen3":
        tensors.update({"blk.0.attn_q_norm.weight": w(head_dim), "blk.0.attn_k_norm.weight": w(head_dim)})
    return Spec(meta, tensors)


def write(s: Spec, path: Path) -> Path:
    arch = s.metadata.get("general.architecture", ("llama",))[0]
    writer = gguf.GGUFWriter(str(path), arch if isinstance(arch, str) else "llama")
    writer.kv_data[0].clear()  # the constructor's general.architecture; the spec says what to write
    for key, (value, vtype, sub_type) in s.metadata.items():
        writer.add_key_value(key, value, vtype, sub_type)
    for name, array in s.tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def seed_specs() -> list[Spec]:
    return [spec("llama"), spec("qwen3", half=True, tied=True), spec("llama", tokenizer=False, tied=True)]
