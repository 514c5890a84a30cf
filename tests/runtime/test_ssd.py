"""Asynchronous speculative decoding (mode "ssd", SAGUARO): exact at temperature 0 and in law."""
import os
import random
import threading
import time

import pytest

import ssd.models as ssd_models
from ssd import LLM, SamplingParams
from ssd.testing import TestingConfig
from tests.reference import law
from tests.reference.stats import g_test, samples_for_power


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def prompts_32(seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(32)]


@pytest.fixture(scope="module")
def ar_greedy(pair):
    with LLM(pair[0], max_model_len=256) as ar:
        return [o.token_ids for o in ar.generate(prompts_32(), greedy(64))]


@pytest.mark.parametrize("max_batch", [1, 8])
@pytest.mark.parametrize("variant", ["neural", "fast", "always_miss", "auto", "geometric"])
def test_greedy_equals_ar(pair, ar_greedy, max_batch, variant):
    target, draft = pair
    kwargs = ({"testing": TestingConfig(always_miss=True), "fallback": "neural"} if variant == "always_miss"
              else {"fallback": variant})
    if variant == "geometric":  # the default fan-out is "confidence"
        kwargs = {"fanout": "geometric"}
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=256, max_batch=max_batch, **kwargs) as ssd:
        got = [o.token_ids for o in ssd.generate(prompts_32(), greedy(64))]
        stats = ssd.stats()
    assert got == ar_greedy
    assert stats["cache_lookups"] > 0
    if variant == "neural":
        assert stats["fallback_neural"] > 0 and stats["fallback_fast"] == 0
    if variant == "fast":
        assert stats["fallback_fast"] > 0 and stats["fallback_neural"] == 0
        assert stats["fast_tokens_proposed"] >= stats["fallback_fast"]
    if variant == "always_miss":
        assert stats["cache_hits"] == 0 and stats["fallback_neural"] == stats["cache_lookups"]
    # One n-gram shadow per neural fallback, scored unless its text ended first (those made in a
    # prompt's last k + 1 tokens at most).
    shadows = stats["fast_shadow_rounds"]
    assert stats["fallback_neural"] - 4 * len(got) <= shadows <= stats["fallback_neural"]
    assert shadows <= stats["fast_shadow_tokens"] <= 4 * shadows
    if shadows or stats["fallback_fast"]:
        assert 1.0 <= stats["fallback_fast_estimate"] <= 4.0
    assert stats["fallback_neural"] + stats["fallback_fast"] == stats["cache_lookups"] - stats["cache_hits"]


@pytest.mark.parametrize("max_batch", [1, 8])
def test_draft_equal_to_target_hits_the_cache(pair, ar_greedy, max_batch):
    target, _ = pair
    # draft_matmul_min_rows=0: the draft computes exactly like the target (no bf16 pair kernels).
    with LLM(target, draft=target, mode="ssd", adaptive=False, k=3, max_model_len=256, max_batch=max_batch,
             draft_matmul_min_rows=0) as ssd:
        got = [o.token_ids for o in ssd.generate(prompts_32(), greedy(64))]
        stats = ssd.stats()
    assert got == ar_greedy
    assert stats["draft_tokens_accepted"] == stats["draft_tokens_proposed"]
    assert stats["cache_hit_rate"] >= 0.99
    assert stats["kv_commits"] == stats["cache_hits"]  # every hit reused its branch's KV


def test_greedy_with_preemption_equals_ar(pair):
    target, draft = pair
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(4, 40))] for _ in range(24)]
    with LLM(target, max_model_len=128) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(48))]
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=4, max_model_len=128, max_batch=16, kv_block_size=8,
             kv_capacity_tokens=512, fallback="neural", fanout=[2, 1, 1, 1, 2]) as ssd:
        got = [o.token_ids for o in ssd.generate(prompts, greedy(48))]
        stats = ssd.stats()
    assert stats["num_preemptions"] >= 1
    assert got == want


