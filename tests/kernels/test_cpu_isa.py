"""The CPU kernels' instruction sets (csrc/kernels/cpu/isa.h).

The vector kernels are compiled for AVX-512, AVX2 and portable C++, and the best the
CPU has runs unless `_C.set_cpu_isa` chose another. Every path must give the same
bits as the portable one, kernel by kernel and for a whole model's logits: that is
what lets a forward switch between them and keeps a model's outputs independent of
the machine. Each path this CPU runs is forced and compared here (AVX-512 only on a
CPU that has it).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import ssd.models
from ssd import _C
from tests.kernels import test_fork_attention, test_paged_attention
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_tokens

ISAS = _C.cpu_isas()
FORCED = [isa for isa in ISAS if isa != "portable"]


@pytest.fixture(autouse=True)
def restore_isa():
    before = _C.cpu_isa()
    yield
    _C.set_cpu_isa(before)


def each_isa(fn) -> dict[str, object]:
    """fn() under every instruction set this CPU runs."""
    out = {}
    for isa in ISAS:
        _C.set_cpu_isa(isa)
        out[isa] = fn()
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns, so NaNs compare too."""
    return t.detach().contiguous().float().view(torch.int32)


def assert_same_bits(results: dict[str, torch.Tensor]):
    want = bits(results["portable"])
    for isa, got in results.items():
        assert torch.equal(bits(got), want), (isa, (bits(got) != want).sum().item())


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_default_is_the_best_the_cpu_flags_allow():
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "fma"} <= flags:
        best = "avx512_vnni" if "avx512_vnni" in flags else "avx512"
    elif {"avx2", "fma", "bmi2", "f16c"} <= flags:
        best = "avx2"
    else:
        best = "portable"
    assert ISAS[0] == "portable" and ISAS[-1] == best
    assert _C.cpu_isa() == best


def test_a_bad_choice_names_the_choices():
    with pytest.raises(ValueError, match="'sse4' is not one of portable, avx2, avx512, avx512_vnni"):
        _C.set_cpu_isa("sse4")
    if "avx512" not in ISAS:
        with pytest.raises(ValueError, match="'avx512': this CPU cannot run it"):
            _C.set_cpu_isa("avx512")
    assert _C.cpu_isa() == ISAS[-1]  # a refused choice leaves the active one alone


@pytest.mark.parametrize("isa", ISAS)
def test_choice_is_reported(isa):
    _C.set_cpu_isa(isa)
    assert _C.cpu_isa() == isa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 13])
def test_linear_same_bits(m, dtype):
    # n = 37 ends in a partial tile, k = 100 in a partial 16-lane chunk.
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 100, generator=g)
    w = torch.randn(37, 100, generator=g).to(dtype)
    b = torch.randn(37, generator=g)
    got = each_isa(lambda: _C.testing.packed_linear(x, w, b, threads=2))
    assert_same_bits(got)
    ref = x.double() @ w.double().T + b.double()
    assert torch.allclose(got["portable"].double(), ref, rtol=1e-5, atol=1e-5)
    if dtype != torch.float32:  # 16-bit weights widen exactly: the float32 product of their values
        assert torch.equal(got["portable"], _C.testing.packed_linear(x, w.float(), b, threads=2))


def test_fp16_weights_widen_exactly_at_the_edges():
    # subnormal, largest, signed zero, infinity and NaN halves, in a partial chunk
    g = torch.Generator().manual_seed(4)
    w = torch.randn(9, 45, generator=g).to(torch.float16)
    w[0, :6] = torch.tensor([6e-8, -6e-8, 65504.0, -0.0, 1e-5, -65504.0], dtype=torch.float16)
    w[3, 44], w[5, 1] = float("inf"), float("nan")
    x = torch.randn(4, 45, generator=g)
    got = each_isa(lambda: _C.testing.packed_linear(x, w, threads=1))
    assert_same_bits(got)
    want = _C.testing.packed_linear(x, w.float(), threads=1)
    torch.testing.assert_close(got["portable"], want, rtol=0, atol=0, equal_nan=True)
    assert got["portable"][:, 5].isnan().all() and not got["portable"][:, 0].isnan().any()


