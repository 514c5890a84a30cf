"""Logits of the C++ paged forward against transformers on the same random weights.

Every config is a random tiny checkpoint written by transformers itself
(tests/reference/tiny_models.py) and loaded back through ``ssd.models.load``,
so the comparison covers config parsing, weight naming and the forward.
"""
from __future__ import annotations

import pytest
import torch

import ssd.models
from tests.reference.tiny_models import (
    TinySpec,
    build_tiny_model,
    hf_logits,
    random_hf_model,
    random_tokens,
    round_weights_to_bf16,
)

NUM_POSITIONS = 96  # >= 64, several 16-token KV blocks
TOLERANCE = 1e-4

SPECS = [
    TinySpec(arch="llama", num_heads=4, num_kv_heads=4, seed=11),
    TinySpec(arch="llama", num_heads=4, num_kv_heads=2, tie_word_embeddings=True,
             llama3_rope=True, attention_bias=True, mlp_bias=True, seed=12),
    TinySpec(arch="llama", num_heads=8, num_kv_heads=2, head_dim=16, num_layers=3,
             llama3_rope=True, rope_theta=500000.0, rms_norm_eps=1e-5, seed=13),
    TinySpec(arch="qwen3", num_heads=4, num_kv_heads=4, seed=21),
    TinySpec(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True,
             llama3_rope=True, seed=22),
    TinySpec(arch="qwen3", hidden_size=72, num_heads=8, num_kv_heads=2, head_dim=12,
             vocab_size=300, attention_bias=True, rope_theta=1000000.0, seed=23),
    # head_dim 64 and 128: the shapes the cuda backend's own attention kernel takes
    TinySpec(arch="qwen3", hidden_size=128, num_heads=2, num_kv_heads=1, head_dim=64, seed=24),
    TinySpec(arch="llama", hidden_size=128, num_heads=2, num_kv_heads=1, head_dim=128, llama3_rope=True,
             seed=14),
]


@pytest.fixture(scope="module", params=SPECS, ids=[s.describe() for s in SPECS])
def checkpoint(request, tmp_path_factory):
    """(spec, model_dir, hf_model) for one random tiny config."""
    spec = request.param
    model_dir, hf_model = build_tiny_model(spec, tmp_path_factory.mktemp(spec.describe()))
    return spec, model_dir, hf_model


def _tokens(spec: TinySpec) -> list[int]:
    return random_tokens(NUM_POSITIONS, spec.vocab_size, seed=spec.seed + 1000)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# (device, backend): the cpu kernels, the aten reference (two implementations of
# the forward's steps on the CPU) and, with a GPU, the cuda backend.
BACKENDS = [pytest.param("cpu", "auto", id="cpu"), pytest.param("cpu", "aten", id="aten"),
            pytest.param("cuda", "auto", id="cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_fp32_logits_match_transformers(checkpoint, device, backend):
    spec, model_dir, hf_model = checkpoint
    tokens = _tokens(spec)
    expected = hf_logits(hf_model, tokens)
    got = ssd.models.load(model_dir, dtype=torch.float32).logits(tokens, device, backend)
    assert got.dtype == torch.float32
    # Random weights at std 0.15 give logits of std ~1: a 1e-4 bound is tight.
    assert expected.std().item() > 0.5
    diff = _max_diff(got, expected)
    assert diff <= TOLERANCE, f"{spec.describe()}: max |ssd - transformers| = {diff:.3g}"


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("spec", [SPECS[1], SPECS[4]], ids=lambda s: s.describe())
def test_bf16_weights_match_transformers_on_rounded_weights(spec, device, backend, tmp_path):
    """ssd stores weights in bf16 and computes in fp32, which is transformers in fp32
    on bf16-rounded weights; unrounded weights must give a visibly different answer,
    or the test would not show that the weights are really stored in bf16."""
    model_dir, hf_model = build_tiny_model(spec, tmp_path)
    tokens = _tokens(spec)
    unrounded = hf_logits(hf_model, tokens)
    round_weights_to_bf16(hf_model)
    expected = hf_logits(hf_model, tokens)
    got = ssd.models.load(model_dir, dtype=torch.bfloat16).logits(tokens, device, backend)
    diff = _max_diff(got, expected)
    assert diff <= TOLERANCE, f"{spec.describe()}: max |ssd bf16 - transformers rounded| = {diff:.3g}"
    assert _max_diff(got, unrounded) > 100 * TOLERANCE


def test_llama3_rope_scaling_is_applied(tmp_path):
    """Negative control: the same weights without rope scaling disagree with ssd,
    so the parity tests above really check the llama3 frequencies."""
    spec = SPECS[2]
    model_dir, hf_model = build_tiny_model(spec, tmp_path)
    tokens = _tokens(spec)
    got = ssd.models.load(model_dir).logits(tokens)
    unscaled = random_hf_model(spec.replace(llama3_rope=False))
    assert _max_diff(got, hf_logits(hf_model, tokens)) <= TOLERANCE
    assert _max_diff(got, hf_logits(unscaled, tokens)) > 1e-2

