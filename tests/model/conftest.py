"""A tiny model on every backend, for the forward tests of this folder."""
from __future__ import annotations

import pytest
import torch

import ssd.models
from tests.reference.tiny_models import TinySpec, build_tiny_model

# (device, backend argument) by backend name
PLACEMENTS = {"cpu": ("cpu", "auto"), "aten": ("cpu", "aten"), "cuda": ("cuda", "auto")}
BACKENDS = ["cpu", "aten", pytest.param("cuda", marks=pytest.mark.cuda)]

# head_dim 64: the cuda backend's own attention kernel (others take its fallback)
TINY_SPEC = TinySpec(arch="qwen3", hidden_size=128, intermediate_size=160, num_heads=2, num_kv_heads=1,
                     head_dim=64, vocab_size=300, num_layers=2, seed=41)


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    """TINY_SPEC's model, fp32."""
    model_dir, _ = build_tiny_model(TINY_SPEC, tmp_path_factory.mktemp("tiny"))
    return ssd.models.load(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module", params=BACKENDS)
def tiny_core(request, tiny_loaded):
    """tiny_loaded's engine model on the cpu backend, the aten reference and (cuda) the cuda backend."""
    model = tiny_loaded.core_model(*PLACEMENTS[request.param])
    assert model.backend == request.param
    return model
