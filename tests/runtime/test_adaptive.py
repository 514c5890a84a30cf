"""Adaptive speculation (EngineConfig.adaptive): exactness under switching lookaheads, k = 32, the step model.

The adaptive policy decides each round's lookahead (how many of the k
proposals the target verifies; 0 is an autoregressive step) and, in ssd,
whether the draft builds trees, from what is known before the verify forward.
Which lookahead a round gets depends on measured times, so the exactness tests
force it (TestingConfig.forced_lookahead: lookaheads switching within every
request and differing across a batch) and check, whatever the schedule:
- greedy sd and ssd equal ar, at k = 3 and k = 32 (vocabulary-256 pair);
- the sampled law (vocabulary-4 pair, the harness of test_ssd_law_paths.py),
  under both couplings, at k = 2 and k = 32;
- a lookahead chosen from the round's own target logits
  (TestingConfig.fault_peek_target) breaks the law, and the law test says so;
- a tree built for a round verifying V < k proposals covers the outcome
  "all V accepted, bonus x_{V+1}" (with the target as its own draft that is
  every outcome, so most rounds hit).
The step model (ssd._C.plan_step) is checked against plans worked out by hand.
"""
import random
import time

import pytest

from ssd import LLM, EngineConfig, SamplingParams, _C
from ssd.testing import TestingConfig
from tests.runtime.test_ssd_law_paths import ALPHA, BROKEN, PROMPT, law_size, p_values, sampled, target_laws

FORCED = (0, 3, 1, 2, 0, 3, 3, 1)  # cycled by (step + request id): switches every round
FORCED_32 = (0, 32, 5, 17, 1, 32, 0, 9)


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(n)]


def greedy(n, max_tokens=40):
    return [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True) for _ in range(n)]


@pytest.fixture(scope="module")
def ar_greedy(pair):
    with LLM(pair[0], max_model_len=256) as ar:
        return [o.token_ids for o in ar.generate(prompts(16), greedy(16))]


# ---- temperature 0: every schedule reproduces ar ----

@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
@pytest.mark.parametrize("draft_kind", ["random", "target"])
@pytest.mark.parametrize("mode,k,forced", [("sd", 3, FORCED), ("ssd", 3, FORCED), ("sd", 32, FORCED_32),
                                           ("ssd", 32, FORCED_32), ("ssd", 3, ()), ("ssd", 32, ()),
                                           ("sd", 32, ())])
@pytest.mark.parametrize("max_batch", [1, 8])
def test_greedy_equals_ar(pair, ar_greedy, mode, k, forced, draft_kind, coupling, max_batch):
    target, draft = pair
    engine = {}
    if draft_kind == "target":  # long accepted runs: lookaheads of up to k are used in full
        draft, engine["draft_matmul_min_rows"] = target, 0
    with LLM(target, draft=draft, mode=mode, k=k, max_batch=max_batch, max_model_len=256, coupling=coupling,
             testing=TestingConfig(forced_lookahead=forced), **engine) as llm:
        got = [o.token_ids for o in llm.generate(prompts(16), greedy(16))]
        stats = llm.stats()
    assert got == ar_greedy
    assert stats["adaptive_rounds"] > 0
    if forced:
        # The schedule ran: rounds of every size, autoregressive ones included.
        assert stats["draft_tokens_proposed"] < k * stats["rounds"]
        mean = stats["adaptive_lookahead_sum"] / stats["adaptive_rounds"]
        want = sum(min(v, k) for v in forced) / len(forced)
        assert abs(mean - want) < 0.35 * want
    if draft_kind == "target" and mode == "sd":  # (ssd's n-gram fallback proposes other tokens)
        assert stats["draft_tokens_accepted"] == stats["draft_tokens_proposed"] > 0


