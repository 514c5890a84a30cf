"""ssd.models: HF directories, GGUF files, tokenizers, and the errors for bad inputs.

Reference for every check is transformers itself: tiny random models saved
with ``save_pretrained``, tiny GGUF files written with ``gguf.GGUFWriter`` and
loaded back by transformers (``gguf_file=``), and the real SmolLM2-135M GGUF.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models as tk_models
from tokenizers import pre_tokenizers, trainers

from ssd.assets import smollm2_gguf_path
from ssd.models import (
    ChatTemplateError,
    LoadedModel,
    ModelConfig,
    ModelLoadError,
    RopeScaling,
    Tokenizer,
    load,
)
from ssd.models.gguf_loader import unpermute_rope_rows
from tests.reference.gguf_files import CHATML, llamacpp_permute, write_tiny_gguf
from tests.reference.tiny_models import edit_json

TEXTS = [
    "Hello world",
    "12345 + 678 = 99 and 3.14159, 2024-01-01",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(10))",
    "héllo naïve café — 日本語のテキスト 🙂👍🏽",
    "  leading  and trailing spaces \r\n",
    "I'm sure you're right, they'll see we've done it",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


# ---------------------------------------------------------------- helpers


def tiny_hf_config(arch: str = "llama", **overrides) -> transformers.PretrainedConfig:
    """A small Llama/Qwen3 config: GQA (4 heads, 2 kv heads), 2 layers."""
    fields = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5)
    fields.update(overrides)
    if arch == "qwen3":
        fields.setdefault("head_dim", 24)  # explicit, != hidden / heads
        return transformers.Qwen3Config(**fields)
    return transformers.LlamaConfig(**fields)


def tiny_hf_model(config: transformers.PretrainedConfig) -> torch.nn.Module:
    """A random model for ``config``; norms randomised too so mix-ups show."""
    torch.manual_seed(0)
    cls = transformers.Qwen3ForCausalLM if config.model_type == "qwen3" else transformers.LlamaForCausalLM
    model = cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def save_tiny_hf(directory: Path, arch: str = "llama", shard_size: str | None = None,
                 **overrides) -> dict[str, torch.Tensor]:
    """Save a tiny random model to ``directory``; return its state dict."""
    model = tiny_hf_model(tiny_hf_config(arch, **overrides))
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def expected_weights(state_dict: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The weights ``load`` should return: the state dict without a tied ``lm_head``."""
    return {k: v for k, v in state_dict.items() if not (tied and k == "lm_head.weight")}


def assert_weights_equal(model: LoadedModel, expected: dict[str, torch.Tensor],
                         dtype: torch.dtype = torch.float32) -> None:
    """Same names; every tensor contiguous, of ``dtype``, equal to ``expected`` cast to it."""
    assert set(model.weights) == set(expected)
    for name, want in expected.items():
        got = model.weights[name]
        assert got.dtype == dtype, name
        assert got.is_contiguous(), name
        assert torch.equal(got, want.to(dtype)), name


def assert_config_matches(config: ModelConfig, hf: transformers.PretrainedConfig) -> None:
    """``ModelConfig`` fields equal transformers' config values."""
    assert config.vocab_size == hf.vocab_size
    assert config.hidden_size == hf.hidden_size
    assert config.intermediate_size == hf.intermediate_size
    assert config.num_layers == hf.num_hidden_layers
    assert config.num_heads == hf.num_attention_heads
    assert config.num_kv_heads == hf.num_key_value_heads
    assert config.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert config.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert config.rope_theta == pytest.approx(hf.rope_parameters["rope_theta"])
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.max_position_embeddings == hf.max_position_embeddings


# --------------------------------------------------------- tiny GGUF files

