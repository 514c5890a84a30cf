"""torch.ops.ssd.saguaro_sample against the pure-torch reference (CPU) and the CPU op (CUDA)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.reference.saguaro_sample_ref import inverse_cdf, saguaro_probs
from tests.reference.sampling_ref import processed_probs
from tests.reference.stats import g_test, samples_for_power

OP = torch.ops.ssd.saguaro_sample

# (temperature, top_k, top_p, fanout, downweight)
SETTINGS = [
    (1.0, 0, 1.0, 0, 0.5),
    (1.0, 0, 1.0, 4, 1.0),
    (1.0, 0, 1.0, 1, 0.0),
    (1.0, 0, 1.0, 3, 0.1),
    (0.7, 0, 1.0, 8, 0.5),
    (1.3, 50, 1.0, 4, 0.3),
    (1.0, 5, 1.0, 5, 0.0),  # every kept token downweighted: sigma = p
    (1.0, 5, 1.0, 9, 0.2),
    (0.8, 0, 0.9, 2, 0.5),
    (1.0, 20, 0.8, 3, 0.0),
    (1.0, 0, 0.3, 64, 0.7),
    (2.0, 3, 0.5, 1, 0.25),
    (0.0, 0, 1.0, 4, 0.5),
    (0.0, 10, 0.5, 0, 1.0),
]


def make_logits(n: int, vocab: int, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values: ties at every cut
        return torch.randint(-3, 3, (n, vocab), generator=g).to(torch.float32)
    scale = 4.0 if kind == "peaked" else 1.0
    return torch.randn(n, vocab, generator=g) * scale


def run(logits, settings, uniforms=None):
    """Calls the op with one row per setting; returns (tokens, probs)."""
    n = logits.shape[0]
    cols = list(zip(*settings))
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64, device=logits.device)  # noqa: E731
    i64 = lambda xs: torch.tensor(xs, dtype=torch.int64, device=logits.device)  # noqa: E731
    if uniforms is None:
        uniforms = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    probs = torch.empty_like(logits)
    tokens = OP(logits, f64(cols[0]), i64(cols[1]), f64(cols[2]), i64(cols[3]), f64(cols[4]),
                uniforms.to(logits.device), probs)
    return tokens, probs, uniforms


@pytest.mark.parametrize("kind", ["normal", "peaked", "ties"])
@pytest.mark.parametrize("vocab", [1, 2, 7, 1000, 49152, 151936])
def test_rows_match_reference(vocab, kind):
    logits = make_logits(len(SETTINGS), vocab, kind, seed=vocab)
    tokens, probs, uniforms = run(logits, SETTINGS)
    torch.testing.assert_close(probs.sum(1, dtype=torch.float64), torch.ones(len(SETTINGS), dtype=torch.float64),
                               atol=1e-5, rtol=0)
    for r, (t, k, p, f, c) in enumerate(SETTINGS):
        sigma = saguaro_probs(logits[r], t, k, p, f, c)
        torch.testing.assert_close(probs[r].double(), sigma, atol=1e-7, rtol=1e-5, msg=f"row {r}: {SETTINGS[r]}")
        assert int(tokens[r]) == inverse_cdf(probs[r], float(uniforms[r])), f"row {r}"


def test_temperature_zero_is_one_hot_at_lowest_argmax():
    logits = torch.tensor([[0.0, 3.0, -1.0, 3.0, 2.0]] * 3)
    settings = [(0.0, 0, 1.0, 0, 1.0), (0.0, 2, 0.5, 2, 0.0), (0.0, 0, 1.0, 1, 0.5)]
    tokens, probs, _ = run(logits, settings, torch.tensor([0.0, 0.5, 0.999], dtype=torch.float64))
    assert tokens.tolist() == [1, 1, 1]
    assert torch.equal(probs, torch.nn.functional.one_hot(tokens, 5).float())


def test_no_downweight_returns_processed_distribution():
    """F = 0 or C = 1 leave p untouched; F covering the support at C = 0 falls back to p."""
    logits = make_logits(1, 3000, "normal", seed=1).repeat(4, 1)
    settings = [(0.9, 40, 0.95, 0, 0.3), (0.9, 40, 0.95, 5, 1.0), (0.9, 40, 0.95, 40, 0.0),
                (0.9, 40, 0.95, 1000, 0.5)]
    _, probs, _ = run(logits, settings)
    for r in range(1, 4):
        assert torch.equal(probs[r], probs[0])
    torch.testing.assert_close(probs[0].double(), processed_probs(logits[0], 0.9, 40, 0.95), atol=1e-7, rtol=1e-5)


def test_downweight_zero_removes_top_tokens():
    logits = make_logits(1, 500, "ties", seed=2)
    _, probs, _ = run(logits, [(1.0, 0, 1.0, 7, 0.0)])
    top = torch.sort(-logits[0], stable=True).indices[:7]
    assert probs[0, top].eq(0).all() and probs[0].sum().item() == pytest.approx(1.0, abs=1e-5)


def test_determinism_and_row_independence():
    logits = make_logits(len(SETTINGS), 20000, "normal", seed=3)
    tokens, probs, uniforms = run(logits, SETTINGS)
    tokens2, probs2, _ = run(logits, SETTINGS, uniforms)
    assert torch.equal(tokens, tokens2) and torch.equal(probs, probs2)
    tok_alone, probs_alone, _ = run(logits[5:6], SETTINGS[5:6], uniforms[5:6])
    assert tok_alone.item() == tokens[5].item() and torch.equal(probs_alone[0], probs[5])


@pytest.mark.parametrize("downweight", [0.1, 0.5, 1.0])
def test_empirical_law_matches_sigma(downweight):
    """Token frequencies over many uniforms follow sigma (G-test with power for TV 0.01)."""
    logits = make_logits(1, 16, "normal", seed=4)[0]
    setting = (0.8, 10, 0.95, 2, downweight)
    sigma = saguaro_probs(logits, *setting).numpy()
    n = samples_for_power(sigma, tv=0.01)
    uniforms = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    tokens, _, _ = run(logits.repeat(n, 1), [setting] * n, uniforms)
    counts = np.bincount(tokens.numpy(), minlength=16)
    assert g_test(counts, sigma) > 1e-3
    if downweight != 1.0:  # negative control: the same counts reject p
        p = processed_probs(logits, 0.8, 10, 0.95).numpy()
        assert g_test(counts, p) < 1e-6


def small_args(n=3, vocab=11):
    logits = make_logits(n, vocab, "normal", seed=6)
    f64 = lambda *xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    i64 = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return [logits, f64(1.0, 0.5, 0.0), i64(0, 4, 0), f64(1.0, 0.9, 1.0), i64(2, 1, 3), f64(0.5, 0.0, 1.0),
            f64(0.1, 0.6, 0.9), torch.empty(n, vocab)]


def test_opcheck():
    torch.library.opcheck(OP.default, small_args())


@pytest.mark.parametrize(
    "index, value, message",
    [
        (5, torch.tensor([0.5, 1.5, 0.0], dtype=torch.float64), "downweight must be in \\[0, 1\\]; row 1"),
        (4, torch.tensor([2, -1, 0]), "fanout must be >= 0; row 1"),
        (6, torch.tensor([0.1, 0.2, 1.0], dtype=torch.float64), "uniforms must be in \\[0, 1\\); row 2"),
        (3, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64), "top_p must be in \\(0, 1\\]; row 0"),
        (1, torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64), "temperature must be finite"),
        (2, torch.tensor([0, -3, 0]), "top_k must be >= 0"),
        (1, torch.tensor([1.0, 1.0, 1.0]), "temperature must be Double"),
        (5, torch.tensor([0.5, 0.5], dtype=torch.float64), "downweight must have shape \\[N\\]"),
        (7, torch.empty(3, 12), "probs must have the shape of logits"),
    ],
)
def test_invalid_arguments_are_rejected(index, value, message):
    args = small_args()
    args[index] = value
    with pytest.raises(RuntimeError, match=message):
        OP(*args)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["normal", "peaked", "ties"])
@pytest.mark.parametrize("vocab", [1, 7, 1000, 151936])
def test_cuda_matches_cpu(vocab, kind):
    """Same kept set as the CPU op; values to 1e-5 relative (fixed-order GPU sums
    vs sequential CPU sums, both in double, differ in the last bits); tokens equal
    unless u * total falls within 1e-6 of a CDF step."""
    logits = make_logits(len(SETTINGS), vocab, kind, seed=vocab + 7)
    tok_cpu, probs_cpu, uniforms = run(logits, SETTINGS)
    tok_gpu, probs_gpu, _ = run(logits.cuda(), SETTINGS, uniforms)
    probs_gpu, tok_gpu = probs_gpu.cpu(), tok_gpu.cpu()
    assert torch.equal(probs_gpu > 0, probs_cpu > 0)
    torch.testing.assert_close(probs_gpu, probs_cpu, atol=1e-7, rtol=1e-5)
    cdf = torch.cumsum(probs_cpu.double(), 1)
    for r in range(len(SETTINGS)):
        if tok_gpu[r] != tok_cpu[r]:
            target = float(uniforms[r]) * float(cdf[r, -1])
            assert (cdf[r] - target).abs().min() < 1e-6, f"row {r}: {SETTINGS[r]}"


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["normal", "peaked", "ties", "bf16"])
def test_cuda_top_p_cut_matches_cpu(kind):
    """The top-p radix select keeps exactly the CPU's set over a sweep of top_p,
    alone and under top-k; bf16-rounded logits tie many tokens in the bulk."""
    top_ps = [1e-9, 0.05, 0.2, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
    settings = [(t, k, p, 0, 1.0) for p in top_ps for t, k in [(1.0, 0), (0.6, 0), (1.0, 1000)]]
    logits = make_logits(len(settings), 151936, "normal" if kind == "bf16" else kind, seed=21)
    if kind == "bf16":
        logits = (logits * 3).bfloat16().float()
    _, probs_cpu, uniforms = run(logits, settings)
    _, probs_gpu, _ = run(logits.cuda(), settings, uniforms)
    assert torch.equal(probs_gpu.cpu() > 0, probs_cpu > 0)


@pytest.mark.cuda
def test_cuda_nan_logits_match_cpu():
    """NaN logits (either sign): greedy rows are kernels::argmax exactly (a NaN is
    never taken, but one at id 0 keeps id 0); a NaN in a row without top-k/top-p
    makes every probability NaN and the draw the last token, on both."""
    vocab = 4099
    logits = make_logits(5, vocab, "normal", seed=11)
    neg_nan = torch.tensor([-4194304], dtype=torch.int32).view(torch.float32)  # 0xffc00000
    logits[0, [5, 77, 4000]] = float("nan")
    logits[1, 0] = float("nan")
    logits[2, [3, 9]] = float("nan")
    logits[3, [3, 9]] = neg_nan
    logits[4, 100] = neg_nan
    settings = [(0.0, 0, 1.0, 0, 1.0), (0.0, 0, 1.0, 0, 1.0), (1.0, 0, 1.0, 4, 0.5), (0.0, 0, 1.0, 0, 1.0),
                (0.0, 0, 1.0, 0, 1.0)]
    tok_cpu, probs_cpu, uniforms = run(logits, settings)
    tok_gpu, probs_gpu, _ = run(logits.cuda(), settings, uniforms)
    assert tok_cpu[1] == 0 and tok_cpu[2] == vocab - 1 and probs_cpu[2].isnan().all()
    assert torch.equal(tok_gpu.cpu(), tok_cpu)
    assert torch.equal(probs_gpu.cpu().isnan(), probs_cpu.isnan())
    assert torch.equal(probs_gpu.cpu().nan_to_num(), probs_cpu.nan_to_num())


@pytest.mark.cuda
def test_cuda_opcheck_and_determinism():
    args = [a.cuda() for a in small_args()]
    torch.library.opcheck(OP.default, args)
    logits = make_logits(len(SETTINGS), 49152, "ties", seed=8).cuda()
    tokens, probs, uniforms = run(logits, SETTINGS)
    tokens2, probs2, _ = run(logits, SETTINGS, uniforms)
    assert torch.equal(tokens, tokens2) and torch.equal(probs, probs2)