def test_fixed_mode_verifies_k_every_round(pair, ar_greedy):
    with LLM(pair[0], draft=pair[1], mode="ssd", k=3, max_model_len=256, adaptive=False) as llm:
        got = [o.token_ids for o in llm.generate(prompts(16), greedy(16))]
        stats = llm.stats()
    assert got == ar_greedy
    # Every round verifies 3 but a request's last, which counts only the proposals it emitted.
    assert 3 * (stats["rounds"] - 16) <= stats["draft_tokens_proposed"] <= 3 * stats["rounds"]
    assert stats["policy_drafting"] == "off" and stats["adaptive_steps"] == stats["adaptive_rounds"] == 0


def test_adaptive_estimates_are_in_stats(pair):
    with LLM(pair[0], draft=pair[1], mode="ssd", k=3, max_model_len=256, max_batch=4) as llm:
        llm.generate(prompts(8), greedy(8))
        stats = llm.stats()
    assert stats["adaptive_steps"] > 0 and stats["adaptive_rounds"] > 0
    assert stats["policy_drafting"] in ("none", "trees", "misses")
    assert 0 <= stats["policy_acceptance"] <= 0.98 and 0 <= stats["policy_hit_rate"] <= 1
    assert stats["policy_tok_s_best"] >= stats["policy_tok_s_ar"] > 0
    assert 0 <= stats["adaptive_switches"] <= stats["adaptive_steps"]
    assert "adaptive_decision_seconds" in _C.counter_names()


def test_tree_for_a_shortened_round_covers_its_likeliest_outcome(pair):
    """With the target as its own draft every outcome of a round verifying V < k is (V, x_{V+1}):
    a tree that excluded x_{V+1} at its last fork point (as a k-proposal round's must) would never hit."""
    target = pair[0]
    with LLM(target, draft=target, mode="ssd", k=4, max_model_len=256, draft_matmul_min_rows=0,
             fanout_budget=4, testing=TestingConfig(forced_lookahead=(1, 2, 3))) as llm:
        outs = llm.generate(prompts(4), greedy(4, max_tokens=60))
        stats = llm.stats()
    assert all(len(o.token_ids) == 60 for o in outs)
    assert stats["draft_tokens_proposed"] < 4 * stats["rounds"]
    # Measured: 85% of lookups hit; with x_{V+1} excluded at fork point V, 18%.
    assert stats["cache_hits"] >= 0.6 * stats["cache_lookups"] > 0


# ---- temperature > 0: the target's law under switching lookaheads ----

def law_run(small_pair, mode, settings, k=2, forced=(0, 2, 1, 2, 0, 1), coupling="rejection", testing=None,
            fraction=1, adaptive=True):
    target, draft = small_pair
    engine = {"fanout": [2] * (k + 1)} if mode == "ssd" and k == 2 else {}
    testing = testing or TestingConfig(forced_lookahead=forced)
    with LLM(target, draft=draft, mode=mode, k=k, max_model_len=len(PROMPT) + 7 + k + 1, max_batch=512,
             max_batched_tokens=8192, coupling=coupling, adaptive=adaptive, testing=testing, **engine) as llm:
        laws = target_laws(llm.model, *settings)
        n = law_size(laws) // fraction
        outs = llm.generate([PROMPT] * n, sampled(n, *settings, seed0=21_000_000))
        stats = llm.stats()
    return outs, stats, laws


LAW_CASES = {
    "ssd-rejection-t1": ("ssd", (1.0, 0, 1.0), "rejection"),
    "ssd-rejection-t0.9-topk3-topp0.9": ("ssd", (0.9, 3, 0.9), "rejection"),
    "sd-rejection-t1": ("sd", (1.0, 0, 1.0), "rejection"),
    "ssd-gumbel-t1": ("ssd", (1.0, 0, 1.0), "gumbel"),
}


