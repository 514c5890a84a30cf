"""Tiny GGUF files written as llama.cpp's converter (convert_hf_to_gguf.py) lays them out:
its tensor names, its Q/K row permutation (llama), F32 tensors, and optionally a
byte-level BPE tokenizer in the metadata."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

from tests.reference.kquants import K_TYPES, quantize_k

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llamacpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to Q/K rows: per head, halves interleaved."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, 2, half, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


_GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's name for a HF parameter."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_BLOCK_NAMES[module]}.{kind}"


def write_tiny_gguf(path: Path, hf_config: transformers.PretrainedConfig,
                    state_dict: dict[str, torch.Tensor], bpe: dict | None = None, *,
                    arch: str | None = None, pre: str = "smollm", eos: str = "<|im_end|>",
                    chat_template: str | None = CHATML, drop: tuple[str, ...] = (),
                    extra_tensors: dict[str, np.ndarray] | None = None,
                    sliding_window: int | None = None, types: dict[str, str] | None = None) -> Path:
    """Write a GGUF (F32 tensors) the way llama.cpp's converter lays it out: `bpe` a byte-level
    BPE tokenizer (train_byte_bpe in tests/models/test_loading.py) or None for none. `types`:
    HF name -> ggml type name ("Q4_0", "F16", ...) of tensors stored otherwise, quantized
    by gguf-py from their (permuted) fp32 values."""
    arch = arch or hf_config.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(hf_config.num_hidden_layers)
    writer.add_context_length(hf_config.max_position_embeddings)
    writer.add_embedding_length(hf_config.hidden_size)
    writer.add_feed_forward_length(hf_config.intermediate_size)
    writer.add_head_count(hf_config.num_attention_heads)
    writer.add_head_count_kv(hf_config.num_key_value_heads)
    writer.add_rope_freq_base(hf_config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(hf_config.rms_norm_eps)
    writer.add_vocab_size(hf_config.vocab_size)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    if bpe is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(bpe["tokens"])
        writer.add_token_types(bpe["types"])
        writer.add_token_merges(bpe["merges"])
        writer.add_bos_token_id(bpe["tokens"].index("<|im_start|>"))
        writer.add_eos_token_id(bpe["tokens"].index(eos))
        writer.add_add_bos_token(False)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
    for name, tensor in state_dict.items():
        if name == "lm_head.weight" and hf_config.tie_word_embeddings:
            continue
        if name in drop:
            continue
        if arch == "llama" and ".q_proj." in name:
            tensor = llamacpp_permute(tensor, hf_config.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            tensor = llamacpp_permute(tensor, hf_config.num_key_value_heads)
        array = tensor.float().numpy().copy()
        kind = (types or {}).get(name)
        if kind is None:
            writer.add_tensor(gguf_tensor_name(name), array)
        else:
            qtype = getattr(gguf.GGMLQuantizationType, kind)
            blocks = quantize_k(array, kind) if kind in K_TYPES else gguf.quants.quantize(array, qtype)
            writer.add_tensor(gguf_tensor_name(name), blocks, raw_dtype=qtype)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
