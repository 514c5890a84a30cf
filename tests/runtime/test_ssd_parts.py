"""The pieces of mode ssd that are plain functions: fan-out, n-gram proposals, the speed model."""
import math

import pytest

from ssd import _C


def geometric_weights(k, a, r):
    e = 1 / (1 + r)
    w = [a ** (j * e) for j in range(k)] + [a ** (k * e) * (1 - a) ** (-e)]
    return [x / sum(w) for x in w]


@pytest.mark.parametrize("k,budget,a,r", [(4, 8, 0.75, 1.0), (4, 100, 0.5, 0.5), (2, 7, 0.9, 2.0),
                                          (6, 1000, 0.3, 1.0)])
def test_geometric_fanout_follows_the_formula(k, budget, a, r):
    f = _C.testing.geometric_fanout(k, budget, a, r)
    assert len(f) == k + 1 and sum(f) == budget and min(f) >= 0
    # Rounded shares: each F_j within one of its real-valued share of the budget.
    for fj, wj in zip(f, geometric_weights(k, a, r)):
        assert abs(fj - budget * wj) < 1.0
    # The fan-out shrinks along the path (j < K) by the factor a^(1/(1+r)) per step.
    if budget >= 100:
        assert f[0] >= f[1] >= f[k - 1]
        assert f[1] / f[0] == pytest.approx(a ** (1 / (1 + r)), rel=0.1)


def test_geometric_fanout_puts_more_at_k_when_acceptance_is_high():
    low, high = _C.testing.geometric_fanout(4, 20, 0.3, 1.0), _C.testing.geometric_fanout(4, 20, 0.95, 1.0)
    assert high[4] > low[4] and high[0] < low[0]


