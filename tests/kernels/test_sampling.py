"""The C++ logits-processing routine against the pure-torch reference."""
import pytest
import torch

from ssd import _C
from tests.reference.sampling_ref import processed_probs

SETTINGS = [
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.3, 5, 1.0),
    (1.0, 1, 1.0),
    (1.0, 0, 0.9),
    (0.5, 0, 0.3),
    (1.0, 50, 0.8),
    (2.0, 3, 0.05),
    (0.0, 0, 1.0),
    (0.0, 7, 0.5),
]


@pytest.mark.parametrize("vocab", [2, 7, 100, 49152, 151936])
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_matches_reference(vocab, temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(vocab * 31 + top_k)
    logits = torch.randn(vocab, generator=gen) * 3
    got = _C.testing.process_logits(logits, temperature, top_k, top_p).double()
    want = processed_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, want > 0), "kept set differs"
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert abs(got.sum().item() - 1.0) < 1e-5


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_ties_keep_lowest_ids(temperature, top_k, top_p):
    # Integer logits: many exact ties, also at every cut.
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 4, (64,), generator=gen).float()
    got = _C.testing.process_logits(logits, temperature, top_k, top_p).double()
    want = processed_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_tie_rule_is_not_vacuous():
    logits = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0])
    got = _C.testing.process_logits(logits, 1.0, 2, 1.0)
    assert got[1] > 0 and got[2] > 0 and got[3] == 0  # the tie at the cut keeps ids 1, 2
    greedy = _C.testing.process_logits(logits, 0.0, 0, 1.0)
    assert greedy.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_keyed_uniform_depends_only_on_key():
    a = [_C.testing.keyed_uniform(7, pos, 1) for pos in range(1000)]
    assert a == [_C.testing.keyed_uniform(7, pos, 1) for pos in range(1000)]
    assert a != [_C.testing.keyed_uniform(8, pos, 1) for pos in range(1000)]
    assert a != [_C.testing.keyed_uniform(7, pos, 2) for pos in range(1000)]
    assert all(0.0 <= u < 1.0 for u in a)
    # Roughly uniform: mean and a coarse histogram.
    many = torch.tensor([_C.testing.keyed_uniform(11, pos, 1) for pos in range(20000)])
    assert abs(many.mean().item() - 0.5) < 0.01
    hist = torch.histc(many, bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200