VOCAB = 4
PROMPT = [1, 3, 0, 2]
N_TOKENS = 7  # with k = 2 (up to 3 tokens a round), at least three rounds
FANOUT = [2, 2, 2]  # F_0..F_K for k = 2: two of the three possible bonus tokens at j < K


def run_law(small_pair, temperature, top_k, top_p, max_batch, seed0=9_000_000, **engine):
    """Samples the law test's size from ssd; returns (outputs, stats, target laws)."""
    target, draft = small_pair
    # The rejection coupling's law (the Gumbel coupling's: tests/runtime/test_gumbel_coupling.py).
    engine = {"coupling": "rejection", **engine}
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=2, max_model_len=32, max_batch=max_batch,
             max_batched_tokens=8192, fanout=FANOUT, **engine) as ssd:
        # The target's exact law by enumeration on the CPU (the oracle), whatever the engine's placement.
        joint = law.exact_joint(ssd_models.load(target), PROMPT, N_TOKENS, VOCAB, temperature, top_k, top_p)
        laws = law.views(joint)
        n = max(samples_for_power(p, tv=0.01, alpha=0.001, power=0.9) for p in laws)
        params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=N_TOKENS,
                                 ignore_eos=True, seed=seed0 + i) for i in range(n)]
        outs = ssd.generate([PROMPT] * n, params)
        stats = ssd.stats()
    return outs, stats, laws


LAW_CASES = {
    # name: (temperature, top_k, top_p, max_batch, engine settings)
    "C1-neural": (1.0, 0, 1.0, 512, {"saguaro_c": 1.0, "fallback": "neural"}),
    "C0.3-neural-topk-topp": (0.9, 3, 0.9, 512, {"saguaro_c": 0.3, "fallback": "neural"}),
    "C1-fast-batch4": (1.0, 0, 1.0, 4, {"saguaro_c": 1.0, "fallback": "fast"}),
    "C0.3-fast-topk-topp": (0.9, 3, 0.9, 512, {"saguaro_c": 0.3, "fallback": "fast"}),
    "C0.3-fast-topk": (1.0, 3, 1.0, 512, {"saguaro_c": 0.3, "fallback": "fast"}),
    "C0.3-fast-topp-batch1": (1.0, 0, 0.6, 1, {"saguaro_c": 0.3, "fallback": "fast"}),
    "C1-neural-batch1": (1.0, 0, 1.0, 1, {"saguaro_c": 1.0, "fallback": "neural"}),
}


@pytest.mark.parametrize("case", sorted(LAW_CASES))
def test_output_law_equals_target(small_pair, case):
    temperature, top_k, top_p, max_batch, engine = LAW_CASES[case]
    outs, stats, laws = run_law(small_pair, temperature, top_k, top_p, max_batch, **engine)
    counts = law.counts_of(outs, VOCAB, N_TOKENS)
    accept = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
    assert 0.05 < accept < 0.95, "both acceptance and rejection must be exercised"
    assert stats["rounds"] >= 3 * len(outs)
    assert stats["cache_hit_rate"] >= 0.3
    assert stats["kv_commits"] == stats["cache_hits"] > 0
    kind = engine["fallback"]
    assert stats[f"fallback_{kind}"] > 0, f"the {kind} fallback never ran"
    for expected, observed in zip(laws, law.views(counts)):
        assert g_test(observed, expected) > 0.001


