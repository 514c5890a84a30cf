"""Mode "ssd": the output law on paths the law tests of test_ssd.py do not reach.

Preemption at temperature > 0, rounds that verify fewer than K proposals, one
batch mixing greedy and sampled requests, and fallback "auto". Same harness
(the vocabulary-4 pair, the first N_TOKENS tokens after PROMPT, G-tests of each
position's marginal and one cross-round pair against the target's exact law);
each path also runs with a deliberately broken variant (a TestingConfig fault)
that its law test must reject. The broken runs take a fraction of the law
test's samples: rejecting with fewer samples shows the full test's power.
These are the rejection coupling's paths (coupling="rejection"); the Gumbel
coupling's are in test_gumbel_coupling.py.
"""
import random

import numpy as np

from ssd import LLM, SamplingParams
from ssd.testing import TestingConfig
from tests.reference import law
from tests.reference.stats import g_test, samples_for_power

VOCAB = 4
PROMPT = [1, 3, 0, 2]
N_TOKENS = 7  # with k = 2 (up to 3 tokens a round), at least three rounds
K = 2
FANOUT = [2, 2, 2]
ALPHA = 0.001  # the level of each view's G-test
BROKEN = 1e-6  # a broken variant's smallest p-value must be below this


def target_laws(model, temperature, top_k, top_p, prompt=PROMPT):
    return law.views(law.exact_joint(model, prompt, N_TOKENS, VOCAB, temperature, top_k, top_p))


def law_size(laws):
    return max(samples_for_power(p, tv=0.01, alpha=ALPHA, power=0.9) for p in laws)


def p_values(outs, laws):
    counts = law.counts_of(outs, VOCAB, N_TOKENS)
    return [g_test(observed, expected) for observed, expected in zip(law.views(counts), laws)]


def sampled(n, temperature, top_k, top_p, seed0, max_tokens=N_TOKENS):
    return [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                           ignore_eos=True, seed=seed0 + i) for i in range(n)]


def run(small_pair, settings, engine, testing=None, fraction=1, max_tokens=N_TOKENS):
    """Samples PROMPT's law test (or `1 / fraction` of it) from ssd; returns (outputs, stats, laws)."""
    target, draft = small_pair
    engine = {"max_model_len": 32, "max_batch": 512, "coupling": "rejection", **engine}
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=K, fanout=FANOUT, max_batched_tokens=8192, testing=testing,
             **engine) as ssd:
        laws = target_laws(ssd.model, *settings)
        n = law_size(laws) // fraction
        outs = ssd.generate([PROMPT] * n, sampled(n, *settings, seed0=11_000_000, max_tokens=max_tokens))
        stats = ssd.stats()
    return outs, stats, laws


# Preemption: a KV cache of 512 tokens for up to 256 sequences of up to 13
# positions (prompt, 7 tokens and the lookahead) sends most requests back to
# the queue at least once; each resumes by recomputing its KV, and the draft
# worker starts it afresh.
PREEMPTION = ((1.0, 0, 1.0), {"saguaro_c": 0.3, "fallback": "neural", "max_batch": 256, "kv_block_size": 4,
                              "kv_capacity_tokens": 512})


def test_law_under_preemption(small_pair):
    outs, stats, laws = run(small_pair, *PREEMPTION)
    resumed = sum(o.metrics["num_preemptions"] > 0 for o in outs)
    assert resumed >= len(outs) // 4, f"only {resumed} of {len(outs)} requests were preempted"
    assert stats["num_preemptions"] >= resumed
    assert stats["cache_hits"] > 0 and stats["fallback_neural"] > 0
    assert min(p_values(outs, laws)) > ALPHA


def test_broken_resume_stream_fails_the_preemption_law_test(small_pair):
    """Fault: after a preemption every round of the resumed sequence repeats one set of draws."""
    outs, stats, laws = run(small_pair, *PREEMPTION, testing=TestingConfig(fault_resume_stream=True), fraction=4)
    assert stats["num_preemptions"] >= len(outs) // 4
    assert min(p_values(outs, laws)) < BROKEN


# Truncated proposals: max_model_len ends every request at its 7th token, and
# the scheduler gives a round only the proposals that still fit, so a round
# at the last position verifies one of the speculation's two tokens.
TRUNCATED = ((0.9, 3, 0.9), {"saguaro_c": 0.3, "fallback": "neural", "max_model_len": len(PROMPT) + N_TOKENS})


def test_law_with_truncated_proposals(small_pair):
    outs, stats, laws = run(small_pair, *TRUNCATED, max_tokens=64)
    assert all(o.finish_reason == "length" for o in outs)
    short = sum(o.metrics["draft_tokens_proposed"] < K * o.metrics["rounds"] for o in outs)
    assert short >= len(outs) // 4, f"only {short} of {len(outs)} requests had a round of fewer than K proposals"
    assert stats["draft_tokens_proposed"] < K * stats["rounds"]
    assert stats["cache_hits"] > 0
    assert min(p_values(outs, laws)) > ALPHA


