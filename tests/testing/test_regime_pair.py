"""ssd.testing.regime_pair: the constructed SmolLM2 draft/target pair.

One small pair (cost_ratio 0.5: 68 layers, ~1.1 GB) is built once per session
in a temporary cache (~40 s on the 2-core development machine).
"""
from __future__ import annotations

import json
import time

import pytest
import torch

from ssd import assets, models
from ssd.testing import agreement_text, regime_pair, top1_agreement

ACCEPTANCE, COST_RATIO = 0.75, 0.5


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("regime-cache")


@pytest.fixture(scope="session")
def pair(cache):
    return regime_pair(ACCEPTANCE, COST_RATIO, cache_dir=cache, progress=False)


@pytest.fixture(scope="session")
def loaded(pair):
    draft, target = models.load(pair.draft), models.load(pair.target)
    return draft, target


def test_layout_and_info(pair, cache):
    assert pair.root == cache / "regime" / f"a{ACCEPTANCE:g}-c{COST_RATIO:g}-s0"
    info = json.loads((pair.root / "pair.json").read_text())
    assert info == pair.info
    assert info["constructed"] is True
    assert info["requested"] == {"acceptance": ACCEPTANCE, "cost_ratio": COST_RATIO}
    assert abs(info["cost"]["ratio_by_params"] - COST_RATIO) < 0.02
    assert abs(info["measured"]["agreement"] - ACCEPTANCE) < 0.05
    assert len(info["source"]["sha256_prefix"]) == 16
    for d in (pair.draft, pair.target):
        for name in ("config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "generation_config.json"):
            assert (d / name).is_file(), d / name
    assert json.loads((pair.target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_draft_is_smollm2(loaded):
    draft, _ = loaded
    base = models.load(assets.smollm2_gguf_path())
    assert draft.config == base.config
    assert draft.weights.keys() == base.weights.keys()
    for name, tensor in base.weights.items():
        assert torch.equal(draft.weights[name], tensor), name
    assert draft.eos_token_ids == base.eos_token_ids == [2]
    assert draft.chat_template == base.chat_template
    assert draft.tokenizer.encode("Hello, world!") == base.tokenizer.encode("Hello, world!")


def test_target_layers(pair, loaded):
    draft, target = loaded
    layers = pair.info["layers"]
    assert layers["base"] == 30 and layers["perturb"] == 8
    assert target.config.num_layers == layers["total"] == 30 + layers["ballast"] + layers["perturb"]
    assert target.eos_token_ids == [2]
    for i in range(30):  # the base layers are untouched
        key = f"model.layers.{i}.mlp.down_proj.weight"
        assert torch.equal(target.weights[key], draft.weights[key])


def test_agreement_on_held_out_text(pair, loaded):
    draft, target = loaded
    prompts = assets.mtbench_prompts()[40:43] + assets.humaneval_prompts()[80:83]
    texts = agreement_text(pair.draft, prompts)
    assert sum(len(ids) - start for ids, start in texts) >= 300
    measured = top1_agreement(draft, target, texts)
    assert abs(measured - ACCEPTANCE) <= 0.1, measured


def test_cached_second_call(pair, cache):
    start = time.perf_counter()
    again = regime_pair(ACCEPTANCE, COST_RATIO, cache_dir=cache, progress=False)
    assert time.perf_counter() - start < 1.0
    assert (again.draft, again.target, again.info) == (pair.draft, pair.target, pair.info)


@pytest.mark.parametrize("kwargs, match", [
    ({"acceptance": 0.3}, "acceptance"),
    ({"acceptance": 0.995}, "acceptance"),
    ({"acceptance": "0.75"}, "acceptance"),
    ({"cost_ratio": 0.05}, "cost_ratio"),
    ({"cost_ratio": 0.95}, "cost_ratio"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        regime_pair(cache_dir=tmp_path, **kwargs)
    assert not (tmp_path / "regime").exists()
