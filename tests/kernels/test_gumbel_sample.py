"""torch.ops.ssd.gumbel_sample against the pure-Python reference (CPU) and the CPU op (CUDA)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.reference.gumbel_ref import gumbel_token, gumbel_top_ref, mix64, uniform
from tests.reference.stats import g_test, samples_for_power

OP = torch.ops.ssd.gumbel_sample

SEEDS = [0, 1, 987654321, 2**63 - 1, 2**63, 2**64 - 1]
POSITIONS = [0, 1, 2, 17, 4096, 2**31 + 5, 2**40 + 1, 2**63 - 1]

# u for (seed, position, token), computed once with tests/reference/gumbel_ref.py:
# a change to the noise (hash, key layout, purpose, bit count) shows up here.
PINNED_U = [
    (0, 0, 0, 0.39327092928225393),
    (0, 0, 1, 0.2605680520542589),
    (2**64 - 1, 0, 0, 0.952767709926814),
    (2**64 - 1, 0, 1, 0.7172902606999526),
    (42, 7, 0, 0.20236959840406732),
    (42, 7, 1, 0.032133557897646825),
    (12345, 10**12, 0, 0.8207244899073919),
    (12345, 10**12, 1, 0.920957359620994),
    (2**63, 2**62 + 3, 0, 0.9626995144141793),
    (2**63, 2**62 + 3, 1, 0.9079872709606694),
    (42, 8, 3, 0.19301836120203542),
    (12345, 10**12, 151935, 0.35030287586585696),
]


def seed_bits(seed: int) -> int:
    """A uint64 seed as the int64 with the same bits (what the op takes)."""
    return seed - 2**64 if seed >= 2**63 else seed


def make_probs(n: int, vocab: int, kind: str, seed: int) -> torch.Tensor:
    """[n, vocab] float32 rows: softmax of random logits, peaked, top-k supports, or exact ties."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values, zeros included
        probs = torch.randint(0, 3, (n, vocab), generator=g).to(torch.float32)
        probs[:, 0] = 1.0  # no empty row
        return probs / probs.sum(1, keepdim=True)
    scale = 6.0 if kind == "peaked" else 1.0
    probs = torch.softmax(torch.randn(n, vocab, generator=g) * scale, dim=1)
    if kind == "top_k":
        k = torch.randint(1, vocab + 1, (n, 1), generator=g)
        rank = torch.argsort(torch.argsort(-probs, dim=1, stable=True), dim=1)
        probs = torch.where(rank < k, probs, torch.zeros(()))
        probs = probs / probs.sum(1, keepdim=True)
    return probs