def test_broken_truncated_q_fails_the_truncation_law_test(small_pair):
    """Fault: a truncated round's proposals are verified against the speculation's last q rows."""
    outs, _, laws = run(small_pair, *TRUNCATED, testing=TestingConfig(fault_truncated_q=True), fraction=4,
                        max_tokens=64)
    assert min(p_values(outs, laws)) < BROKEN


# One batch: the sampled requests of two settings with different top-k /
# top-p in turn, and a greedy one (over 64 prompts) first and before every
# 7th sampled one. The default fan-out ("confidence") gives greedy sequences
# confidence-ranked branches and sampled ones geometric ones, in the same trees.
MIXED_SETTINGS = {"a": (1.0, 3, 1.0), "b": (0.8, 0, 0.7)}
MIXED_SEEDS = {"a": 12_000_000, "b": 13_000_000}
MIXED_ENGINE = {"saguaro_c": 0.3, "fallback": "neural", "fanout": "confidence"}


def greedy_prompts():
    rng = random.Random(3)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(2, 7))] for _ in range(64)]


def mixed_requests(sizes, prompts):
    """[(kind, prompt, params)], kind "g" (greedy, over `prompts` in turn), "a" or "b"."""
    rows = []
    for i in range(max(sizes.values())):
        for kind in ("a", "b"):
            if i < sizes[kind]:
                rows.append((kind, PROMPT, sampled(1, *MIXED_SETTINGS[kind], seed0=MIXED_SEEDS[kind] + i)[0]))
    greedy = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    out = []
    for j, row in enumerate(rows):
        if j % 7 == 0:
            out.append(("g", prompts[(j // 7) % len(prompts)], greedy))
        out.append(row)
    return out


def run_mixed(small_pair, testing=None, fraction=1):
    """Returns ({"a": p-values, "b": p-values}, the greedy outputs, their argmax paths)."""
    target, draft = small_pair
    prompts = greedy_prompts()
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=K, max_model_len=32, max_batch=512, max_batched_tokens=8192,
             testing=testing, coupling="rejection", **MIXED_ENGINE) as ssd:
        laws = {kind: target_laws(ssd.model, *s) for kind, s in MIXED_SETTINGS.items()}
        argmax_paths = [np.unravel_index(int(j.argmax()), j.shape) for j in
                        (law.exact_joint(ssd.model, p, N_TOKENS, VOCAB, 0.0, 0, 1.0) for p in prompts)]
        rows = mixed_requests({kind: law_size(v) // fraction for kind, v in laws.items()}, prompts)
        outs = ssd.generate([r[1] for r in rows], [r[2] for r in rows])
    greedy = [o.token_ids for o, r in zip(outs, rows) if r[0] == "g"]
    want = [[int(t) for t in argmax_paths[g % len(prompts)]] for g in range(len(greedy))]
    p = {kind: p_values([o for o, r in zip(outs, rows) if r[0] == kind], laws[kind]) for kind in laws}
    return p, greedy, want


def test_law_of_sampled_rows_in_a_mixed_batch(small_pair):
    p, greedy, want = run_mixed(small_pair)
    assert greedy == want
    assert min(p["a"]) > ALPHA and min(p["b"]) > ALPHA


def test_broken_batch_top_kp_fails_the_mixed_batch_law_test(small_pair):
    """Fault: the first verified request's top-k / top-p (a greedy one's: none) serve every request."""
    p, greedy, want = run_mixed(small_pair, testing=TestingConfig(fault_batch_top_kp=True), fraction=8)
    assert greedy == want  # greedy rows ignore top-k / top-p
    assert min(p["a"]) < BROKEN and min(p["b"]) < BROKEN


# fallback "auto": the speed model picks a kind per worker batch from measured
# times, so how often each kind runs varies from run to run (in trials from a
# few dozen fast rounds to nearly all). auto_alternate takes them in turn, so
# every run mixes both kinds within sequences and the law test has power
# against a fault on either.
AUTO = ((1.0, 0, 0.8), {"saguaro_c": 0.3, "fallback": "auto"})


def test_law_with_auto_fallback(small_pair):
    outs, stats, laws = run(small_pair, *AUTO, testing=TestingConfig(auto_alternate=True))
    assert stats["fallback_fast"] >= len(outs) // 10 and stats["fallback_neural"] >= len(outs) // 10
    both = sum(o.metrics["fallback_fast"] > 0 and o.metrics["fallback_neural"] > 0 for o in outs)
    assert both >= len(outs) // 20, f"only {both} requests saw both fallback kinds"
    assert stats["cache_hits"] > 0
    assert min(p_values(outs, laws)) > ALPHA


def test_broken_fast_fallback_fails_the_auto_law_test(small_pair):
    """Fault: fast-fallback proposals are verified greedily at any temperature."""
    outs, stats, laws = run(small_pair, *AUTO, testing=TestingConfig(auto_alternate=True, fault_fast_argmax=True),
                            fraction=4)
    assert stats["fallback_fast"] > 0
    assert min(p_values(outs, laws)) < BROKEN