def test_ngram_proposals():
    # The last 3 tokens (7, 8, 9) occurred before, followed by 10, 11.
    assert _C.testing.ngram_propose([7, 8, 9, 10, 11, 5, 7, 8, 9], 2) == [10, 11]
    # The latest occurrence wins; a match near the end continues into its own proposals.
    assert _C.testing.ngram_propose([1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    # No 3- or 2-gram match: fall back to the last token alone (4 occurred before, then 6).
    assert _C.testing.ngram_propose([4, 6, 9, 4], 3) == [6, 9, 4]
    # Nothing matches at all: repeat the last token.
    assert _C.testing.ngram_propose([1, 2, 3], 3) == [3, 3, 3]
    assert _C.testing.ngram_propose([5], 2) == [5, 5]


def test_proposal_emitted_reads_a_proposal_off_the_committed_text():
    text = [5, 6, 7, 8, 9, 10]
    # Proposal made at 2 tokens: [7, 8] agree, 0 != 9, so its round would emit 2 + 1.
    assert _C.testing.proposal_emitted(text, 2, [7, 8, 0, 1]) == 3
    # Every proposed token agrees: all of them plus the bonus.
    assert _C.testing.proposal_emitted(text, 2, [7, 8, 9]) == 4
    assert _C.testing.proposal_emitted(text, 2, [7, 8, 9, 10]) == 5
    # The first token disagrees: only the bonus.
    assert _C.testing.proposal_emitted(text, 3, [1, 9]) == 1
    # Undecided while the committed text agrees with all it has.
    assert _C.testing.proposal_emitted(text, 4, [9, 10, 11]) == -1
    assert _C.testing.proposal_emitted(text, 6, [1]) == -1
    # An empty proposal is decided at once: the bonus alone.
    assert _C.testing.proposal_emitted(text, 6, []) == 1


def test_speed_model_formula():
    counters = dict(rounds=12, draft_tokens_proposed=48, draft_tokens_accepted=20, generated_tokens=34,
                    cache_lookups=10, cache_hits=6, hit_tokens=24, miss_tokens=8,
                    verify_steps=10, verify_seconds=1.0, draft_rounds=10, draft_round_seconds=1.5,
                    fallback_batches=4, fallback_seconds=0.2, forward_seconds=1.2, active_seconds=1.6)
    m = _C.speed_metrics(counters)
    assert m["acceptance_rate"] == pytest.approx(20 / 48)
    assert m["cache_hit_rate"] == pytest.approx(0.6)
    assert m["e_hit"] == pytest.approx(4.0) and m["e_miss"] == pytest.approx(2.0)
    assert m["t_p"] == pytest.approx(1.5) and m["t_b"] == pytest.approx(0.5)
    # 12 rounds over 10 verify forwards: batch 1.2, modelled as 1.
    assert m["mean_batch"] == pytest.approx(1.2)
    # (p E_hit + (1-p) E_miss) / (p max(1, T_p) + (1-p)(max(1, T_p) + T_b)): a miss waits for the
    # tree under way (1.5), then for the fallback (0.5).
    assert m["predicted_speedup"] == pytest.approx((0.6 * 4 + 0.4 * 2) / (0.6 * 1.5 + 0.4 * 2.0))
    assert m["target_busy_fraction"] == pytest.approx(0.75)
    fast_draft = _C.speed_metrics({**counters, "draft_round_seconds": 0.5})  # T_p < 1 costs nothing extra
    assert fast_draft["predicted_speedup"] == pytest.approx((0.6 * 4 + 0.4 * 2) / (0.6 * 1.0 + 0.4 * 1.5))
    # Batch 4 (40 rounds over 10 forwards): the round is all-hit with 0.6^4 = 0.1296.
    batched = _C.speed_metrics({**counters, "rounds": 40})
    assert batched["predicted_speedup"] == pytest.approx((0.6 * 4 + 0.4 * 2) / (0.1296 * 1.5 + 0.8704 * 2.0))
    assert _C.speed_metrics({})["predicted_speedup"] == 0.0


def test_round_model_by_mode():
    ssd = _C.predict_round(p_hit=0.5, e_hit=3.0, e_miss=1.0, t_p=0.8, t_b=0.4, batch=2)
    assert ssd["p_all_hit"] == pytest.approx(0.25)
    assert ssd["tokens"] == pytest.approx(2.0)
    assert ssd["time"] == pytest.approx(0.25 * 1.0 + 0.75 * 1.4)
    assert ssd["speedup"] == pytest.approx(2.0 / 1.3)
    # A verify costing 1.25 AR steps scales the speedup over ar down by that much.
    assert _C.predict_round(p_hit=0.5, e_hit=3.0, e_miss=1.0, t_p=0.8, t_b=0.4, batch=2,
                            verify_cost=1.25)["speedup"] == pytest.approx(2.0 / 1.3 / 1.25)
    # sd: K draft steps (T_p) then the verify, every round; no cache, no misses.
    sd = _C.predict_round(e_hit=3.0, t_p=0.6, overlapped=False)
    assert (sd["p_all_hit"], sd["time"]) == (1.0, pytest.approx(1.6))
    assert sd["speedup"] == pytest.approx(3.0 / 1.6)
    for bad, field in (({"p_hit": 1.5}, "p_hit"), ({"t_p": -1.0}, "t_p"), ({"batch": 0}, "batch"),
                       ({"verify_cost": 0.0}, "verify_cost")):
        with pytest.raises(ValueError, match=field):
            _C.predict_round(**bad)


def test_counter_names_are_the_summed_stats():
    names = _C.counter_names()
    assert len(names) == len(set(names))
    for key in ("steps", "rounds", "cache_hits", "verify_seconds", "draft_round_seconds", "kv_commits",
                "fast_shadow_tokens", "generated_tokens"):
        assert key in names
    for gauge in ("peak_batch", "num_running", "fanout", "fanout_budget", "kv_blocks_free"):
        assert gauge not in names


def _outcome_probabilities(proposed, candidates, acceptance):
    """P(outcome = (j, candidate c)) under the confidence model, written out per outcome."""
    k = len(proposed) - 1
    out = {}
    for j in range(k + 1):
        p_len = math.prod(acceptance(proposed[i]) for i in range(j))
        if j < k:
            p_len *= 1 - acceptance(proposed[j])
        for c, p in enumerate(candidates[j]):
            out[(j, c)] = p_len * (min(1.0, p / (1 - proposed[j])) if j < k else p)
    return out


def _random_forks(rng, k, listed):
    proposed, candidates = [], []
    for j in range(k + 1):
        raw = sorted((rng.random() ** 3 for _ in range(listed + 2)), reverse=True)
        total = sum(raw) * (1 + rng.random())  # leave mass for unlisted tokens
        probs = [x / total for x in raw]
        proposed.append(probs[0] if j < k else 0.0)
        candidates.append(probs[1:listed + 1] if j < k else probs[:listed])
    return proposed, candidates


@pytest.mark.parametrize("seed", range(4))
def test_confidence_branches_take_the_most_likely_outcomes(seed):
    import itertools
    import random

    rng = random.Random(seed)
    k, listed = 3, 5

    def acceptance(p):
        return 0.2 + 0.7 * p

    proposed, candidates = _random_forks(rng, k, listed)
    values = _outcome_probabilities(proposed, candidates, acceptance)
    for budget in (1, 3, 6, 10):
        got = _C.testing.confidence_branches(proposed, candidates, budget, acceptance)
        want = sorted(values, key=lambda o: (-values[o], o))[:budget]
        assert [tuple(x) for x in got] == want
        # No split of the budget into per-fork-point top-F_j (the geometric kind) holds more.
        best_static = max(sum(values[(j, c)] for j in range(k + 1) for c in range(f[j]))
                          for f in itertools.product(range(listed + 1), repeat=k + 1) if sum(f) == budget)
        assert sum(values[tuple(x)] for x in got) >= best_static - 1e-12


def test_confidence_branch_values_are_outcome_probabilities():
    """Monte Carlo of the verification the values model: each proposal accepted with its
    acceptance, a rejected one's bonus drawn from the draft's other tokens, the bonus after the
    last proposal from the draft's distribution. The chosen branches hit as often as their values say."""
    import random

    rng = random.Random(7)
    k, listed, budget, n = 4, 4, 6, 40000

    def acceptance(p):
        return 0.1 + 0.85 * p

    proposed, candidates = _random_forks(rng, k, listed)
    chosen = {tuple(x) for x in _C.testing.confidence_branches(proposed, candidates, budget, acceptance)}
    predicted = sum(_outcome_probabilities(proposed, candidates, acceptance)[o] for o in chosen)
    hits = 0
    for _ in range(n):
        j = 0
        while j < k and rng.random() < acceptance(proposed[j]):
            j += 1
        rest = 1 - proposed[j] if j < k else 1.0
        u, c = rng.random() * rest, None
        for i, p in enumerate(candidates[j]):
            u -= p
            if u < 0:
                c = i
                break
        hits += (j, c) in chosen
    sigma = math.sqrt(predicted * (1 - predicted) / n)
    assert abs(hits / n - predicted) < 4 * sigma


def test_calibrated_acceptance_tracks_each_probability_decile():
    # Proposals the draft gave 0.35 are accepted 4 times in 5, those it gave 0.95 once in 5.
    observed = [(0.35, i % 5 != 0) for i in range(1000)] + [(0.95, i % 5 == 0) for i in range(1000)]
    low, high, unseen = _C.testing.calibrated_acceptance(observed, [0.31, 0.99, 0.6])
    assert low == pytest.approx(0.8, abs=0.02)
    assert high == pytest.approx(0.2, abs=0.02)
    assert unseen == pytest.approx(0.7)  # no outcomes yet: the overall prior


def test_fallback_choice_learns_the_neural_kinds_tokens_from_treeless_rounds_not_their_time():
    # k 4, batch 1, verify 0.1 s, a fresh fan-out planner (no draft step timed: the neural kind's prior time is 0),
    # priors hit rate 0.5, 2 tokens per hit, a tree costing one verify. The speed model's round speed (tokens over
    # time in verifies): 0.5 * 2 + 0.5 * e_miss over 0.5 + 0.5 * (1 + t_miss).
    f = _C.testing.FallbackChoice(k=4)
    f.observe_verify(0.1)
    for _ in range(4):  # the fast kind first: 4 rounds keeping nothing (1 token each), free
        f.observe_emitted("fast", 0)
        f.observe_run("fast", 0.0)
    assert f.choose(1) == "neural"  # the neural kind's prior, 2.0 / 1.0, against the fast kind's 1.5 / 1.0
    # The adaptive policy's treeless rounds are drafted by the draft model from the committed text, as the neural
    # kind answers a miss: their tokens are its tokens. One kept nothing: 1.5 / 1.0, and the fast kind holds (before:
    # not counted, the neural kind kept its prior and was tried on the next misses, each waiting for it).
    f.observe_emitted("neural", 0, tree_round=False)
    f.observe_run("neural", 5.0, tree_round=False)
    assert f.choose(1) == "fast"
    # Their run time is not its time (the first after autoregressive steps catches the draft up first): counted,
    # 5 s against a 0.1 s verify would price it at 1.5 / 25.75. Two more keeping all 4 proposals: (1 + 5 + 5) / 3
    # tokens, 2.83 / 1.0.
    for _ in range(2):
        f.observe_emitted("neural", 4, tree_round=False)
    assert f.choose(1) == "neural"
    # Misses it answered, keeping nothing in 1.5 verifies: 3.0 tokens, 2.5 / 1.75, and the fast kind's 1.5 / 1.0 wins.
    f.observe_emitted("neural", 0)
    f.observe_run("neural", 0.15)
    assert f.choose(1) == "fast"
    with pytest.raises(ValueError, match="fallback kind"):
        f.observe_run("ngram", 0.1)


def test_fallback_choice_weighs_a_kinds_first_rounds_alike():
    # As above: the neural kind's prior round speed is 2.0. The fast kind kept all 3 proposals of its first round
    # (4 tokens), then nothing 9 times (1 token each): a mean of 1.3 tokens, round speed 0.5 * 2 + 0.5 * 1.3 = 1.65,
    # and the neural kind is chosen. An estimate started at the first round and decayed by 0.9 per round holds
    # 0.9 ** 9 of it, 2.16 tokens (round speed 2.08), and kept the fast kind.
    f = _C.testing.FallbackChoice(k=4)
    f.observe_verify(0.1)
    for accepted in [3] + [0] * 9:
        f.observe_emitted("fast", accepted)
        f.observe_run("fast", 0.0)
    assert f.choose(1) == "neural"
    # Past its first rounds the estimate follows the recent ones: 30 rounds keeping 2 (3 tokens) bring it to
    # 3 - 1.7 * 0.9 ** 30 = 2.93 tokens, round speed 2.46, and the fast kind is chosen again.
    for _ in range(30):
        f.observe_emitted("fast", 2)
    assert f.choose(1) == "fast"