def test_shadow_scoring_matches_running_the_fast_fallback(small_pair):
    """The n-gram proposals scored beside neural fallbacks emit, on average, what
    verifying them emits when the fast fallback runs (temperature 1, every round
    a fallback): a one-hot proposal's token is accepted with the target's
    probability of it, the chance that the target's own sample is that token."""
    target, draft = small_pair
    means = {}
    for kind in ("neural", "fast"):
        with LLM(target, draft=draft, mode="ssd", adaptive=False, k=2, max_model_len=64, max_batch=512, testing=TestingConfig(always_miss=True),
                 fallback=kind) as ssd:
            params = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=500 + i)
                      for i in range(1500)]
            ssd.generate([PROMPT] * len(params), params)
            s = ssd.stats()
        if kind == "neural":
            rounds, tokens = s["fast_shadow_rounds"], s["fast_shadow_tokens"]
        else:
            rounds, tokens = s["fallback_fast"], s["fallback_fast"] + s["fast_tokens_accepted"]
        assert rounds > 5000
        means[kind] = tokens / rounds
    # 1 token when every proposal fails, 3 when every one holds; the two must agree closely.
    assert 1.2 < means["fast"] < 2.8
    assert means["neural"] == pytest.approx(means["fast"], abs=0.05), means


@pytest.mark.parametrize("fanout", ["complete", "drafted-token-wasted"])
def test_a_tree_of_every_possible_outcome_never_misses(small_pair, fanout):
    """Vocabulary 4, K = 2: after j accepted proposals the bonus can be any token but the rejected
    proposal x_{j+1} (the residual is zero there), so 3 candidates at j < K and 4 at K hold every
    outcome, and every lookup must hit, at any temperature. A tree that spent a candidate on x_{j+1}
    (F_j = 3 but x_{j+1} not excluded) would miss; with one candidate fewer it must miss."""
    target, draft = small_pair
    plan = [3, 3, 4] if fanout == "complete" else [2, 2, 4]
    params = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=70 + i) for i in range(200)]
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=2, max_model_len=32, max_batch=16, fanout=plan,
             fallback="neural") as ssd:
        ssd.generate([PROMPT] * len(params), params)
        stats = ssd.stats()
    assert stats["cache_lookups"] > 3 * len(params)
    if fanout == "complete":
        assert stats["cache_hits"] == stats["cache_lookups"]
    else:
        assert stats["cache_hits"] < stats["cache_lookups"]


def test_broken_fast_fallback_fails_the_law_test(small_pair):
    """Fault injection: fast-fallback proposals verified greedily at temperature 1."""
    outs, stats, laws = run_law(small_pair, 1.0, 0, 1.0, 512, saguaro_c=1.0, fallback="fast",
                                testing=TestingConfig(fault_fast_argmax=True))
    assert stats["fallback_fast"] > 0
    counts = law.counts_of(outs, VOCAB, N_TOKENS)
    assert min(g_test(o, e) for o, e in zip(law.views(counts), laws)) < 1e-6


def test_seeded_law_run_does_not_depend_on_batch(small_pair):
    """With the neural fallback, a fixed fan-out and one draft kernel path
    (draft_matmul_min_rows=1) a hit and a miss propose the same tokens, so
    every seeded sample is the same at batch 1 as in the large batches of the
    law tests: the batch-1 law is the tested law."""
    target, draft = small_pair
    params = [SamplingParams(temperature=0.9, top_k=3, top_p=0.9, max_tokens=N_TOKENS, ignore_eos=True,
                             seed=9_000_000 + i) for i in range(200)]
    runs = []
    for max_batch in (512, 4, 1):
        with LLM(target, draft=draft, mode="ssd", adaptive=False, k=2, max_model_len=32, max_batch=max_batch,
                 fanout=FANOUT, saguaro_c=0.3, fallback="neural", draft_matmul_min_rows=1,
                 coupling="rejection") as ssd:
            runs.append([o.token_ids for o in ssd.generate([PROMPT] * len(params), params)])
            assert ssd.stats()["cache_hits"] > 0
    assert runs[0] == runs[1] == runs[2]


