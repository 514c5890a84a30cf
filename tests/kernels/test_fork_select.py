"""torch.ops.ssd.fork_select against the pure-torch reference (CPU) and the CPU op (CUDA)."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.reference.fork_select_ref import fork_candidates

OP = torch.ops.ssd.fork_select


def make_case(batch: int, k: int, vocab: int, kind: str, seed: int):
    """probs [B, K+1, V] (rows of a softmax) and drafted [B, K]."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values: ties at every cut
        logits = torch.randint(-2, 2, (batch, k + 1, vocab), generator=g).to(torch.float32)
    else:
        logits = torch.randn(batch, k + 1, vocab, generator=g) * 3
    drafted = torch.randint(0, vocab, (batch, k), generator=g)
    return torch.softmax(logits, -1), drafted


def check(probs, drafted, fanout, max_fanout):
    fanout = torch.tensor(fanout, dtype=torch.int64)
    cand, counts = OP(probs, drafted, fanout, max_fanout)
    ref_cand, ref_counts = fork_candidates(probs, drafted, fanout, max_fanout)
    assert torch.equal(counts, ref_counts)
    assert torch.equal(cand, ref_cand)
    return cand, counts


@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize(
    "batch, k, vocab, fanout, max_fanout",
    [
        (1, 0, 1, [1], 1),
        (2, 1, 2, [1, 2], 3),
        (3, 2, 5, [9, 0, 3], 9),
        (4, 3, 1000, [8, 4, 2, 17], 20),
        (3, 4, 1000, [0, 0, 0, 0, 0], 0),
        (2, 5, 49152, [6, 5, 4, 3, 2, 12], 16),
        (2, 3, 151936, [64, 16, 4, 1], 64),
    ],
)
def test_matches_reference(batch, k, vocab, fanout, max_fanout, kind):
    probs, drafted = make_case(batch, k, vocab, kind, seed=vocab + k)
    check(probs, drafted, fanout, max_fanout)


def test_ties_keep_lowest_ids_and_skip_drafted():
    probs = torch.full((1, 2, 6), 1 / 6)
    cand, counts = check(probs, torch.tensor([[1]]), [3, 3], 4)
    assert cand.tolist() == [[[0, 2, 3, -1], [0, 1, 2, -1]]]
    assert counts.tolist() == [[3, 3]]


def test_fanout_beyond_vocab_takes_every_other_token():
    probs = torch.tensor([[[0.1, 0.4, 0.0, 0.2, 0.3], [0.0, 0.0, 1.0, 0.0, 0.0]]])
    cand, counts = check(probs, torch.tensor([[3]]), [9, 9], 10)
    assert counts.tolist() == [[4, 5]]
    assert cand[0, 0, :4].tolist() == [1, 4, 0, 2]
    assert cand[0, 1, :5].tolist() == [2, 0, 1, 3, 4]


def test_drafted_token_only_excluded_before_last_position():
    """Negative control: the reference without the exclusion disagrees with the op."""
    probs, drafted = make_case(2, 3, 300, "normal", seed=11)
    drafted = probs[:, :3].argmax(-1)  # the best token is drafted: excluding it shifts every slot
    fanout = torch.tensor([4, 4, 4, 4])
    cand, _ = OP(probs, drafted, fanout, 4)
    unexcluded, _ = fork_candidates(probs, torch.full_like(drafted, -1), fanout, 4)
    assert not torch.equal(cand[:, :3], unexcluded[:, :3])
    assert torch.equal(cand[:, 3], unexcluded[:, 3])


def small_args():
    probs, drafted = make_case(2, 2, 9, "ties", seed=12)
    return [probs, drafted, torch.tensor([2, 0, 5]), 6]


def test_opcheck():
    torch.library.opcheck(OP.default, small_args())


@pytest.mark.parametrize(
    "index, value, message",
    [
        (2, torch.tensor([2, 0, 7]), "fanout must be in \\[0, max_fanout = 6\\]; fanout\\[2\\] = 7"),
        (2, torch.tensor([2, -1, 0]), "fanout\\[1\\] = -1"),
        (1, torch.tensor([[0, 9], [1, 2]]), "drafted tokens must be in \\[0, V = 9\\); drafted\\[0, 1\\] = 9"),
        (1, torch.tensor([[0, 1]]), "drafted must have shape \\[B, K\\] = \\[2, 2\\]"),
        (2, torch.tensor([1, 1]), "fanout must have shape \\[K\\+1\\] = \\[3\\]"),
        (0, torch.ones(2, 3, 9, dtype=torch.float64), "probs must be float32"),
        (3, -1, "max_fanout must be >= 0"),
    ],
)
def test_invalid_arguments_are_rejected(index, value, message):
    args = small_args()
    args[index] = value
    with pytest.raises(RuntimeError, match=message):
        OP(*args)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize(
    "batch, k, vocab, fanout, max_fanout",
    [
        (1, 0, 1, [1], 1),
        (3, 2, 5, [9, 0, 3], 9),
        (4, 3, 5000, [2500, 1100, 1024, 3], 2600),  # several shared-memory slices
        (64, 4, 49152, [8, 6, 4, 2, 16], 16),
        (8, 3, 151936, [64, 16, 4, 1], 64),
    ],
)
def test_cuda_matches_cpu_exactly(batch, k, vocab, fanout, max_fanout, kind):
    probs, drafted = make_case(batch, k, vocab, kind, seed=vocab + 1)
    fanout = torch.tensor(fanout, dtype=torch.int64)
    cand, counts = OP(probs, drafted, fanout, max_fanout)
    cand_gpu, counts_gpu = OP(probs.cuda(), drafted.cuda(), fanout.cuda(), max_fanout)
    assert torch.equal(counts_gpu.cpu(), counts)
    assert torch.equal(cand_gpu.cpu(), cand)


@pytest.mark.cuda
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cuda_nan_ranks_below_every_number(sign):
    """NaN scores past the first F ids never enter the CPU's heap; the GPU ranks a
    NaN of either sign below -inf, so both pick the same candidates."""
    probs, drafted = make_case(4, 2, 3000, "normal", seed=9)
    nan = torch.tensor(float("nan")).copysign(torch.tensor(sign))
    probs[:, :, 100::7] = nan
    probs[:, :, 50] = float("-inf")
    fanout = torch.tensor([16, 4, 40], dtype=torch.int64)
    cand, counts = OP(probs, drafted, fanout, 40)
    cand_gpu, counts_gpu = OP(probs.cuda(), drafted.cuda(), fanout.cuda(), 40)
    assert not probs.gather(2, cand.clamp(min=0)).isnan().any()
    assert torch.equal(counts_gpu.cpu(), counts)
    assert torch.equal(cand_gpu.cpu(), cand)


@pytest.mark.cuda
def test_cuda_opcheck():
    torch.library.opcheck(OP.default, [a.cuda() if isinstance(a, torch.Tensor) else a for a in small_args()])