def keys(n: int, offset: int = 0) -> tuple[list[int], list[int]]:
    """n (seed, position) pairs cycling through SEEDS x POSITIONS."""
    rows = range(offset, offset + n)
    return [SEEDS[i % len(SEEDS)] for i in rows], [POSITIONS[(i + i // len(SEEDS)) % len(POSITIONS)] for i in rows]


def run(probs: torch.Tensor, seeds: list[int], positions: list[int]) -> torch.Tensor:
    dev = probs.device
    return OP(probs, torch.tensor([seed_bits(s) for s in seeds], dtype=torch.int64, device=dev),
              torch.tensor(positions, dtype=torch.int64, device=dev))


KINDS = ["softmax", "peaked", "top_k", "ties"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab, n", [(1, 8), (2, 48), (7, 48), (1000, 48), (49152, 12)])
def test_rows_match_reference(vocab, n, kind):
    probs = make_probs(n, vocab, kind, seed=vocab)
    seeds, positions = keys(n, offset=vocab)
    tokens = run(probs, seeds, positions)
    assert tokens.dtype == torch.int64 and tokens.shape == (n,)
    expected = [gumbel_token(probs[r], seeds[r], positions[r]) for r in range(n)]
    assert tokens.tolist() == expected
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())


def test_no_support_gives_token_zero_and_one_token_support_gives_it():
    probs = torch.zeros(4, 9)
    probs[1, 5] = 0.25
    probs[2, 8] = 1e-30
    probs[3, 0] = 1.0
    assert run(probs, [0, 3, 2**64 - 1, 7], [0, 10, 2**40, 3]).tolist() == [0, 5, 8, 0]


def test_noise_is_pinned():
    assert mix64(0) == 0xE220A8397B1DCDAF  # splitmix64's first output from state 0
    for seed, position, token, u in PINNED_U:
        assert uniform(seed, position, token) == u, (seed, position, token)


def test_op_noise_is_pinned():
    """Two tokens at a pinned (seed, position): p_0 / p_1 just above E_0 / E_1 draws
    token 0, just below draws 1, which fixes the op's E_0 / E_1 to 1e-5."""
    pinned = {(s, q, t): u for s, q, t, u in PINNED_U}
    rows, seeds, positions = [], [], []
    for seed, position, token, _ in PINNED_U:
        if token != 0:
            continue
        ratio = math.log(pinned[seed, position, 0]) / math.log(pinned[seed, position, 1])
        for side in (1 + 1e-5, 1 - 1e-5):
            rows.append([ratio * side, 1.0])
            seeds.append(seed)
            positions.append(position)
    tokens = run(torch.tensor(rows, dtype=torch.float32), seeds, positions)
    assert tokens.tolist() == [0, 1] * (len(rows) // 2)


def test_uniforms_are_open_interval_and_keyed():
    for seed in SEEDS:
        for position in POSITIONS[:-1]:
            for token in (0, 1, 151935):
                u = uniform(seed, position, token)
                assert 0.0 < u < 1.0
                assert u != uniform(seed, position + 1, token)
                assert u != uniform(seed, position, token + 1)
                assert u != uniform(seed ^ 1, position, token)


def test_non_contiguous_rows_and_row_independence():
    probs = make_probs(10, 600, "softmax", seed=3)
    seeds, positions = keys(10)
    strided = probs[:, ::2]
    assert run(strided, seeds, positions).tolist() == run(strided.contiguous(), seeds, positions).tolist()
    tokens = run(probs, seeds, positions)
    for r in (0, 4, 9):
        assert run(probs[r:r + 1], seeds[r:r + 1], positions[r:r + 1]).item() == tokens[r].item()


LAW = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05], dtype=torch.float32)
DRAWS = 200_000


def law_of(probs: torch.Tensor) -> np.ndarray:
    p = probs.double().numpy()
    return p / p.sum()


def wrong_law(p: np.ndarray) -> np.ndarray:
    q = p * p
    return q / q.sum()


@pytest.mark.parametrize("stream", ["positions", "seeds"])
def test_draws_follow_probs(stream):
    """Over many positions (one seed), or many seeds (one position), tokens follow probs
    (G-test with power for TV 0.01); the same counts reject probs squared."""
    p = law_of(LAW)
    assert samples_for_power(p, tv=0.01) <= DRAWS
    index = torch.arange(DRAWS, dtype=torch.int64)
    if stream == "positions":
        seeds, positions = torch.full((DRAWS,), 7, dtype=torch.int64), index
    else:
        seeds, positions = index * 0x9E3779B9 - 2**62, torch.full((DRAWS,), 5, dtype=torch.int64)
    tokens = OP(LAW.repeat(DRAWS, 1), seeds, positions)
    counts = np.bincount(tokens.numpy(), minlength=6)
    assert g_test(counts, p) > 1e-3
    assert g_test(counts, wrong_law(p)) < 1e-6


def joint_counts(first: torch.Tensor, second: torch.Tensor, vocab: int) -> np.ndarray:
    return np.bincount((first * vocab + second).numpy(), minlength=vocab * vocab)


def test_adjacent_positions_are_independent():
    """Draws at positions 2i and 2i + 1 have the product law (G-test on the 36 cells);
    drawing both at position 2i -- a stream that ignores the position -- fails it."""
    p = law_of(LAW)
    product = np.outer(p, p).ravel()
    pairs = DRAWS // 2
    assert samples_for_power(product, tv=0.01) <= pairs
    seeds = torch.full((DRAWS,), 11, dtype=torch.int64)
    tokens = OP(LAW.repeat(DRAWS, 1), seeds, torch.arange(DRAWS, dtype=torch.int64))
    assert g_test(joint_counts(tokens[0::2], tokens[1::2], 6), product) > 1e-3
    even = torch.arange(0, DRAWS, 2, dtype=torch.int64)
    broken = OP(LAW.repeat(DRAWS, 1), seeds, torch.stack([even, even], 1).ravel())
    assert g_test(joint_counts(broken[0::2], broken[1::2], 6), product) < 1e-6


@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0])
def test_shared_noise_couples_two_laws(spread):
    """Draws from two laws p and q under the same noise agree with probability between
    (1 - TV) / (1 + TV) (the Gumbel coupling's guarantee, Daliri et al. 2024) and 1 - TV (the
    best any coupling does): what makes sd/ssd proposals match the target's draws. q's draws
    keyed one position off -- noise not shared -- agree only at sum_t p_t q_t, below the bound."""
    gen = torch.Generator().manual_seed(int(spread * 10))
    vocab, n = 12, 100_000
    p, q = (torch.softmax(torch.randn(vocab, generator=gen) * spread, 0) for _ in range(2))
    tv = 0.5 * float((p - q).abs().sum())
    seeds = torch.full((n,), 3, dtype=torch.int64)
    positions = torch.arange(n, dtype=torch.int64)
    x, y = OP(p.repeat(n, 1), seeds, positions), OP(q.repeat(n, 1), seeds, positions)
    agree = float((x == y).double().mean())
    slack = 4 * math.sqrt(0.25 / n)
    assert (1 - tv) / (1 + tv) - slack < agree < 1 - tv + slack
    apart = float((x == OP(q.repeat(n, 1), seeds, positions + 1)).double().mean())
    independent = float((p * q).sum())
    assert abs(apart - independent) < slack
    assert independent < (1 - tv) / (1 + tv) - 2 * slack