def test_pair_linear_does_not_depend_on_the_choice():
    # The draft's bf16 pair kernels run natively wherever the CPU has AVX512-BF16, whatever the choice.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 70, generator=g)
    w = torch.randn(130, 70, generator=g).to(torch.bfloat16)
    assert len(set(each_isa(_C.testing.pairs_native).values())) == 1
    assert_same_bits(each_isa(lambda: _C.testing.packed_linear(x, w, pairs=True, threads=2)))


@pytest.mark.parametrize("head_dim", [12, 64, 128])
@pytest.mark.parametrize("window", [0, 37])
def test_paged_attention_same_bits(head_dim, window):
    def run():
        q, k, v, tables, seq, pos, scale, out = test_paged_attention.make_inputs(4, head_dim, 16, seed=head_dim)
        torch.ops.ssd.paged_attention(q, k, v, tables, seq, pos, scale, out, window)
        return out

    assert_same_bits(each_isa(run))


@pytest.mark.parametrize("head_dim", [12, 64])
def test_fork_attention_same_bits(head_dim):
    args, _ = test_fork_attention.make_inputs(2, head_dim, 16, seed=3)
    assert_same_bits(each_isa(lambda: test_fork_attention.run(args).clone()))


# exp's edges: overflow to inf past 88.72, results in the subnormal range below -87.3,
# zero far below, infinities and NaN, and ordinary values.
EDGES = [0.0, -0.0, 1e-8, 0.5, -0.5, 10.0, -10.0, 88.3, 88.5, 88.8, 89.5, -87.0, -87.5, -95.0, -103.9, -104.5,
         -200.0, math.inf, -math.inf, math.nan]


def test_silu_mul_same_bits_at_the_edges():
    g = torch.Generator().manual_seed(1)
    gate = torch.cat([torch.tensor(EDGES), -torch.tensor(EDGES), torch.randn(61, generator=g) * 30])
    gu = torch.cat([gate, torch.randn(gate.numel(), generator=g)]).reshape(1, -1)
    assert_same_bits(each_isa(lambda: _C.testing.silu_mul(gu)))


@pytest.mark.parametrize("shift", [0.0, 30.0, -20.0])
def test_sum_exp_same_bits(shift):
    # Arguments up to 80 (no term overflows float32), down into exp's subnormal range.
    edges = [e for e in EDGES if -110 < e < 50]
    x = torch.cat([torch.tensor(edges), (torch.randn(2000, generator=torch.Generator().manual_seed(2)) * 20).clamp(max=60)])
    got = each_isa(lambda: _C.testing.sum_exp(x, shift))
    assert len(set(got.values())) == 1, got
    want = math.fsum(math.exp(v - shift) for v in x.tolist())
    assert got["portable"] == pytest.approx(want, rel=1e-5)


def test_rms_norm_same_bits():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 72, generator=g)
    w = torch.randn(72, generator=g)
    steps = _C.testing.BackendSteps("cpu", "cpu")
    assert_same_bits(each_isa(lambda: steps.rms_norm(x, w, 1e-6)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("spec", [
    TinySpec(arch="qwen3", hidden_size=72, intermediate_size=136, num_heads=6, num_kv_heads=2, head_dim=12,
             vocab_size=300, num_layers=2, seed=31),
    TinySpec(arch="mistral", hidden_size=128, intermediate_size=160, num_heads=2, num_kv_heads=1, vocab_size=300,
             num_layers=2, sliding_window=7, seed=34),
], ids=["qwen3-hd12", "mistral-sw7"])
def test_model_logits_same_bits(tmp_path, spec, dtype):
    """A prefill then decodes of a whole model: each instruction set gives the portable logits."""
    path, _ = build_tiny_model(spec, tmp_path / "m")
    core = ssd.models.load(path, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]).core_model("cpu", "cpu")
    tokens = random_tokens(23, spec.vocab_size, seed=7)

    def run():
        runner = _C.SequenceRunner(core, 4, 16, 2)
        seq = runner.add_sequence()
        rows = [runner.extend([(seq, tokens[:20])], True)]
        rows += [runner.extend([(seq, [t])], True) for t in tokens[20:]]
        return torch.cat(rows)

    assert_same_bits(each_isa(run))