def train_byte_bpe() -> dict:
    """A small byte-level BPE (tokens, merges, types) with ChatML control tokens."""
    backend = BackendTokenizer(tk_models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [text * 3 for text in TEXTS] + ["the quick brown fox jumps over the lazy dog"] * 5
    backend.train_from_iterator(corpus, trainer)
    model = json.loads(backend.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if t.startswith("<|") and t.endswith("|>") else 1 for t in tokens]
    return {"tokens": tokens, "merges": merges, "types": types}


def transformers_gguf_state(path: Path) -> dict[str, torch.Tensor]:
    """State dict transformers builds from a GGUF file."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return {name: t.detach() for name, t in model.state_dict().items()}


@pytest.fixture(scope="session")
def byte_bpe() -> dict:
    return train_byte_bpe()


@pytest.fixture(scope="session")
def tiny_llama_gguf(tmp_path_factory, byte_bpe) -> tuple[Path, transformers.PretrainedConfig, dict]:
    """(path, hf config, state dict) of an untied tiny llama GGUF with a tokenizer."""
    config = tiny_hf_config("llama", vocab_size=len(byte_bpe["tokens"]), head_dim=16)
    state = tiny_hf_model(config).state_dict()
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", config, state, byte_bpe)
    return path, config, state


# ------------------------------------------------------ HF directories: ok


def test_hf_llama_untied(tmp_path):
    state = save_tiny_hf(tmp_path)
    model = load(tmp_path)
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert isinstance(model, LoadedModel)
    assert model.config.architecture == "LlamaForCausalLM"
    assert_config_matches(model.config, hf_config)
    assert model.config.rope_scaling is None and not model.config.qk_norm
    assert "lm_head.weight" in model.weights
    assert_weights_equal(model, expected_weights(state, tied=False))
    assert model.source == str(tmp_path) and model.name == tmp_path.name
    assert model.eos_token_ids == [2] and model.bos_token_id == 1


def test_hf_llama_tied(tmp_path):
    state = save_tiny_hf(tmp_path, tie_word_embeddings=True)
    model = load(str(tmp_path))
    assert model.config.tie_word_embeddings
    assert "lm_head.weight" not in model.weights
    assert_weights_equal(model, expected_weights(state, tied=True))


def test_hf_qwen3_sharded(tmp_path):
    state = save_tiny_hf(tmp_path, arch="qwen3", shard_size="20KB", tie_word_embeddings=True)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    model = load(tmp_path)
    config = model.config
    assert config.architecture == "Qwen3ForCausalLM"
    assert config.qk_norm and config.head_dim == 24
    assert_config_matches(config, transformers.AutoConfig.from_pretrained(tmp_path))
    assert model.weights["model.layers.1.self_attn.q_norm.weight"].shape == (24,)
    assert model.weights["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 24, 64)
    assert_weights_equal(model, expected_weights(state, tied=True))


def test_hf_llama3_rope_scaling(tmp_path):
    save_tiny_hf(tmp_path, rope_scaling=dict(LLAMA3_ROPE), rope_theta=500000.0)
    config = load(tmp_path).config
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=64)


def test_hf_legacy_config_layout(tmp_path):
    """Pre-transformers-5 configs: top-level rope_theta, rope_scaling with "type", no head_dim."""
    save_tiny_hf(tmp_path)
    legacy_rope = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"} | {"type": "llama3"}
    edit_json(tmp_path / "config.json", rope_parameters=..., head_dim=..., rope_theta=250000.0,
              rope_scaling=legacy_rope)
    config = load(tmp_path).config
    assert config.head_dim == 16 and config.rope_theta == 250000.0
    assert config.rope_scaling.factor == 8.0


def test_hf_attention_bias(tmp_path):
    state = save_tiny_hf(tmp_path, attention_bias=True)
    model = load(tmp_path)
    assert model.config.attention_bias
    assert model.weights["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    assert_weights_equal(model, expected_weights(state, tied=False))


def test_hf_bfloat16(tmp_path):
    state = save_tiny_hf(tmp_path)
    model = load(tmp_path, dtype=torch.bfloat16)
    assert_weights_equal(model, expected_weights(state, tied=False), dtype=torch.bfloat16)
    assert load(tmp_path, dtype="bfloat16").weights["model.norm.weight"].dtype == torch.bfloat16


def test_hf_without_tokenizer(tmp_path):
    save_tiny_hf(tmp_path)
    model = load(tmp_path)
    assert model.tokenizer is None and model.chat_template is None
    with pytest.raises(ModelLoadError, match=r"no tokenizer files \(tokenizer\.json\)"):
        model.require_tokenizer()


def test_hf_tokenizer_and_eos_union(tmp_path, smollm2):
    """tokenizer.json + tokenizer_config + generation_config: eos ids merged in order."""
    save_tiny_hf(tmp_path)
    smollm2.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>",
        "eos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},  # id 0
        "chat_template": CHATML,  # ends a turn with <|im_end|>, id 2
    }))
    edit_json(tmp_path / "config.json", eos_token_id=7)
    edit_json(tmp_path / "generation_config.json", eos_token_id=[5, 7])
    model = load(tmp_path)
    assert model.eos_token_ids == [5, 7, 0, 2]
    tokenizer = model.require_tokenizer()
    assert model.chat_template == CHATML and tokenizer.eos_token_id == 0
    assert tokenizer.encode(TEXTS[2]) == smollm2.tokenizer.encode(TEXTS[2])
    messages = [{"role": "user", "content": "Hi there"}]
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.apply_chat_template(messages) == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------- HF directories: errors


def test_error_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load(tmp_path / "nope")
    assert "nope" in str(info.value)


def test_error_not_a_model_file(tmp_path):
    path = tmp_path / "weights.txt"
    path.write_text("hello")
    with pytest.raises(ModelLoadError, match="neither a model directory"):
        load(path)


def test_error_no_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json") as info:
        load(tmp_path)
    assert str(tmp_path) in str(info.value)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="model.gguf"):  # hints at the GGUF file
        load(tmp_path)


@pytest.mark.parametrize("architecture", ["GemmaForCausalLM", "GPT2LMHeadModel"])
def test_error_unsupported_architecture(tmp_path, architecture):
    save_tiny_hf(tmp_path)
    edit_json(tmp_path / "config.json", architectures=[architecture])
    with pytest.raises(ModelLoadError, match=architecture) as info:
        load(tmp_path)
    assert "LlamaForCausalLM" in str(info.value) and "Qwen3ForCausalLM" in str(info.value)


def test_error_invalid_config_json(tmp_path):
    save_tiny_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json"):
        load(tmp_path)


def test_error_config_missing_key(tmp_path):
    save_tiny_hf(tmp_path)
    edit_json(tmp_path / "config.json", hidden_size=...)
    with pytest.raises(ModelLoadError, match="hidden_size"):
        load(tmp_path)


def test_error_unsupported_rope_type(tmp_path):
    save_tiny_hf(tmp_path)
    edit_json(tmp_path / "config.json", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                         "rope_theta": 10000.0})
    with pytest.raises(ModelLoadError, match="yarn"):
        load(tmp_path)


def test_error_truncated_safetensors(tmp_path):
    save_tiny_hf(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load(tmp_path)


def test_error_garbage_safetensors(tmp_path):
    save_tiny_hf(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load(tmp_path)


def test_error_missing_tensor(tmp_path):
    save_tiny_hf(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load(tmp_path)


def test_error_untied_without_lm_head(tmp_path):
    save_tiny_hf(tmp_path, tie_word_embeddings=True)
    edit_json(tmp_path / "config.json", tie_word_embeddings=False)
    with pytest.raises(ModelLoadError, match=r"lm_head\.weight"):
        load(tmp_path)


def test_error_wrong_shape(tmp_path):
    save_tiny_hf(tmp_path)
    edit_json(tmp_path / "config.json", intermediate_size=100)
    with pytest.raises(ModelLoadError, match=r"gate_proj\.weight has shape"):
        load(tmp_path)


def test_error_missing_shard(tmp_path):
    save_tiny_hf(tmp_path, shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=shard.name):
        load(tmp_path)


def test_error_no_weights(tmp_path):
    save_tiny_hf(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load(tmp_path)


def test_error_bad_dtype_and_device(tmp_path):
    save_tiny_hf(tmp_path)
    with pytest.raises(ModelLoadError, match="dtype"):
        load(tmp_path, dtype=torch.float16)
    with pytest.raises(ModelLoadError, match="device"):
        load(tmp_path, device="not-a-device")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hf_to_cuda_bfloat16(tmp_path):
    state = save_tiny_hf(tmp_path, arch="qwen3")
    model = load(tmp_path, device="cuda", dtype=torch.bfloat16)
    for name, tensor in model.weights.items():
        assert tensor.is_cuda and tensor.dtype == torch.bfloat16 and tensor.is_contiguous(), name
        assert torch.equal(tensor.cpu(), state[name].to(torch.bfloat16)), name


# ---------------------------------------------------------- tiny GGUF files


def test_unpermute_inverts_llamacpp_permute():
    weight = torch.randn(3 * 8, 5)
    permuted = llamacpp_permute(weight, 3)
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_rope_rows(permuted, 3), weight)
    bias = torch.randn(3 * 8)
    assert torch.equal(unpermute_rope_rows(llamacpp_permute(bias, 3), 3), bias)


def test_gguf_tiny_llama_matches_hf_and_transformers(tiny_llama_gguf):
    path, hf_config, state = tiny_llama_gguf
    model = load(path)
    assert_config_matches(model.config, hf_config)
    assert model.config.architecture == "LlamaForCausalLM" and not model.config.tie_word_embeddings
    assert model.name == "tiny-llama"
    assert_weights_equal(model, expected_weights(state, tied=False))  # Q/K un-permuted exactly
    reference = transformers_gguf_state(path)
    assert_weights_equal(model, expected_weights(reference, tied=False))


def test_gguf_tiny_qwen3_tied(tmp_path, byte_bpe):
    # head_dim 128: transformers ignores qwen3.attention.key_length and assumes 128
    config = tiny_hf_config("qwen3", vocab_size=len(byte_bpe["tokens"]), tie_word_embeddings=True,
                            head_dim=128)
    state = tiny_hf_model(config).state_dict()
    path = write_tiny_gguf(tmp_path / "tiny-qwen3.gguf", config, state, byte_bpe, pre="qwen2")
    model = load(path)
    assert model.config.architecture == "Qwen3ForCausalLM"
    assert model.config.qk_norm and model.config.head_dim == 128 and model.config.tie_word_embeddings
    assert_config_matches(model.config, config)
    assert_weights_equal(model, expected_weights(state, tied=True))
    assert_weights_equal(model, expected_weights(transformers_gguf_state(path), tied=True))


def test_gguf_bfloat16(tiny_llama_gguf):
    path, _, state = tiny_llama_gguf
    model = load(path, dtype=torch.bfloat16)
    assert_weights_equal(model, expected_weights(state, tied=False), dtype=torch.bfloat16)


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama-bpe", "qwen2"])
def test_gguf_tokenizer_matches_transformers(tmp_path, byte_bpe, tiny_llama_gguf, pre):
    _, config, state = tiny_llama_gguf
    path = write_tiny_gguf(tmp_path / "tok.gguf", config, state, byte_bpe, pre=pre)
    ours = load(path).require_tokenizer()
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == text
        if pre == "smollm" and any(c.isdigit() for c in text):
            # SmolLM2's tokenizer splits digits one by one; transformers' GGUF
            # tokenizer does not (it only differs for vocabularies with digit merges).
            digits = [ours.decode([i]) for i in ids if ours.decode([i]).strip().isdigit()]
            assert digits and all(len(d.strip()) == 1 for d in digits)
            continue
        assert ids == reference.encode(text, add_special_tokens=False), (pre, text)


def test_gguf_eos_includes_chat_turn_end(tmp_path, byte_bpe, tiny_llama_gguf):
    """Metadata naming <|im_start|> as eos still stops at the template's <|im_end|>."""
    _, config, state = tiny_llama_gguf
    tokens = byte_bpe["tokens"]
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    path = write_tiny_gguf(tmp_path / "a.gguf", config, state, byte_bpe, eos="<|im_start|>")
    model = load(path)
    assert model.eos_token_ids == [start, end]
    assert model.tokenizer.chat_turn_end_token() == "<|im_end|>"
    plain = write_tiny_gguf(tmp_path / "b.gguf", config, state, byte_bpe, eos="<|im_start|>",
                            chat_template=None)
    assert load(plain).eos_token_ids == [start]


def test_gguf_without_tokenizer(tmp_path, tiny_llama_gguf):
    _, config, state = tiny_llama_gguf
    model = load(write_tiny_gguf(tmp_path / "bare.gguf", config, state, None))
    assert model.tokenizer is None and model.eos_token_ids == []
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        model.require_tokenizer()


def test_gguf_error_truncated(tmp_path, tiny_llama_gguf):
    path = tmp_path / "cut.gguf"
    data = tiny_llama_gguf[0].read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        load(path)


def test_gguf_error_missing_tensor(tmp_path, tiny_llama_gguf):
    _, config, state = tiny_llama_gguf
    path = write_tiny_gguf(tmp_path / "m.gguf", config, state, None,
                           drop=("model.layers.1.mlp.down_proj.weight",))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        load(path)


def test_gguf_error_unsupported_architecture(tmp_path, tiny_llama_gguf):
    _, config, state = tiny_llama_gguf
    path = write_tiny_gguf(tmp_path / "f.gguf", config, state, None, arch="falcon")
    with pytest.raises(ModelLoadError, match="falcon") as info:
        load(path)
    assert "llama" in str(info.value)


def test_gguf_error_rope_freqs(tmp_path, tiny_llama_gguf):
    _, config, state = tiny_llama_gguf
    path = write_tiny_gguf(tmp_path / "r.gguf", config, state, None,
                           extra_tensors={"rope_freqs.weight": np.ones(7, dtype=np.float32)})  # not head_dim / 2
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        load(path)


def test_gguf_error_unsupported_pre_tokenizer(tmp_path, byte_bpe, tiny_llama_gguf):
    _, config, state = tiny_llama_gguf
    path = write_tiny_gguf(tmp_path / "p.gguf", config, state, byte_bpe, pre="made-up")
    with pytest.raises(ModelLoadError, match="made-up"):
        load(path)


# ------------------------------------------------------ chat templates


def template_tokenizer(template: str | None, specials: tuple[str, ...] = (),
                       **tokens: str) -> Tokenizer:
    """A Tokenizer with an empty BPE vocabulary plus ``specials``, for template tests."""
    backend = BackendTokenizer(tk_models.BPE())
    backend.add_special_tokens(list(specials))
    return Tokenizer(backend, chat_template=template, source="test", **tokens)


LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
EOS_STYLE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
             "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")