@pytest.mark.parametrize("case", sorted(LAW_CASES))
def test_law_with_forced_switches(small_pair, case):
    mode, settings, coupling = LAW_CASES[case]
    outs, stats, laws = law_run(small_pair, mode, settings, coupling=coupling)
    assert stats["draft_tokens_proposed"] < 2 * stats["rounds"]  # short and autoregressive rounds ran
    varied = sum(0 < o.metrics["draft_tokens_proposed"] < 2 * o.metrics["rounds"] for o in outs)
    assert varied >= len(outs) // 4
    if mode == "ssd":
        assert stats["cache_hits"] > 0
    assert min(p_values(outs, laws)) > ALPHA


def test_broken_peek_at_target_logits_fails_the_law_test(small_pair):
    """Fault: each round verifies only the proposals the target's own logits say it will accept."""
    outs, stats, laws = law_run(small_pair, "ssd", (1.0, 0, 1.0), fraction=4,
                                testing=TestingConfig(fault_peek_target=True, forced_lookahead=(0, 2, 1, 2, 0, 1)))
    assert stats["draft_tokens_proposed"] > 0
    assert min(p_values(outs, laws)) < BROKEN


@pytest.mark.parametrize("mode,adaptive,forced", [("ssd", False, ()), ("ssd", True, FORCED_32),
                                                  ("sd", True, FORCED_32)])
def test_law_at_k32(small_pair, mode, adaptive, forced):
    # Half the samples of the k = 2 cases (power 0.9 against a total variation
    # of about 0.014 rather than 0.01): a k = 32 round costs several k = 2 ones,
    # and what these cases add (lookaheads far past the 7 tokens generated)
    # breaks the law by far more when it breaks it.
    outs, stats, laws = law_run(small_pair, mode, (1.0, 0, 1.0), k=32, forced=forced, adaptive=adaptive, fraction=2)
    assert stats["draft_tokens_proposed"] > 0
    if mode == "ssd":
        assert stats["cache_hits"] > 0
    assert min(p_values(outs, laws)) > ALPHA


# ---- the step model, against plans worked out by hand ----

def test_plan_sequential_stops_where_drafting_stops_paying():
    # Verify rows cost nothing extra (0.1 s flat); each draft forward 0.01 s; acceptance 0.5:
    # V = 0..4 give 1/0.10, 1.5/0.11, 1.75/0.12, 1.875/0.13, 1.9375/0.14 tokens/s: V = 2 is best.
    plan = _C.plan_step("sequential", [0.5], 4, [(1, 0.1), (40, 0.1)], draft_step=0.01)
    assert plan["lookaheads"] == [2]
    assert plan["threshold"] == pytest.approx((0.25 * 0.125) ** 0.5)  # between the last gain taken and the next
    assert plan["tokens"] == pytest.approx(1.75) and plan["seconds"] == pytest.approx(0.12)


def test_plan_falls_back_to_autoregressive_steps_when_rows_cost():
    # Each row costs 0.1 s (forward 0.1 s at 1 row, 0.5 s at 5): V = 1 gives 1.5 / 0.2 < 1 / 0.1.
    plan = _C.plan_step("sequential", [0.5], 4, [(1, 0.1), (5, 0.5)])
    assert plan["lookaheads"] == [0] and plan["threshold"] > 1
    assert plan["tokens"] == pytest.approx(1.0) and plan["seconds"] == pytest.approx(0.1)


def test_plan_gives_more_proposals_to_the_sequence_that_keeps_them():
    # Two sequences, acceptance 0.9 and 0.2; trees always hit; each row past 2 costs 0.01 s.
    # Gains in order .9 .81 .729 .6561 .2 ...: tokens/s 20, 26.4, 30.9, 34.1, 36.4, then 35.3.
    plan = _C.plan_step("trees", [0.9, 0.2], 4, [(2, 0.10), (10, 0.18)], tree=0.05, fallback=0.05, hit_rate=1.0)
    assert plan["lookaheads"] == [4, 0]
    assert plan["threshold"] == pytest.approx((0.6561 * 0.2) ** 0.5)
    assert plan["tokens"] == pytest.approx(5.0951) and plan["seconds"] == pytest.approx(0.14)


