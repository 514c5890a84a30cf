"""Models whose matrices stay in GGUF block formats (ssd.models.quantized).

The rule under test: a model loaded with its blocks (dtype "auto", or
quantized at load) and fp32 activations computes bitwise what the fp32 model
of its dequantised weights computes; with int8 activations (the default) it
stays within their quantization error of it. The reference is the "float32"
load of the same file, whose weights are gguf-py's dequantisation
(tests/models/test_loading.py checks those against the state dict), never the
quantized path.
"""
from __future__ import annotations

import logging

import pytest
import torch

from ssd import EngineConfig
from ssd.models import ModelLoadError, load
from tests.models.test_loading import tiny_hf_config, tiny_hf_model
from tests.reference.gguf_files import write_tiny_gguf

MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IDS = [3, 17, 5, 90, 41, 41, 7, 0, 63, 12, 88, 1, 54]


def matrix_names(state, tied):
    names = [n for n in state if n.endswith(tuple(f"{m}.weight" for m in MATRICES))]
    names.append("model.embed_tokens.weight")
    if not tied:
        names.append("lm_head.weight")
    return names


def assert_computes_the_dequantised_model(native, reference, max_bytes_ratio):
    """fp32 activations: bitwise the float32 load's logits; int8 ones: within 2 %;
    and the engine holds at most max_bytes_ratio of the float32 model's weight bytes."""
    want = reference.logits(IDS)
    assert torch.equal(native.logits(IDS, int8_activations=False), want)
    # int8 activations: another product, within their quantization error.
    error = ((native.logits(IDS) - want).abs().max() / want.abs().max()).item()
    assert 0 < error < 0.02, error
    ratio = native.core_model().weight_bytes / reference.core_model().weight_bytes
    assert ratio < max_bytes_ratio, ratio


def tiny_gguf(path, arch, tied, types_of, **overrides):
    """A tiny GGUF whose matrices have the ggml types types_of(name) gives (None: F32)."""
    config = tiny_hf_config(arch, tie_word_embeddings=tied, **overrides)
    state = tiny_hf_model(config).state_dict()
    types = {n: types_of(n) for n in matrix_names(state, tied) if types_of(n) is not None}
    return write_tiny_gguf(path, config, state, types=types)


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen3", True)])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_blocks_compute_the_dequantised_model(tmp_path, arch, tied, fmt):
    path = tiny_gguf(tmp_path / "m.gguf", arch, tied, lambda name: fmt.upper())
    native = load(path, dtype="auto")
    reference = load(path, dtype="float32")
    assert set(native.formats) == set(matrix_names(reference.weights, tied))
    assert set(native.formats.values()) == {fmt}
    for name in native.formats:
        assert native.weights[name].dtype == torch.uint8, name
    # The blocks are what the engine holds: far fewer bytes than fp32.
    assert_computes_the_dequantised_model(native, reference, 0.35 if fmt == "q8_0" else 0.25)


def test_mixed_formats_and_other_types(tmp_path, caplog):
    # q, k, v (one fused matrix) in three formats: three products, one per
    # part; o_proj MXFP4 has no kernel: dequantised, with one warning.
    kinds = {"q_proj": "Q8_0", "k_proj": "Q4_0", "v_proj": "Q4_1", "o_proj": "MXFP4", "gate_proj": "Q5_1",
             "up_proj": "Q5_1", "down_proj": "Q5_0"}

    def types_of(name):
        if name == "model.embed_tokens.weight":
            return "Q8_0"
        return next((t for m, t in kinds.items() if f".{m}." in name), None)

    path = tiny_gguf(tmp_path / "mixed.gguf", "llama", False, types_of)
    with caplog.at_level(logging.WARNING, logger="ssd"):
        native = load(path, dtype="auto")
    warnings = [r.getMessage() for r in caplog.records if "dequantised" in r.getMessage()]
    assert len(warnings) == 1 and "type MXFP4 have" in warnings[0], warnings
    assert native.formats["model.layers.0.self_attn.k_proj.weight"] == "q4_0"
    assert native.formats["model.layers.0.mlp.down_proj.weight"] == "q5_0"
    assert "model.layers.0.self_attn.o_proj.weight" not in native.formats
    assert native.weights["model.layers.0.self_attn.o_proj.weight"].dtype == torch.float32
    want = load(path, dtype="float32").logits(IDS)
    assert torch.equal(native.logits(IDS, int8_activations=False), want)
    error = ((native.logits(IDS) - want).abs().max() / want.abs().max()).item()
    assert 0 < error < 0.02, error


