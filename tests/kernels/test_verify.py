"""torch.ops.ssd.verify: bitwise agreement with the reference, and the law of the
emitted tokens checked by statistics (with broken verifiers as negative controls)."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  (registers torch.ops.ssd)
from tests.reference.sampling_ref import processed_probs
from tests.reference.stats import g_test, samples_for_power
from tests.reference.verify_ref import inverse_cdf, verify_ref

OP = torch.ops.ssd.verify.default
F64 = torch.float64

# --------------------------------------------------------------------------- exactness


def random_batch(seed, batch, k, vocab, *, greedy=0.2, one_hot=0.3, ties=False):
    """Mixed rows: temperature 0 / sampled, one-hot / full q, top-k / top-p, n <= K.
    Returns the op's arguments as a tuple."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 2.5
    if ties:
        logits = torch.round(logits * 2) / 2
    draft = logits[:, :k] + torch.randn(batch, k, vocab, generator=g)
    q = torch.softmax(draft, -1)
    proposals = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    temperature = torch.tensor([0.6, 1.0, 1.4], dtype=F64)[torch.randint(0, 3, (batch,), generator=g)]
    greedy_rows = torch.rand(batch, generator=g) < greedy
    temperature[greedy_rows] = 0.0
    # Greedy rows propose the argmax most of the time, so acceptance runs past position 1.
    use_argmax = greedy_rows[:, None] & (torch.rand(batch, k, generator=g) < 0.8)
    proposals = torch.where(use_argmax, logits[:, :k].argmax(-1), proposals)
    top_k = torch.tensor([0, 1, 3, vocab, vocab + 5])[torch.randint(0, 5, (batch,), generator=g)]
    top_p = torch.tensor([1.0, 0.95, 0.6, 0.2], dtype=F64)[torch.randint(0, 4, (batch,), generator=g)]
    return (
        logits,
        proposals,
        torch.randint(0, k + 1, (batch,), generator=g),
        q,
        torch.rand(batch, generator=g) < one_hot,
        temperature,
        top_k,
        top_p,
        torch.rand(batch, k, generator=g, dtype=F64),
        torch.rand(batch, generator=g, dtype=F64),
    )


def assert_matches_reference(args):
    accepted, bonus = OP(*args)
    ref_accepted, ref_bonus = verify_ref(*args)
    assert torch.equal(accepted, ref_accepted)
    assert torch.equal(bonus, ref_bonus)
    return accepted


@pytest.mark.parametrize(
    "seed,batch,k,vocab,ties",
    [
        (0, 1, 1, 2, False),
        (1, 24, 3, 5, False),
        (2, 48, 4, 64, False),
        (3, 40, 4, 64, True),
        (4, 16, 8, 1000, False),
        (5, 16, 6, 1000, True),
        (6, 12, 0, 50, False),
    ],
)
def test_matches_reference(seed, batch, k, vocab, ties):
    accepted = assert_matches_reference(random_batch(seed, batch, k, vocab, ties=ties))
    if k > 1:
        assert 0 < accepted.float().mean() < k, "the batch should exercise acceptance and rejection"


def test_matches_reference_full_vocab():
    """Qwen-sized vocabulary; rows cover greedy, one-hot, top-k + top-p and plain sampling."""
    args = list(random_batch(7, 6, 3, 151_936, greedy=0.0, one_hot=0.0))
    args[2] = torch.tensor([3, 3, 2, 3, 1, 3])  # num_proposals
    args[4] = torch.tensor([False, True, False, False, True, False])  # one_hot
    args[5] = torch.tensor([1.0, 0.8, 0.0, 1.2, 1.0, 0.7], dtype=F64)  # temperature
    args[6] = torch.tensor([0, 0, 0, 50, 0, 1000])  # top_k
    args[7] = torch.tensor([1.0, 0.9, 1.0, 0.9, 1.0, 0.5], dtype=F64)  # top_p
    assert_matches_reference(tuple(args))


def test_residual_without_mass_falls_back_to_p():
    """q == p and a proposal outside p's support: rejected, the residual is all zero."""
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]]])
    p = processed_probs(logits[0, 0], 1.0, top_k=2).to(torch.float32)
    args = (
        logits,
        torch.tensor([[3]]),
        torch.tensor([1]),
        p.reshape(1, 1, 4),
        torch.tensor([False]),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([2]),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([[0.5]], dtype=F64),
        torch.tensor([0.9], dtype=F64),
    )
    accepted, bonus = OP(*args)
    assert accepted.item() == 0 and bonus.item() == inverse_cdf(p, 0.9) == 1
    assert_matches_reference(args)