def test_plan_counts_the_misses_of_the_batch():
    # Trees cost 0.2 s beside a 0.1 s verify, hit rate 0.5, fallback 0.1 s: one sequence at V = 1
    # takes max(0.1, 0.2) + 0.5 * 0.1 = 0.25 s for 1.5 tokens: worse than an autoregressive 1 / 0.1.
    plan = _C.plan_step("trees", [0.5], 1, [(1, 0.1), (2, 0.1)], tree=0.2, fallback=0.1, hit_rate=0.5)
    assert plan["lookaheads"] == [0] and plan["seconds"] == pytest.approx(0.1)
    # Without a tree every speculating round pays the fallback: 0.1 + 0.01 s for 1.5 tokens wins.
    plan = _C.plan_step("misses", [0.5], 1, [(1, 0.1), (2, 0.1)], fallback=0.01)
    assert plan["lookaheads"] == [1] and plan["seconds"] == pytest.approx(0.11)


def test_plan_prices_trees_beside_a_slowed_forward():
    # One sequence at acceptance 0.5; the forward takes 0.1 s at 1 row and 0.01 s per row more; trees always hit.
    curve, a = [(1, 0.10), (5, 0.14)], [0.5]
    # Unslowed, a tree as long as its verify: V = 0..4 give 1/.10, 1.5/.11, 1.75/.12, 1.875/.13, 1.9375/.14.
    plan = _C.plan_step("trees", a, 4, curve, hit_rate=1.0, tree_per_verify=1.0)
    assert plan["lookaheads"] == [2] and plan["seconds"] == pytest.approx(0.12)
    # The forward 1.5x slower beside the tree and the tree 1.2x that: every V > 0 costs 1.8 t(1 + V),
    # and 1.75 / (1.8 * 0.12) = 8.1 tok/s loses to an autoregressive step's 10.
    plan = _C.plan_step("trees", a, 4, curve, hit_rate=1.0, contention=1.5, tree_per_verify=1.2)
    assert plan["lookaheads"] == [0] and plan["seconds"] == pytest.approx(0.10)
    # A fixed 0.16 s tree (a budget not sized to the verify) is paid whatever V: every proposal, 1.9375 / 0.16.
    plan = _C.plan_step("trees", a, 4, curve, hit_rate=1.0, tree=0.16)
    assert plan["lookaheads"] == [4] and plan["seconds"] == pytest.approx(0.16)
    # The same tree sized to its verify (tau 0.16 / 0.14) shrinks with V: V = 2 again.
    plan = _C.plan_step("trees", a, 4, curve, hit_rate=1.0, tree=0.16, tree_per_verify=0.16 / 0.14)
    assert plan["lookaheads"] == [2] and plan["seconds"] == pytest.approx(0.12 * 0.16 / 0.14)
    # The slowdown applies to trees only: without them (misses) the forward is the measured one.
    plan = _C.plan_step("misses", a, 4, curve, fallback=0.0, contention=1.5)
    assert plan["lookaheads"] == [2] and plan["seconds"] == pytest.approx(0.12)