@pytest.mark.parametrize(("template", "specials", "expected"), [
    (CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    (LLAMA3_STYLE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>"),
    (EOS_STYLE, ("</s>",), "</s>"),
    (CHATML, (), None),  # <|im_end|> is not a special token here
    ("{{ raise_exception('no assistant turns') }}", ("<|im_end|>",), None),
    (None, ("<|im_end|>",), None),
])
def test_chat_turn_end_token(template, specials, expected):
    tokenizer = template_tokenizer(template, specials, bos_token="<s>", eos_token="</s>")
    assert tokenizer.chat_turn_end_token() == expected


def test_chat_template_helpers():
    template = ("{{ bos_token }}{% for m in messages %}{% generation %}{{ m | tojson }}{% endgeneration %}"
                "{% endfor %}{% if tools is none %} no-tools{% endif %}"
                "{% if messages | length > 1 %}{{ raise_exception('only one message') }}{% endif %}")
    tokenizer = template_tokenizer(template, bos_token="<s>")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "a<b & é"}])
    assert rendered == '<s>{"role": "user", "content": "a<b & é"} no-tools'
    with pytest.raises(ChatTemplateError, match="only one message"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}] * 2)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        template_tokenizer("{% for %}").apply_chat_template([])
    with pytest.raises(ModelLoadError, match="no chat template"):
        template_tokenizer(None).apply_chat_template([])