@pytest.mark.parametrize("kind", ["softmax", "peaked", "top_k", "ties"])
@pytest.mark.parametrize("depth", [1, 2, 5, 40])
def test_top_tokens_match_reference(kind, depth):
    """gumbel_top (the ssd tree's ranking of candidates): the depth best of a full scan by
    (score desc, id asc), scores included; its pruning skips only tokens that cannot enter."""
    from ssd import _C

    for i, (vocab, seed, position) in enumerate([(7, 0, 0), (1000, 2**64 - 1, 12), (5000, 99, 2**40)]):
        probs = make_probs(1, vocab, kind, seed=i + depth)[0]
        ids, scores = _C.testing.gumbel_top(probs, seed, position, depth)
        want_ids, want_scores = gumbel_top_ref(probs, seed, position, depth)
        assert ids == want_ids, (vocab, kind, depth)
        assert scores == pytest.approx(want_scores, rel=1e-15)


def small_args(n=3, vocab=11):
    return [make_probs(n, vocab, "softmax", seed=6), torch.tensor([0, -1, 5]), torch.tensor([0, 3, 2**40])]


def test_opcheck():
    torch.library.opcheck(OP.default, small_args())


def _set(index, value):
    def edit(args):
        args[index] = value

    return edit


def _poke(value, row=2, token=4):
    def edit(args):
        args[0][row, token] = value

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set(0, torch.rand(3, 11, dtype=torch.float64)), "probs must be float32, got Double"),
        (_set(0, torch.rand(33)), "probs must have shape \\[N, V\\]"),
        (_set(0, torch.rand(3, 0)), "vocab size must be in \\[1, 2\\^31\\)"),
        (_set(1, torch.tensor([0, 1, 2], dtype=torch.int32)), "seeds must be int64, got Int"),
        (_set(1, torch.tensor([0, 1])), "seeds must have shape \\[N\\] = \\[3\\]"),
        (_set(1, torch.zeros(3, dtype=torch.int64, device="meta")), "seeds must be on cpu like probs"),
        (_set(2, torch.tensor([0.0, 1.0, 2.0])), "positions must be int64, got Float"),
        (_set(2, torch.tensor([[0, 1, 2]])), "positions must have shape \\[N\\]"),
        (_set(2, torch.tensor([4, -3, 0])), "positions must be >= 0; row 1 has -3"),
        (_poke(-0.5), "probs must be finite and >= 0; row 2 has -0.5 at token 4"),
        (_poke(float("nan"), row=0, token=7), "probs must be finite and >= 0; row 0 has nan at token 7"),
        (_poke(float("inf"), row=1, token=0), "probs must be finite and >= 0; row 1 has inf at token 0"),
    ],
)
def test_invalid_arguments_are_rejected(edit, message):
    args = small_args()
    edit(args)
    with pytest.raises(RuntimeError, match=message):
        OP(*args)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab", [1, 2, 7, 1000, 49152, 151936])
def test_cuda_matches_cpu(vocab, kind):
    """Token for token (E_t can differ in its last bit, CUDA's log being within 1 ulp of
    glibc's, which could only matter for two scores within ~1e-16 of each other)."""
    n = 64
    probs = make_probs(n, vocab, kind, seed=vocab + 1)
    seeds, positions = keys(n, offset=3 * vocab)
    assert torch.equal(run(probs.cuda(), seeds, positions).cpu(), run(probs, seeds, positions))


@pytest.mark.cuda
def test_cuda_matches_cpu_on_law_batches():
    tokens_cpu = OP(LAW.repeat(DRAWS, 1), torch.full((DRAWS,), 7), torch.arange(DRAWS))
    tokens_gpu = OP(LAW.repeat(DRAWS, 1).cuda(), torch.full((DRAWS,), 7).cuda(), torch.arange(DRAWS).cuda())
    assert torch.equal(tokens_gpu.cpu(), tokens_cpu)


@pytest.mark.cuda
def test_cuda_edge_rows_match_cpu():
    """No support, one token at the last id, a tiny mass, a uniform block; strided rows."""
    probs = torch.zeros(4, 151936)
    probs[1, 151935] = 0.25
    probs[2, 8] = 1e-30
    probs[3, 70000:70004] = 0.25
    seeds, positions = [0, 3, 2**64 - 1, 7], [0, 10, 2**40, 3]
    assert torch.equal(run(probs.cuda(), seeds, positions).cpu(), run(probs, seeds, positions))
    assert torch.equal(run(probs[:, ::3].cuda(), seeds, positions).cpu(), run(probs[:, ::3], seeds, positions))


@pytest.mark.cuda
def test_cuda_opcheck_and_rejections():
    args = [a.cuda() for a in small_args()]
    torch.library.opcheck(OP.default, args)
    with pytest.raises(RuntimeError, match="positions must be on cuda:0 like probs"):
        OP(args[0], args[1], args[2].cpu())
    bad = args[0].clone()
    bad[1, 3] = float("nan")
    with pytest.raises(RuntimeError, match="probs must be finite and >= 0; row 1 has nan at token 3"):
        OP(bad, args[1], args[2])
    with pytest.raises(RuntimeError, match="positions must be >= 0; row 0 has -1"):
        OP(args[0], args[1], torch.tensor([-1, 0, 0], device="cuda"))