def test_plan_values_deep_proposals_of_accepted_runs():
    # Costs of the test above (a tree as long as its verify, always hit). A first proposal kept half the time but
    # the later ones, after a kept one, 90% of the time: gains .5 .45 .405 .3645, so V = 1..4 give 1.5/.11,
    # 1.95/.12, 2.355/.13, 2.7195/.14 tokens/s and every proposal pays (geometric at 0.5 stops at V = 2).
    curve = [(1, 0.10), (5, 0.14)]
    plan = _C.plan_step("trees", [0.5], 4, curve, hit_rate=1.0, tree_per_verify=1.0, continuation=[0.9])
    assert plan["lookaheads"] == [4] and plan["tokens"] == pytest.approx(2.7195)
    assert plan["threshold"] == 0  # every proposal taken
    # Runs rarely continued (20%): one proposal, 1.5 / 0.11, beats 1.6 / 0.12.
    plan = _C.plan_step("trees", [0.5], 4, curve, hit_rate=1.0, tree_per_verify=1.0, continuation=[0.2])
    assert plan["lookaheads"] == [1] and plan["seconds"] == pytest.approx(0.11)
    with pytest.raises(ValueError, match="continuation"):
        _C.plan_step("trees", [0.5, 0.5], 4, curve, continuation=[0.9])
    with pytest.raises(ValueError, match="continuation"):
        _C.plan_step("trees", [0.5], 4, curve, continuation=[1.0])


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError, match="no measured forward"):
        _C.plan_step("trees", [0.5], 4, [])
    with pytest.raises(ValueError, match="acceptance"):
        _C.plan_step("trees", [1.0], 4, [(1, 0.1)])
    with pytest.raises(ValueError, match="drafting"):
        _C.plan_step("always", [0.5], 4, [(1, 0.1)])


def test_config_checks():
    with pytest.raises(ValueError, match="adaptive"):
        EngineConfig(mode="sd", adaptive=1)
    with pytest.raises(ValueError, match="forced_lookahead"):
        TestingConfig(forced_lookahead=(2, -1))
    with pytest.raises(ValueError, match="forced_lookahead"):
        TestingConfig(forced_lookahead="12")
    assert TestingConfig(forced_lookahead=[1, 2]).forced_lookahead == (1, 2)


# ---- the policy on the constructed SmolLM2 pair (slow: real forwards of about 0.1 s) ----

@pytest.fixture(scope="module")
def regime():
    from ssd.assets import mtbench_prompts
    from ssd.testing import regime_pair

    return regime_pair(acceptance=0.75, cost_ratio=0.25), [[{"role": "user", "content": mtbench_prompts(1)[0]}]]


@pytest.mark.slow
def test_measured_steps_price_waits_the_model_cannot_see(regime):
    """At batch 1 on the constructed pair, trees pay on most hosts (fixed ssd decodes about 1.5x ar's tokens per
    second), so the policy builds them. When the draft side answers late (a wait no part of the step model
    measures) only the measured step times show it, and the policy must settle on autoregressive steps. The delay
    is six of this machine's tree steps: with a fixed 400 ms, trees (about 2.9 tokens a step) stay the faster kind
    wherever a step takes over 0.21 s, and there the policy is right to keep them (a CI host ran 21 of 40 steps on
    trees). Where the two models share little memory bandwidth, trees pay less and the policy mixes kinds without
    the delay (a 2-core EPYC host ran 14 of 30 steps on trees): the undelayed run only has to build trees on a
    third of its steps, and the delayed run must then leave them. Settling takes about a dozen steps (timing,
    warming, a switch's first steps, the dwell), so the request is long enough that the settled steps are most
    of it."""
    pair, chat = regime

    def run(delay_ms: int, max_tokens: int) -> tuple[dict, float]:
        with LLM(str(pair.target), draft=str(pair.draft), mode="ssd", k=4, max_batch=1, max_model_len=1024,
                 target_threads=1, draft_threads=1, testing=TestingConfig(draft_answer_delay_ms=delay_ms)) as llm:
            t0 = time.monotonic()
            llm.chat(chat, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            seconds = time.monotonic() - t0
            return llm.stats(), seconds

    stats, seconds = run(0, 48)
    assert stats["adaptive_tree_steps"] > stats["adaptive_steps"] / 3
    assert 0.5 < stats["policy_step_factor"] < 2
    step_ms = 1000 * seconds / stats["adaptive_steps"]
    stats, _ = run(max(400, round(6 * step_ms)), 80)
    assert stats["adaptive_ar_steps"] > 0.6 * stats["adaptive_steps"], step_ms
    assert stats["policy_drafting"] == "none"
