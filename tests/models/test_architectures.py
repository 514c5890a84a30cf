"""Qwen2, Mistral (sliding-window attention) and llama.cpp's ``rope_freqs``:
HuggingFace directories and GGUF files load to logits that match transformers.

Each model is a random tiny checkpoint written by transformers
(tests/reference/tiny_models.py); a GGUF file is written here from the same
weights the way llama.cpp's converter (``convert_hf_to_gguf.py``) lays it out,
and scored against transformers on the HF model.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

import ssd.models
from ssd import LLM, SamplingParams
from ssd.models import ModelLoadError
from tests.reference.gguf_files import write_tiny_gguf
from tests.reference.tiny_models import TinySpec, build_tiny_model, edit_json, hf_logits, random_tokens

NUM_TOKENS = 48  # three 16-token KV blocks
TOLERANCE = 1e-4
BACKENDS = [pytest.param("cpu", "auto", id="cpu"), pytest.param("cpu", "aten", id="aten"),
            pytest.param("cuda", "auto", id="cuda", marks=pytest.mark.cuda)]

QWEN2 = TinySpec(arch="qwen2", num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True, seed=41)
QWEN2_UNTIED = TinySpec(arch="qwen2", hidden_size=72, num_heads=6, num_kv_heads=2, head_dim=12, seed=42)
MISTRAL = TinySpec(arch="mistral", num_heads=4, num_kv_heads=2, sliding_window=5, seed=43)
LLAMA3 = TinySpec(arch="llama", num_heads=4, num_kv_heads=2, head_dim=16, llama3_rope=True, seed=44)


def max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return (got - want).abs().max().item()


def assert_matches(model: ssd.models.LoadedModel, hf_model, tokens: list[int],
                   device: str = "cpu", backend: str = "auto") -> torch.Tensor:
    want = hf_logits(hf_model, tokens)
    assert want.std().item() > 0.5  # random weights give logits of std ~1
    got = model.logits(tokens, device, backend)
    diff = max_diff(got, want)
    assert diff <= TOLERANCE, f"max |ssd - transformers| = {diff:.3g}"
    return got


# ------------------------------------------------------- GGUF as llama.cpp writes it

def llamacpp_rope_freqs(rope: dict, head_dim: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's llama3 ``rope_freqs`` tensor: a divisor per rotary frequency."""
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            factors.append(1)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def write_gguf(path: Path, arch: str, hf_model, *, sliding_window: int | None = None,
               extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """The HF model as a GGUF file of F32 tensors (no tokenizer), laid out as llama.cpp does."""
    return write_tiny_gguf(path, hf_model.config, {n: t.detach() for n, t in hf_model.state_dict().items()},
                           arch=arch, chat_template=None, sliding_window=sliding_window,
                           extra_tensors={n: t.numpy() for n, t in (extra_tensors or {}).items()})


# ------------------------------------------------------------------ Qwen2


@pytest.fixture(scope="module", params=[QWEN2, QWEN2_UNTIED], ids=lambda s: s.describe())
def qwen2(request, tmp_path_factory):
    return build_tiny_model(request.param, tmp_path_factory.mktemp("qwen2"))


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_qwen2_hf_dir_matches_transformers(qwen2, device, backend):
    model_dir, hf_model = qwen2
    model = ssd.models.load(model_dir)
    assert model.config.architecture == "Qwen2ForCausalLM"
    assert model.config.qkv_bias and not model.config.attention_bias
    assert "model.layers.0.self_attn.q_proj.bias" in model.weights
    assert "model.layers.0.self_attn.o_proj.bias" not in model.weights
    assert model.config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert_matches(model, hf_model, random_tokens(NUM_TOKENS, 256, seed=1), device, backend)


def test_qwen2_gguf_matches_transformers(qwen2, tmp_path):
    _, hf_model = qwen2
    path = write_gguf(tmp_path / "qwen2.gguf", "qwen2", hf_model)
    model = ssd.models.load(path)
    assert model.config.architecture == "Qwen2ForCausalLM"
    assert model.config.qkv_bias and not model.config.attention_bias
    assert model.config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert_matches(model, hf_model, random_tokens(NUM_TOKENS, 256, seed=2))


def test_qwen2_sliding_window_on_every_layer(tmp_path):
    """use_sliding_window with max_window_layers 0 windows every layer, as transformers does."""
    model_dir, hf_model = build_tiny_model(QWEN2.replace(sliding_window=6), tmp_path)
    model = ssd.models.load(model_dir)
    assert model.config.sliding_window == 6
    assert_matches(model, hf_model, random_tokens(NUM_TOKENS, 256, seed=3))


@pytest.mark.parametrize("edit", [
    dict(layer_types=..., max_window_layers=1),
    dict(layer_types=["full_attention", "sliding_attention"]),
], ids=["max_window_layers", "layer_types"])
def test_qwen2_sliding_window_on_some_layers_is_refused(tmp_path, edit):
    build_tiny_model(QWEN2.replace(sliding_window=6), tmp_path)
    edit_json(tmp_path / "config.json", **edit)
    with pytest.raises(ModelLoadError, match="use_sliding_window.*1 of 2 layers"):
        ssd.models.load(tmp_path)


def test_qwen2_without_use_sliding_window_attends_to_all_keys(tmp_path):
    """A released Qwen2.5 config: a sliding_window value, but use_sliding_window false."""
    model_dir, hf_model = build_tiny_model(QWEN2, tmp_path)
    edit_json(model_dir / "config.json", sliding_window=4, max_window_layers=1, layer_types=...)
    model = ssd.models.load(model_dir)
    assert model.config.sliding_window == 0
    assert_matches(model, hf_model, random_tokens(NUM_TOKENS, 256, seed=4))


# ------------------------------------------------------------------ Mistral


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return build_tiny_model(MISTRAL, tmp_path_factory.mktemp("mistral"))


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_mistral_sliding_window_matches_transformers(mistral, device, backend):
    model_dir, hf_model = mistral
    model = ssd.models.load(model_dir)
    assert model.config.architecture == "MistralForCausalLM"
    assert model.config.sliding_window == 5
    tokens = random_tokens(24, 256, seed=5)
    got = assert_matches(model, hf_model, tokens, device, backend)
    # The window matters: without it transformers answers otherwise from position 5 on.
    unwindowed = build_tiny_model(MISTRAL.replace(sliding_window=0), Path(model_dir) / "full")[1]
    want_full = hf_logits(unwindowed, tokens)
    assert max_diff(got[:5], want_full[:5]) <= TOLERANCE
    assert max_diff(got[5:], want_full[5:]) > 1e-2


def test_mistral_gguf_sliding_window_matches_transformers(mistral, tmp_path):
    """A Mistral GGUF file says "llama"; its window is attention.sliding_window."""
    _, hf_model = mistral
    path = write_gguf(tmp_path / "mistral.gguf", "llama", hf_model, sliding_window=5)
    model = ssd.models.load(path)
    assert model.config.sliding_window == 5
    assert_matches(model, hf_model, random_tokens(24, 256, seed=6))


def test_mistral_greedy_sd_equals_ar(mistral, tmp_path):
    """Speculative rounds straddle the window edge: greedy sd reproduces ar token for token."""
    target_dir, _ = mistral
    draft_dir, _ = build_tiny_model(MISTRAL.replace(num_layers=1, seed=45), tmp_path / "draft")
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (1, 3, 4, 5, 6, 11)]
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    with LLM(str(target_dir), max_model_len=64) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy)]
    with LLM(str(target_dir), draft=str(draft_dir), mode="sd", adaptive=False, k=3, max_model_len=64,
             max_batch=4) as sd:
        got = [o.token_ids for o in sd.generate(prompts, greedy)]
        assert sd.stats()["rounds"] > 0
    assert got == want


