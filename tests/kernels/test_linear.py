"""The model's packed matrix kernels (`_C.testing.packed_linear`).

Exact layout: every row is bitwise the same whatever the number of rows, its
place in the batch and the thread count (what greedy speculative decoding
relies on), and it is an fp32 product to within fp32 rounding. Pair layout
(the draft's many-row path): rows are also batch invariant, and the result is
the product of the bf16-rounded operands accumulated in fp32.
"""
from __future__ import annotations

import pytest
import torch

from ssd import _C

# k with and without 16- and 2-element tails; n with partial 4-row tiles and 64-column panels.
SHAPES = [(5, 72), (13, 80), (64, 16), (300, 577), (130, 1536)]
ROW_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 70]


def _operands(n, k, m, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    bias = torch.randn(n, generator=g)
    return x, w, bias


def _reference(x, w, bias, round_x):
    xr = x.to(torch.bfloat16) if round_x else x
    return (xr.double() @ w.double().T) + bias.double()


@pytest.mark.parametrize("pairs", [False, True], ids=["exact", "pairs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_rows_are_batch_invariant_and_accurate(n, k, dtype, pairs):
    x, w, bias = _operands(n, k, max(ROW_COUNTS), dtype, seed=n * 1000 + k)
    full = _C.testing.packed_linear(x, w, bias, pairs=pairs, threads=1)
    # Accuracy: exact = fp32 product; pairs = product of bf16 operands.
    wr = w.to(torch.bfloat16) if pairs else w
    ref = _reference(x, wr, bias, round_x=pairs)
    scale = (x.abs().double() @ wr.abs().double().T) + bias.abs().double()
    err = ((full.double() - ref).abs() / scale).max().item()
    assert err < (1e-5 if not pairs else 2e-5), f"relative error {err}"
    # Invariance: any subset of rows, in any order, any thread count, gives the same bits.
    g = torch.Generator().manual_seed(7)
    for m in ROW_COUNTS:
        rows = torch.randperm(x.shape[0], generator=g)[:m]
        for threads in (1, 2, 3):
            part = _C.testing.packed_linear(x[rows], w, bias, pairs=pairs, threads=threads)
            assert torch.equal(part, full[rows]), (m, threads)


def test_pairs_differ_from_exact_for_fp32_weights():
    x, w, bias = _operands(64, 96, 4, torch.float32, seed=3)
    exact = _C.testing.packed_linear(x, w, bias)
    pairs = _C.testing.packed_linear(x, w, bias, pairs=True)
    assert not torch.equal(exact, pairs)
    assert torch.allclose(exact, pairs, rtol=0.05, atol=0.05)


def test_bias_is_optional_and_added_once():
    x, w, bias = _operands(20, 40, 3, torch.float32, seed=5)
    for pairs in (False, True):
        with_bias = _C.testing.packed_linear(x, w, bias, pairs=pairs)
        without = _C.testing.packed_linear(x, w, pairs=pairs)
        assert torch.allclose(with_bias - without, bias.expand(3, -1), atol=1e-5)


def test_non_finite_activation_tails_do_not_leak():
    # Columns past k in a strided row must never be read: a NaN there would poison the tail chunk.
    x, w, bias = _operands(8, 20, 2, torch.float32, seed=9)
    wide = torch.full((2, 32), float("nan"))
    wide[:, :20] = x
    for pairs in (False, True):
        ref = _C.testing.packed_linear(x, w, bias, pairs=pairs)
        got = _C.testing.packed_linear(wide[:, :20], w, bias, pairs=pairs)
        assert torch.equal(got, ref)


def test_bad_shapes_are_refused():
    with pytest.raises(RuntimeError, match="same k"):
        _C.testing.packed_linear(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match="bias must be"):
        _C.testing.packed_linear(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(5))