def test_ssd_config_errors(pair, small_pair):
    target, draft = pair
    with pytest.raises(ValueError, match=r"draft vocabulary \(4 tokens\) differs from the target's \(256 tokens\)"):
        LLM(target, draft=small_pair[1], mode="ssd", adaptive=False, max_model_len=64)
    with pytest.raises(ValueError, match="needs a draft model"):
        LLM(target, mode="ssd", adaptive=False, max_model_len=64)
    bad = [({"k": 0}, "k: must be > 0"),
           ({"k": 2, "fanout": [1, 2]}, "fanout: an explicit fan-out lists F_0..F_K, so k \\+ 1 = 3"),
           ({"fanout": [0, 0, 0, 0, 0]}, "at least one branch"),
           ({"fanout": [1, -1, 1, 1, 1]}, r"every F_j must be in \[0, 256\]"),
           ({"fanout": "wide"}, "fanout: must be 'geometric', 'confidence' or a list"),
           ({"fanout_budget": 0}, "fanout_budget: must be 'auto' or an integer >= 1"),
           ({"fanout_budget": "big"}, "fanout_budget: must be 'auto'"),
           ({"saguaro_c": 1.5}, r"saguaro_c: must be in \[0, 1\]"),
           ({"saguaro_c": -0.1}, r"saguaro_c: must be in \[0, 1\]"),
           ({"fallback": "ngram"}, "fallback: must be 'auto', 'neural' or 'fast'")]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            LLM(target, draft=draft, mode="ssd", adaptive=False, max_model_len=64, **kwargs)


def test_mixed_batch_cancel_and_shutdown(pair):
    """Different settings in one batch; a seeded request ignores its batch-mates;
    cancel ends one request only; shutdown leaves no thread behind."""
    target, draft = pair
    # A fixed fan-out and the neural fallback make a seeded request's tokens
    # independent of hits and misses, hence of timing and batch-mates, when every
    # draft forward takes one kernel path (draft_matmul_min_rows=1: the bf16 pair
    # kernels, batch invariant; by default 1-row fallbacks take the exact path).
    kw = dict(draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=256, fanout=[1, 1, 1, 1], fallback="neural",
              draft_matmul_min_rows=1)
    seeded = SamplingParams(temperature=0.8, top_k=20, max_tokens=40, ignore_eos=True, seed=3)
    with LLM(target, **kw) as ssd:
        alone = ssd.generate([[5, 6, 7]], seeded)[0].token_ids
    with LLM(target, max_model_len=256) as ar:
        want_greedy = ar.generate([[9, 9]], greedy(30))[0].token_ids
        stop_base = ar.generate([[1, 2]], greedy(30))[0].token_ids
    stop_tok = stop_base[6]
    prompts = [[5, 6, 7], [9, 9], [4], [1, 2], [8, 8, 8]]
    params = [seeded, greedy(30), SamplingParams(temperature=1.0, top_p=0.5, max_tokens=25, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_tok]),
              SamplingParams(temperature=0.7, max_tokens=230, ignore_eos=True)]
    def native_threads():  # threads Python did not start (the engine's, the draft worker's)
        return len(set(os.listdir("/proc/self/task")) - {str(t.native_id) for t in threading.enumerate()})

    time.sleep(0.2)  # a thread joined by Python can still be exiting in the OS
    threads_before = native_threads()
    ssd = LLM(target, **kw)
    assert native_threads() >= threads_before + 2  # engine thread + draft worker
    handles = ssd._dispatcher.submit(ssd._prepare(prompts, params))
    deadline = time.time() + 120
    while len(handles[4].output.token_ids) < 5 and not handles[4].done.is_set() and time.time() < deadline:
        time.sleep(0.005)
    handles[4].cancel()
    outs = [h.wait() for h in handles]
    got = [o.token_ids for o in outs]
    done = [o.finish_reason for o in outs]
    assert got[0] == alone and done[0] == "length"
    assert got[1] == want_greedy
    assert len(got[2]) == 25 and done[2] == "length"
    assert got[3] == stop_base[: stop_base.index(stop_tok) + 1] and done[3] == "stop"
    assert done[4] == "cancelled" and 5 <= len(got[4]) < 230
    ssd.shutdown()
    deadline = time.time() + 10
    while native_threads() != threads_before and time.time() < deadline:
        time.sleep(0.01)
    assert native_threads() == threads_before