@pytest.mark.parametrize("kind,dtype", [("F16", torch.float16), ("BF16", torch.bfloat16)])
def test_sixteen_bit_files_stay_sixteen_bit(tmp_path, kind, dtype):
    path = tiny_gguf(tmp_path / "h.gguf", "qwen3", True, lambda name: kind)
    native = load(path, dtype="auto")
    assert native.formats == {}
    assert native.weights["model.layers.0.mlp.down_proj.weight"].dtype == dtype
    reference = load(path, dtype="float32")  # the same values as float32
    assert torch.equal(native.logits(IDS), reference.logits(IDS))
    ratio = native.core_model().weight_bytes / reference.core_model().weight_bytes
    assert ratio < 0.6, ratio  # held in 16 bits (the tied fp16 table also as a float32 lookup copy)


# llama.cpp's Q4_K_M mix: q4_k, and q6_k for v, down and the vocabulary
# matrices (so q/k/v is two products); q5_k gate/up as in its Q5_K_M.
K_MIX = {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q4_K", "gate_proj": "Q5_K",
         "up_proj": "Q5_K", "down_proj": "Q6_K"}


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen3", True)])
def test_k_quant_mix_computes_the_dequantised_model(tmp_path, arch, tied):
    def types_of(name):
        return next((t for m, t in K_MIX.items() if f".{m}." in name), "Q6_K")

    sizes = dict(hidden_size=256, intermediate_size=512, head_dim=64)  # rows of whole 256-blocks
    path = tiny_gguf(tmp_path / "k.gguf", arch, tied, types_of, **sizes)
    native = load(path, dtype="auto")
    reference = load(path, dtype="float32")
    assert set(native.formats.values()) == {"q4_k", "q5_k", "q6_k"}
    assert native.formats["model.layers.1.self_attn.v_proj.weight"] == "q6_k"
    assert_computes_the_dequantised_model(native, reference, 0.3)  # 6 to 8 bits per weight held


def test_quantizing_at_load_equals_the_files_blocks(tmp_path):
    f32 = tiny_gguf(tmp_path / "f32.gguf", "llama", False, lambda name: None)
    q4 = tiny_gguf(tmp_path / "q4.gguf", "llama", False, lambda name: "Q4_0")
    at_load = load(f32, dtype="q4_0")
    from_file = load(q4, dtype="auto")
    assert at_load.formats == from_file.formats
    for name in at_load.formats:
        assert torch.equal(at_load.weights[name], from_file.weights[name]), name
    assert torch.equal(at_load.logits(IDS), from_file.logits(IDS))


@pytest.mark.parametrize("fmt,tolerance", [("q8_0", 0.03), ("q4_0", 0.2)])
def test_hf_checkpoint_quantized_at_load(tmp_path, fmt, tolerance):
    model = tiny_hf_model(tiny_hf_config("llama"))
    model.save_pretrained(tmp_path)
    quantized = load(tmp_path, dtype=fmt)
    assert len(quantized.formats) == 2 * 7 + 2
    exact = load(tmp_path).logits(IDS)
    for int8 in (False, True):
        error = (quantized.logits(IDS, int8_activations=int8) - exact).abs().max() / exact.abs().max()
        assert 0 < error < tolerance, (int8, error)


def test_rows_outside_blocks_stay_float32(tmp_path, caplog):
    model = tiny_hf_model(tiny_hf_config("llama", intermediate_size=48))  # down_proj rows of 48
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ssd"):
        loaded = load(tmp_path, dtype="q8_0")
    assert "model.layers.0.mlp.down_proj.weight" not in loaded.formats
    assert loaded.weights["model.layers.0.mlp.down_proj.weight"].dtype == torch.float32
    assert any("2 matrices (first model.layers.0.mlp.down_proj.weight, rows of 48)" in r.getMessage()
               for r in caplog.records)
    assert loaded.logits(IDS).isfinite().all()


def test_aten_backend_dequantises_the_blocks(tmp_path):
    path = tiny_gguf(tmp_path / "m.gguf", "llama", True, lambda name: "Q4_1")
    native = load(path, dtype="auto")
    # (the aten backend has no int8 product: it runs the dequantised model)
    assert torch.equal(native.logits(IDS, backend="aten"), load(path).logits(IDS, backend="aten"))


def test_unknown_dtypes_are_refused(tmp_path):
    path = tiny_gguf(tmp_path / "m.gguf", "llama", True, lambda name: None)
    with pytest.raises(ModelLoadError, match="supported dtypes are float32, bfloat16, q8_0, q4_0, q4_1, q5_0, q5_1, auto"):
        load(path, dtype="q5_k")
    with pytest.raises(ValueError, match="dtype: must be 'float32', 'bfloat16', 'q8_0'"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match="draft_dtype: must be"):
        EngineConfig(draft_dtype="q2_k")
    with pytest.raises(ValueError, match="quant_activations: must be 'int8' or 'float32', got 'int4'"):
        EngineConfig(quant_activations="int4")