def test_rows_are_independent_of_the_batch():
    args = random_batch(8, 20, 4, 300)
    accepted, bonus = OP(*args)
    for b in (0, 7, 19):
        one = OP(*(a[b : b + 1] for a in args))
        assert one[0].item() == accepted[b].item() and one[1].item() == bonus[b].item()


def test_opcheck():
    torch.library.opcheck(OP, random_batch(9, 5, 3, 17))


def test_rejects_bad_arguments():
    args = list(random_batch(10, 4, 2, 9))
    with pytest.raises(RuntimeError, match="q_probs"):
        OP(*args[:3], args[3][:, :, :5], *args[4:])
    with pytest.raises(RuntimeError, match="temperature"):
        OP(*args[:5], args[5].float(), *args[6:])
    bad_n = args[2].clone()
    bad_n[1] = 3
    with pytest.raises(RuntimeError, match="num_proposals"):
        OP(*args[:2], bad_n, *args[3:])
    bad_x = args[1].clone()
    bad_x[0, 0] = 9
    n_full = torch.full_like(args[2], 2)
    with pytest.raises(RuntimeError, match="proposals"):
        OP(args[0], bad_x, n_full, *args[3:])


# --------------------------------------------------------------------------- output law

ALPHA = 1e-3  # level of every G-test; the power requirement below uses the same level


def saguaro_q(probs: torch.Tensor, fanout: int, downweight: float) -> torch.Tensor:
    """sigma_{F,C}: the top-F tokens (value desc, id asc) scaled by C, renormalised. probs: [V]."""
    order = torch.sort(-probs, stable=True).indices
    scale = torch.ones_like(probs)
    scale[order[:fanout]] = downweight
    out = probs * scale
    return out / out.sum()


def law_case(name: str, seed: int):
    """Fixed target logits and proposal laws per position, one row per trial.
    Returns (op args, laws [K+1, V] float64)."""
    g = torch.Generator().manual_seed(seed)
    # Trials: enough rows reach the last position for the power requirement.
    vocab, k, temperature, top_k, top_p, trials = {
        "random_q": (6, 3, 1.0, 0, 1.0, 200_000),
        "saguaro_c0.1": (8, 2, 1.0, 0, 1.0, 250_000),
        "saguaro_c0.5": (7, 2, 0.8, 0, 1.0, 200_000),
        "one_hot": (5, 2, 1.0, 0, 1.0, 300_000),
        "top_k": (8, 2, 0.8, 3, 1.0, 200_000),
        "top_p": (8, 3, 1.6, 0, 0.85, 200_000),
        "top_k_top_p": (8, 2, 1.0, 4, 0.9, 200_000),
    }[name]
    logits = torch.randn(k + 1, vocab, generator=g) * 1.5
    laws = torch.stack([processed_probs(row, temperature, top_k, top_p) for row in logits])
    # Drafts that resemble the target, as real ones do, so acceptance is substantial.
    draft = torch.stack([processed_probs(row, 1.0) for row in logits[:k] + 0.5 * torch.randn(k, vocab, generator=g)])
    if name.startswith("saguaro"):
        c = float(name.split("_c")[1])
        draft = torch.stack([saguaro_q(row, 2, c) for row in draft])
    draft = draft.to(torch.float32)
    proposals = torch.stack([torch.multinomial(draft[i], trials, True, generator=g) for i in range(k)], 1)
    q = draft
    if name == "one_hot":
        # Never read on one-hot rows: NaN would poison any accidental use.
        q = torch.full_like(draft, float("nan"))
    args = (
        logits.expand(trials, k + 1, vocab),
        proposals,
        torch.full((trials,), k),
        q.expand(trials, k, vocab),
        torch.full((trials,), name == "one_hot"),
        torch.full((trials,), temperature, dtype=F64),
        torch.full((trials,), top_k),
        torch.full((trials,), top_p, dtype=F64),
        torch.rand(trials, k, generator=g, dtype=F64),
        torch.rand(trials, generator=g, dtype=F64),
    )
    return args, laws