# ------------------------------------------------------- real SmolLM2 GGUF


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> LoadedModel:
    return load(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_reference_tokenizer(smollm2_path):
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_path.parent),
                                                      gguf_file=smollm2_path.name)


def test_smollm2_config(smollm2):
    config = smollm2.config
    assert config == ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576,
        intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None, tie_word_embeddings=True,
        max_position_embeddings=8192)
    assert smollm2.name == "SmolLM2-135M-Instruct.Q4_1"


def test_smollm2_weights_match_transformers(smollm2, smollm2_path):
    reference = transformers_gguf_state(smollm2_path)
    assert torch.equal(reference["lm_head.weight"], reference["model.embed_tokens.weight"])
    assert_weights_equal(smollm2, expected_weights(reference, tied=True))


def test_smollm2_tokenizer_matches_transformers(smollm2, smollm2_reference_tokenizer):
    tokenizer = smollm2.require_tokenizer()
    assert isinstance(tokenizer, Tokenizer) and tokenizer.vocab_size == 49152
    messages = [{"role": "user", "content": "Write a function that adds 2 numbers."},
                {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
                {"role": "user", "content": "Now multiply 12 by 34 ✓"}]
    prompt = tokenizer.apply_chat_template(messages)
    for text in [*TEXTS, prompt]:
        ids = tokenizer.encode(text)
        assert ids == smollm2_reference_tokenizer.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.encode("12345") == [33, 34, 35, 36, 37]  # digits one by one
    assert tokenizer.encode("<|im_end|>") == [2]
    assert tokenizer.decode([19556, 2, 905]) == "Hello world"  # special tokens skipped


def test_smollm2_chat_template_and_special_ids(smollm2, smollm2_reference_tokenizer):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}]
    prompt = smollm2.require_tokenizer().apply_chat_template(messages)
    assert prompt == smollm2_reference_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert 2 in smollm2.eos_token_ids  # <|im_end|>
    assert smollm2.bos_token_id == 1
    assert smollm2.chat_template is not None and "<|im_end|>" in smollm2.chat_template
