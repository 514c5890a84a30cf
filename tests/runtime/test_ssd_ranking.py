"""The ssd draft worker's ranked lists: the fork candidates its trees branch on."""
import pytest
import torch

from ssd import _C


def reference_ranking(logits, depth):
    order = sorted(range(len(logits)), key=lambda t: (-logits[t], t))
    return order[:depth]


def test_ties_rank_lower_ids_first():
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0, 2.0])
    tokens, probs = _C.testing.ranked_tokens(logits, 4)
    assert tokens == [1, 2, 4, 5]
    assert probs == []  # only kept when asked for
    # The cut falls inside a tie: the lower ids make the list.
    assert _C.testing.ranked_tokens(logits, 2)[0] == [1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_ranking_matches_value_desc_id_asc(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = 300
    # Few distinct values: many ties, at the cut too.
    logits = torch.randint(-4, 5, (vocab,), generator=gen).float() * 0.5
    for depth in (1, 2, 7, 33, vocab, vocab + 5):
        tokens, _ = _C.testing.ranked_tokens(logits, depth)
        assert tokens == reference_ranking(logits.tolist(), depth)


def test_probabilities_are_the_draft_softmax_at_temperature_one():
    logits = torch.tensor([0.5, -1.0, 2.0, 2.0, 0.0])
    tokens, probs = _C.testing.ranked_tokens(logits, 3, with_probs=True)
    assert tokens == [2, 3, 0]
    want = torch.softmax(logits.double(), 0)[tokens].tolist()
    assert probs == pytest.approx(want, rel=1e-6)