def emitted_law_pvalues(accepted, bonus, proposals, laws):
    """G-test p-value per position i (0-based) of the i-th emitted token (x_{i+1} if
    accepted, else the bonus) among rows whose first i proposals were accepted, and
    whether that position has the rows to detect TV 0.01 with power 0.9 at level ALPHA.
    Returns [(p-value, powered)] for positions 0..K."""
    k, vocab = proposals.shape[1], laws.shape[1]
    out = []
    for i in range(k + 1):
        rows = accepted >= i
        token = bonus[rows]
        if i < k:
            token = torch.where(accepted[rows] > i, proposals[rows, i], token)
        law = laws[i].numpy()
        powered = samples_for_power(law, tv=0.01, alpha=ALPHA, power=0.9) <= int(rows.sum())
        out.append((g_test(torch.bincount(token, minlength=vocab).numpy(), law), powered))
    return out


LAW_CASES = ["random_q", "saguaro_c0.1", "saguaro_c0.5", "one_hot", "top_k", "top_p", "top_k_top_p"]


@pytest.mark.parametrize("seed,name", list(enumerate(LAW_CASES)))
def test_output_law_is_the_target(seed, name):
    args, laws = law_case(name, 100 + seed)
    accepted, bonus = OP(*args)
    results = emitted_law_pvalues(accepted, bonus, args[1], laws)
    assert all(powered for _, powered in results), results
    assert min(pv for pv, _ in results) > ALPHA, results


def batched_inverse_cdf(dist: torch.Tensor, u: torch.Tensor, normalise: bool = True) -> torch.Tensor:
    """dist: [B, V] masses, u: [B] -> [B] tokens; past the mass: the last token with mass."""
    cum = torch.cumsum(dist, 1)
    target = u * (cum[:, -1] if normalise else 1.0)
    idx = (cum <= target[:, None]).sum(1)
    last = (dist > 0).to(torch.int64).cumsum(1).argmax(1)
    return torch.minimum(idx, last)


def broken_verify(args, laws, mode):
    """Pure-torch verifiers with one deliberate flaw, on the same inputs as the op:
    greedy_accept: accept iff x_i == argmax p_i (at temperature 1), bonus from p;
    bonus_from_p: correct acceptance, bonus from p_i instead of the residual;
    unnormalised_residual: correct acceptance, residual not renormalised."""
    _, proposals, _, q, _, _, _, _, accept_u, bonus_u = args
    batch, k = proposals.shape
    p = laws.to(torch.float32)
    accepted = torch.full((batch,), k)
    alive = torch.ones(batch, dtype=torch.bool)
    for i in range(k):
        x = proposals[:, i]
        if mode == "greedy_accept":
            ok = x == p[i].argmax()
        else:
            ok = accept_u[:, i] * q[:, i].gather(1, x[:, None])[:, 0].double() < p[i][x].double()
        accepted[alive & ~ok] = i
        alive &= ok
    at = accepted.clamp(max=k - 1)
    residual = torch.clamp(p[accepted] - q[torch.arange(batch), at], min=0.0)
    dist = torch.where((accepted < k)[:, None] & (mode != "bonus_from_p"), residual, p[accepted])
    bonus = batched_inverse_cdf(dist.double(), bonus_u, normalise=mode != "unnormalised_residual")
    return accepted, bonus


@pytest.mark.parametrize("mode", ["greedy_accept", "bonus_from_p", "unnormalised_residual"])
def test_broken_verifiers_fail_the_law_test(mode):
    args, laws = law_case("random_q", 100)
    accepted, bonus = broken_verify(args, laws, mode)
    results = emitted_law_pvalues(accepted, bonus, args[1], laws)
    assert min(pv for pv, powered in results if powered) < ALPHA, results


# --------------------------------------------------------------------------- CUDA


def to_cuda(args):
    return tuple(a.cuda() for a in args)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "seed,batch,k,vocab,ties",
    [(20, 64, 4, 64, False), (21, 64, 4, 64, True), (22, 32, 8, 5000, True), (23, 8, 3, 151_936, False)],
)
def test_cuda_matches_cpu(seed, batch, k, vocab, ties):
    args = random_batch(seed, batch, k, vocab, ties=ties)
    cpu = OP(*args)
    gpu = OP(*to_cuda(args))
    assert torch.equal(gpu[0].cpu(), cpu[0])
    assert torch.equal(gpu[1].cpu(), cpu[1])


@pytest.mark.cuda
@pytest.mark.parametrize("name", LAW_CASES)
def test_cuda_matches_cpu_on_law_batches(name):
    args, _ = law_case(name, 200)
    cpu = OP(*args)
    gpu = OP(*to_cuda(args))
    assert torch.equal(gpu[0].cpu(), cpu[0])
    assert torch.equal(gpu[1].cpu(), cpu[1])


@pytest.mark.cuda
def test_cuda_opcheck():
    torch.library.opcheck(OP, to_cuda(random_batch(24, 5, 3, 17)))