# ------------------------------------------------------- llama3 rope as rope_freqs


def test_llama3_gguf_rope_freqs_matches_transformers(tmp_path):
    """llama.cpp stores llama3 rope scaling as a rope_freqs tensor and no scaling
    metadata; the file scores like transformers' llama3 model."""
    _, hf_model = build_tiny_model(LLAMA3, tmp_path / "hf")
    rope = hf_model.config.rope_parameters
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    factors = llamacpp_rope_freqs(rope, 16)
    assert factors.min() == 1 and factors.max() == 8  # both ends of the band occur
    path = write_gguf(tmp_path / "llama3.gguf", "llama", hf_model, extra_tensors={"rope_freqs.weight": factors})
    model = ssd.models.load(path)
    assert model.config.rope_scaling is None
    assert model.config.rope_freq_factors == factors.tolist()
    tokens = random_tokens(96, 256, seed=7)  # well past original_max_position_embeddings (32)
    assert_matches(model, hf_model, tokens)


def test_rope_freqs_of_the_wrong_size_is_refused(tmp_path):
    _, hf_model = build_tiny_model(LLAMA3, tmp_path / "hf")
    path = write_gguf(tmp_path / "bad.gguf", "llama", hf_model,
                      extra_tensors={"rope_freqs.weight": torch.ones(5)})
    with pytest.raises(ModelLoadError, match=r"rope_freqs\.weight has 5 values, expected head_dim / 2 = 8"):
        ssd.models.load(path)


def test_config_flags_are_checked():
    from ssd.models.config import ModelConfig
    from ssd.models.weights import check_config

    base = dict(architecture="Qwen2ForCausalLM", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                num_heads=2, num_kv_heads=1, head_dim=4)
    for fields, message in [
        (dict(attention_bias=True, qkv_bias=True), "qkv_bias: set either attention_bias"),
        (dict(sliding_window=-1), "sliding_window: must be >= 0"),
        (dict(rope_freq_factors=[1.0]), "rope_freq_factors: must hold head_dim / 2 = 2 values"),
        (dict(rope_freq_factors=[1.0, 0.0]), "rope_freq_factors: every factor must be finite and > 0"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            check_config(ModelConfig(**base, **fields), "cfg")
    check_config(ModelConfig(**base, qkv_bias=True, sliding_window=3, rope_freq_factors=[1.0, 2.0]), "cfg")
