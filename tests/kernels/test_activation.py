"""The model's MLP activation (`_C.testing.silu_mul`): silu(g) * u with a vectorised exp.

Accurate to a few float32 ulp against a float64 reference, right at the
extremes (overflowing exp, underflow, infinities, NaN), and lane independent:
an element's result does not depend on where it sits in the row or on the
row's length (the tail is masked, not computed another way)."""
from __future__ import annotations

import math

import pytest
import torch

from ssd import _C


def _reference(g, u):
    g64, u64 = g.double(), u.double()
    return (g64 * torch.sigmoid(g64) * u64)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1536])
def test_accurate_against_float64(n):
    gen = torch.Generator().manual_seed(n)
    g = torch.randn(3, n, generator=gen) * 6
    u = torch.randn(3, n, generator=gen)
    got = _C.testing.silu_mul(torch.cat([g, u], dim=1))
    ref = _reference(g, u)
    rel = ((got.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
    assert rel < 1e-6, rel


def test_extremes():
    g = torch.tensor([0.0, -0.0, 1e-30, 30.0, -30.0, 88.0, -88.0, 89.0, -89.0, 100.0, -100.0, 1e4, -1e4,
                      math.inf, -math.inf, math.nan])
    u = torch.ones_like(g)
    got = _C.testing.silu_mul(torch.cat([g, u])[None])[0]
    ref = _reference(g, u)
    finite = torch.isfinite(g)
    assert torch.allclose(got[finite].double(), ref[finite], rtol=1e-6, atol=1e-30)
    assert got[-3].item() == math.inf  # silu(inf) = inf
    assert math.isnan(got[-2].item())  # -inf / (1 + e^inf), as the formula (and torch) gives
    assert math.isnan(got[-1].item())


def test_lane_independent():
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(40, generator=gen) * 5
    full = _C.testing.silu_mul(torch.cat([values, torch.ones(40)])[None])[0]
    for start in range(0, 40, 7):
        for length in (1, 5, 16, 23):
            part = values[start:start + length]
            got = _C.testing.silu_mul(torch.cat([part, torch.ones(len(part))])[None])[0]
            assert torch.equal(got, full[start:start + len(part)])


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1023, 1025, 49152])
def test_sum_exp_is_the_softmax_normalizer(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 4
    shift = float(x.max())
    want = torch.exp(x.double() - shift).sum().item()
    assert _C.testing.sum_exp(x, shift) == pytest.approx(want, rel=1e-5)
    # Masked tail lanes add nothing: a shift below every value still sums only n terms.
    assert _C.testing.sum_exp(torch.zeros(n), 0.0) == pytest.approx(n, rel=1e-6)
