"""HF directories through the one C++ loader (``ssd._C.load_checkpoint``).

What ``ssd.models.load`` adds on top of it: the ModelConfig dataclass built
from the C++ config field for field, and the special token ids, where the
checkpoint's metadata comes before the tokenizer's.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models as tk_models

from ssd.models import ModelConfig, ModelLoadError, RopeScaling, load
from ssd.models.weights import expected_shapes
from tests.reference.tiny_models import TinySpec, build_tiny_model, edit_json


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """A llama with llama3 rope scaling and both kinds of bias: every config field in use."""
    spec = TinySpec(num_kv_heads=2, llama3_rope=True, attention_bias=True, mlp_bias=True, seed=7)
    return build_tiny_model(spec, tmp_path_factory.mktemp("ckpt") / "llama")[0]


@pytest.fixture
def model_dir(llama_dir, tmp_path) -> Path:
    """A copy of ``llama_dir`` to edit."""
    return Path(shutil.copytree(llama_dir, tmp_path / "llama"))


def add_tokenizer(model_dir: Path, bos: str, eos: str) -> None:
    """tokenizer.json holding only the special tokens <s> (id 0), </s> (1), <x> (2)."""
    backend = BackendTokenizer(tk_models.BPE())
    backend.add_special_tokens(["<s>", "</s>", "<x>"])
    backend.save(str(model_dir / "tokenizer.json"))
    edit_json(model_dir / "tokenizer_config.json", bos_token=bos, eos_token=eos)


def test_config_crosses_from_cpp_field_for_field(llama_dir):
    from ssd import _C

    raw = _C.load_checkpoint(str(llama_dir), "float32")
    assert set(raw["config"]) == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(raw["config"]["rope_scaling"]) == {f.name for f in dataclasses.fields(RopeScaling)}
    config = load(llama_dir).config
    assert config.to_dict() == raw["config"]
    assert config.rope_scaling == RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=32)
    assert config.attention_bias and config.mlp_bias
    assert list(raw["weights"]) == list(expected_shapes(config))  # a stable order
    assert all(t.device.type == "cpu" for t in raw["weights"].values())


def test_bos_from_metadata_then_tokenizer(model_dir):
    add_tokenizer(model_dir, bos="<x>", eos="</s>")
    edit_json(model_dir / "config.json", bos_token_id=5)
    edit_json(model_dir / "generation_config.json", bos_token_id=None)
    assert load(model_dir).bos_token_id == 5  # a null in generation_config.json counts as absent
    edit_json(model_dir / "generation_config.json", bos_token_id=6)
    assert load(model_dir).bos_token_id == 6
    edit_json(model_dir / "generation_config.json", bos_token_id=...)
    edit_json(model_dir / "config.json", bos_token_id=...)
    assert load(model_dir).bos_token_id == 2  # the tokenizer's <x>


def test_eos_metadata_then_tokenizer(model_dir):
    edit_json(model_dir / "generation_config.json", eos_token_id=[9, None, 4])
    edit_json(model_dir / "config.json", eos_token_id=[4, 8])
    assert load(model_dir).eos_token_ids == [9, 4, 8]
    add_tokenizer(model_dir, bos="<s>", eos="</s>")
    assert load(model_dir).eos_token_ids == [9, 4, 8, 1]


@pytest.mark.parametrize(("file", "key", "value"), [
    ("config.json", "eos_token_id", "</s>"),
    ("generation_config.json", "eos_token_id", [2, -1]),
    ("config.json", "bos_token_id", [1]),
    ("generation_config.json", "bos_token_id", 1.5),
])
def test_bad_special_ids_name_file_and_key(model_dir, file, key, value):
    edit_json(model_dir / file, **{key: value})
    with pytest.raises(ModelLoadError, match=key) as info:
        load(model_dir)
    assert str(model_dir / file) in str(info.value)


def test_bad_dtype_name_is_a_value_error(llama_dir):
    from ssd import _C

    with pytest.raises(ValueError, match="dtype: must be float32 or bfloat16, got 'float16'"):
        _C.load_checkpoint(str(llama_dir), "float16")
