"""torch.ops.ssd.gumbel_top (the ssd tree's Gumbel ranking on the draft's device)
against the row kernel the CPU ranks with (itself checked against a full-scan
reference in test_gumbel_sample.py), and the CUDA op against the CPU op."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from ssd import _C
from tests.kernels.test_gumbel_sample import KINDS, keys, make_probs, seed_bits

OP = torch.ops.ssd.gumbel_top


def run(probs, seeds, positions, depth):
    dev = probs.device
    return OP(probs, torch.tensor([seed_bits(s) for s in seeds], dtype=torch.int64, device=dev),
              torch.tensor(positions, dtype=torch.int64, device=dev), depth)


def row_by_row(probs, seeds, positions, depth):
    """The expected [n, depth] ids and scores: the testing binding's row kernel, -1 / 0 padded."""
    ids = torch.full((len(seeds), depth), -1, dtype=torch.int64)
    scores = torch.zeros((len(seeds), depth), dtype=torch.float64)
    for r, (seed, position) in enumerate(zip(seeds, positions)):
        got, got_scores = _C.testing.gumbel_top(probs[r], seed, position, depth)
        ids[r, : len(got)] = torch.tensor(got, dtype=torch.int64)
        scores[r, : len(got)] = torch.tensor(got_scores, dtype=torch.float64)
    return ids, scores


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("depth", [0, 1, 3, 40])
def test_rows_match_the_row_kernel(kind, depth):
    probs = make_probs(24, 300, kind, seed=depth)
    seeds, positions = keys(24)
    ids, scores = run(probs, seeds, positions, depth)
    want_ids, want_scores = row_by_row(probs, seeds, positions, depth)
    assert torch.equal(ids, want_ids)
    assert torch.equal(scores, want_scores)


def test_short_support_is_padded():
    probs = torch.zeros(3, 50)
    probs[0, 7] = 1.0
    probs[1, [3, 9, 40]] = torch.tensor([0.2, 0.3, 0.5])
    ids, scores = run(probs, [1, 2, 3], [0, 5, 9], 5)
    assert ids[0].tolist() == [7, -1, -1, -1, -1]
    assert sorted(ids[1, :3].tolist()) == [3, 9, 40] and ids[1, 3:].tolist() == [-1, -1]
    assert ids[2].tolist() == [-1] * 5  # no support: an empty list
    assert torch.all(scores[ids < 0] == 0) and torch.all(scores[ids >= 0] > 0)
    # Scores descend along a list.
    assert scores[1, 0] >= scores[1, 1] >= scores[1, 2]


def test_opcheck():
    probs = make_probs(3, 11, "softmax", seed=6)
    torch.library.opcheck(OP.default, [probs, torch.tensor([0, -1, 5]), torch.tensor([0, 3, 2**40]), 4])


@pytest.mark.parametrize("depth, message", [(-1, "depth must be in \\[0, 512\\], got -1"),
                                            (513, "depth must be in \\[0, 512\\], got 513")])
def test_bad_depth_is_rejected(depth, message):
    with pytest.raises(RuntimeError, match="gumbel_top: " + message):
        run(make_probs(2, 9, "softmax", seed=1), [0, 1], [0, 1], depth)


def test_rows_are_checked_as_gumbel_samples_are():
    probs = make_probs(2, 9, "softmax", seed=1)
    probs[1, 4] = -0.5
    with pytest.raises(RuntimeError, match="gumbel_top: probs must be finite and >= 0; row 1 has -0.5 at token 4"):
        run(probs, [0, 1], [0, 1], 3)
    with pytest.raises(RuntimeError, match="gumbel_top: positions must be >= 0; row 0 has -2"):
        run(make_probs(2, 9, "softmax", seed=1), [0, 1], [-2, 1], 3)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab, depth", [(1, 3), (7, 40), (1000, 1), (1000, 33), (49152, 33), (151936, 512)])
def test_cuda_matches_cpu(vocab, depth, kind):
    probs = make_probs(16, vocab, kind, seed=vocab + depth)
    seeds, positions = keys(16, offset=vocab)
    ids, scores = run(probs.cuda(), seeds, positions, depth)
    want_ids, want_scores = run(probs, seeds, positions, depth)
    assert torch.equal(ids.cpu(), want_ids)
    # CUDA's double log and glibc's may differ in the last bit.
    torch.testing.assert_close(scores.cpu(), want_scores, rtol=1e-15, atol=0)


@pytest.mark.cuda
def test_cuda_opcheck():
    probs = make_probs(3, 11, "softmax", seed=6).cuda()
    torch.library.opcheck(OP.default, [probs, torch.tensor([0, -1, 5]).cuda(), torch.tensor([0, 3, 2**40]).cuda(), 4])
