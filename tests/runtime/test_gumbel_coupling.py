"""coupling="gumbel": seeded sd and ssd outputs are token-identical to ar's, and every mode keeps the target's law.

Under the Gumbel coupling a token is the Gumbel-max draw under noise keyed by
(seed, position, token), and a proposal is accepted exactly when it is that
draw, so whatever the draft, the tree, the fallback, the batch or a
preemption did, the output is the autoregressive sample. The identity tests
run 32 prompts x 48 tokens per setting on the vocabulary-256 random pair
(draft: its own random model, which the target mostly rejects, or the target
itself, which it always accepts); the law tests use the vocabulary-4 pair and
the harness of test_ssd_law_paths.py, each with a broken variant
(TestingConfig.fault_shared_noise: every position drawn with one position's
noise) that its test must reject.
"""
import random

import pytest

import ssd.models as ssd_models
from ssd import LLM, EngineConfig, SamplingParams
from ssd.testing import TestingConfig
from tests.reference import law
from tests.reference.stats import g_test, samples_for_power

N_PROMPTS, N_TOKENS = 32, 48
SETTINGS = {"t0.7-topk40-topp0.9": (0.7, 40, 0.9), "t1.0-topk50-topp0.95": (1.0, 50, 0.95)}
# name: (mode, engine settings, testing switches)
VARIANTS = {
    "sd": ("sd", {}, {}),
    "ssd-default": ("ssd", {}, {}),
    "ssd-neural": ("ssd", {"fallback": "neural"}, {}),
    "ssd-fast": ("ssd", {"fallback": "fast"}, {}),
    "ssd-auto-alternating": ("ssd", {"fallback": "auto"}, {"auto_alternate": True}),
    "ssd-always-miss": ("ssd", {"fallback": "neural"}, {"always_miss": True}),
    "ssd-geometric": ("ssd", {"fanout": "geometric"}, {}),
    "ssd-list": ("ssd", {"fanout": [3, 2, 1, 2]}, {}),
    "ssd-budget-4": ("ssd", {"fanout_budget": 4}, {}),
    # KV for max_batch sequences of full length (test_seeded_output_equals_ar) and 3
    # draft blocks more: the trees run out.
    "ssd-partial-trees": ("ssd", {"fallback": "neural", "fanout_budget": 8, "kv_block_size": 4, "max_model_len": 96},
                          {"tree_blocks": 3}),
}


def prompts(seed=0, n=N_PROMPTS):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(n)]


def seeded(temperature, top_k, top_p, n=N_PROMPTS, seed0=100, max_tokens=N_TOKENS):
    return [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                           ignore_eos=True, seed=seed0 + i) for i in range(n)]


@pytest.fixture(scope="module")
def ar_outputs(pair):
    with LLM(pair[0], max_model_len=256, coupling="gumbel") as ar:
        return {name: [o.token_ids for o in ar.generate(prompts(), seeded(*s))] for name, s in SETTINGS.items()}


@pytest.mark.parametrize("max_batch", [1, 8])
@pytest.mark.parametrize("draft_kind", ["random", "target"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_seeded_output_equals_ar(pair, ar_outputs, setting, variant, draft_kind, max_batch):
    target, draft = pair
    mode, engine, switches = VARIANTS[variant]
    engine = {"max_model_len": 256, **engine}
    if draft_kind == "target":
        # The draft on the exact kernels: its q is the target's p bitwise, so its proposals are
        # the target's own draws.
        draft, engine["draft_matmul_min_rows"] = target, 0
    if switches.get("tree_blocks"):
        engine["kv_capacity_tokens"] = engine["max_model_len"] * max_batch
    with LLM(target, draft=draft, mode=mode, adaptive=False, k=3, max_batch=max_batch, coupling="gumbel",
             testing=TestingConfig(**switches), **engine) as llm:
        got = [o.token_ids for o in llm.generate(prompts(), seeded(*SETTINGS[setting]))]
        stats = llm.stats()
    assert got == ar_outputs[setting]
    accepted, proposed = stats["draft_tokens_accepted"], stats["draft_tokens_proposed"]
    if draft_kind == "target":
        # Every proposal but the n-gram fallback's is the target's draw at its position; a tree
        # that ranked its candidates at the wrong positions would miss far more often.
        fast_rejected = stats["fast_tokens_proposed"] - stats["fast_tokens_accepted"]
        assert accepted == proposed - fast_rejected > 0
        if mode == "ssd" and not switches:
            assert stats["cache_hits"] >= 0.8 * stats["cache_lookups"]
    else:
        assert 0 < accepted < proposed
    if mode == "ssd":
        assert stats["cache_lookups"] > 0
        if switches.get("always_miss"):
            assert stats["cache_hits"] == 0
        elif draft_kind == "target":
            assert stats["cache_hits"] > 0
        if switches.get("auto_alternate") and draft_kind == "random":  # (a perfect draft rarely misses)
            assert stats["fallback_fast"] > 0 and stats["fallback_neural"] > 0
        if switches.get("tree_blocks"):
            assert stats["partial_trees"] > 0


def test_tree_ranks_candidates_under_the_shared_noise(pair):
    """The bonus after a rejection is the target's draw; the tree ranks its candidates by the
    draft's scores under the same noise at the same position. Against a draft the target mostly
    rejects, 3 candidates per fork point then hold the outcome in about 10% of rounds; ranked
    with the noise of the next position instead (a deliberately broken build) in about 1%."""
    target, draft = pair
    params = seeded(1.0, 50, 0.95)
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=256, max_batch=8, fallback="neural",
             fanout=[3, 3, 3, 3], coupling="gumbel") as ssd:
        ssd.generate(prompts(), params)
        stats = ssd.stats()
    assert stats["cache_lookups"] > 1000
    assert stats["cache_hits"] >= 0.05 * stats["cache_lookups"]


def test_stops_truncation_logprobs_and_chunked_prefill_equal_ar(pair):
    """Requests that end on a stop token or at max_model_len, report logprobs, and prefill in
    chunks: ssd (and sd) end and report exactly as ar does."""
    target, draft = pair
    texts = prompts(3)
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=40, stop_token_ids=[7, 19, 203],
                             logprobs=2, seed=300 + i) for i in range(N_PROMPTS)]
    common = {"max_model_len": 48, "max_batched_tokens": 16, "coupling": "gumbel"}

    def run(**kw):
        with LLM(target, **common, **kw) as llm:
            return [(o.token_ids, o.finish_reason, o.logprobs) for o in llm.generate(texts, params)]

    want = run()
    reasons = {r for _, r, _ in want}
    assert reasons == {"stop", "length"}, reasons
    assert run(draft=draft, mode="sd", adaptive=False, k=3) == want
    assert run(draft=draft, mode="ssd", adaptive=False, k=3, max_batch=8) == want


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_seeded_output_under_preemption_equals_ar(pair, mode):
    target, draft = pair
    rng = random.Random(1)
    texts = [[rng.randrange(256) for _ in range(rng.randrange(4, 40))] for _ in range(N_PROMPTS)]
    params = seeded(1.0, 50, 0.95, seed0=500)
    with LLM(target, max_model_len=128, coupling="gumbel") as ar:
        want = [o.token_ids for o in ar.generate(texts, params)]
    with LLM(target, draft=draft, mode=mode, adaptive=False, k=4, max_model_len=128, max_batch=16, kv_block_size=8,
             kv_capacity_tokens=640, coupling="gumbel") as llm:
        got = [o.token_ids for o in llm.generate(texts, params)]
        stats = llm.stats()
    assert stats["num_preemptions"] >= 1
    assert got == want


def test_mixed_batch_and_unseeded_requests_equal_ar(pair):
    """Greedy, two sampled settings and unseeded requests in one ssd batch; an
    unseeded request draws a fresh seed, which ar reproduces."""
    target, draft = pair
    kinds = [SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)]
    kinds += [seeded(*s, n=1, seed0=900)[0] for s in SETTINGS.values()]
    kinds += [SamplingParams(temperature=0.9, top_p=0.9, max_tokens=N_TOKENS, ignore_eos=True)]
    params = [kinds[i % len(kinds)] for i in range(N_PROMPTS)]
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=256, max_batch=8, coupling="gumbel") as ssd:
        outs = ssd.generate(prompts(2), params)
    seeds = [o.metrics["seed"] for o in outs]
    unseeded = [s for s, p in zip(seeds, params) if p.seed is None and p.temperature > 0]
    assert len(set(unseeded)) == len(unseeded) == N_PROMPTS // len(kinds)
    replay = [SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, max_tokens=N_TOKENS,
                             ignore_eos=True, seed=s) for p, s in zip(params, seeds)]
    with LLM(target, max_model_len=256, coupling="gumbel") as ar:
        want = [o.token_ids for o in ar.generate(prompts(2), replay)]
    assert [o.token_ids for o in outs] == want


def test_rejection_coupling_depends_on_the_draft(pair):
    """Why the Gumbel coupling exists: with rejection sampling the same seed gives
    another sample under another draft (the same law, another draw)."""
    target, draft = pair
    params = seeded(1.0, 50, 0.95)
    with LLM(target, max_model_len=256, coupling="rejection") as ar:
        want = [o.token_ids for o in ar.generate(prompts(), params)]
    with LLM(target, draft=draft, mode="sd", adaptive=False, k=3, max_model_len=256, coupling="rejection") as sd:
        got = [o.token_ids for o in sd.generate(prompts(), params)]
    assert sum(g != w for g, w in zip(got, want)) >= N_PROMPTS // 2


def test_coupling_is_validated():
    with pytest.raises(ValueError, match="coupling: must be 'rejection' or 'gumbel', got 'gumble'"):
        EngineConfig(coupling="gumble")


# --- the output law (vocabulary-4 pair), every mode ---------------------------------------------

VOCAB, PROMPT, LAW_TOKENS, K = 4, [1, 3, 0, 2], 7, 2
ALPHA, BROKEN = 0.001, 1e-6
LAW_SETTING = (0.9, 3, 0.9)
# name: (mode, max_batch, engine settings)
LAW_CASES = {
    "ar": ("ar", 512, {}),
    "sd": ("sd", 512, {}),
    "sd-batch1": ("sd", 1, {}),
    "ssd-neural": ("ssd", 512, {"fallback": "neural", "fanout": [2, 2, 2]}),
    "ssd-fast-batch4": ("ssd", 4, {"fallback": "fast", "fanout": [2, 2, 2]}),
    "ssd-confidence": ("ssd", 512, {"fallback": "neural", "fanout": "confidence"}),
}


def law_run(small_pair, case, testing=None, fraction=1, **settings):
    """Samples the law test (or 1 / fraction of it); returns (p-values of each view, stats).

    settings: more engine fields (the device-round tests add backend="aten")."""
    target, draft = small_pair
    mode, max_batch, engine = LAW_CASES[case]
    engine = {**engine, **settings}
    extra = {} if mode == "ar" else {"draft": draft, "k": K}
    with LLM(target, mode=mode, adaptive=False, max_model_len=32, max_batch=max_batch, max_batched_tokens=8192, coupling="gumbel",
             testing=testing, **extra, **engine) as llm:
        # The exact law by enumeration on the CPU (the oracle), whatever the engine's placement.
        laws = law.views(law.exact_joint(ssd_models.load(target), PROMPT, LAW_TOKENS, VOCAB, *LAW_SETTING))
        n = max(samples_for_power(p, tv=0.01, alpha=ALPHA, power=0.9) for p in laws) // fraction
        outs = llm.generate([PROMPT] * n, seeded(*LAW_SETTING, n=n, seed0=21_000_000, max_tokens=LAW_TOKENS))
        stats = llm.stats()
    counts = law.counts_of(outs, VOCAB, LAW_TOKENS)
    return [g_test(o, e) for o, e in zip(law.views(counts), laws)], stats


@pytest.mark.parametrize("case", sorted(LAW_CASES))
def test_output_law_equals_target(small_pair, case):
    p_values, stats = law_run(small_pair, case)
    if case != "ar":
        accept = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
        assert 0.05 < accept < 0.95, "both acceptance and rejection must be exercised"
    if case.startswith("ssd"):
        assert stats["cache_hits"] > 0
    assert min(p_values) > ALPHA


@pytest.mark.parametrize("case", ["ar", "sd", "ssd-neural"])
def test_noise_shared_across_positions_fails_the_law_test(small_pair, case):
    """Fault: the target draws every position with position 0's noise."""
    p_values, _ = law_run(small_pair, case, testing=TestingConfig(fault_shared_noise=True), fraction=4)
    assert min(p_values) < BROKEN


# --- the constructed SmolLM2 pair ----------------------------------------------------------------


@pytest.fixture(scope="module")
def regime():
    from ssd.assets import humaneval_prompts, mtbench_prompts
    from ssd.testing import regime_pair

    pair = regime_pair(acceptance=0.75, cost_ratio=0.25)
    chats = [[{"role": "user", "content": q}] for q in mtbench_prompts(2) + humaneval_prompts(2)]
    return pair, chats


REGIME_SETTINGS = {"t0.7-topk50-topp0.9": (0.7, 50, 0.9), "t1.0-topp0.95": (1.0, 0, 0.95)}
# Each speculative configuration at one of the settings: a run of the 538M-parameter target costs
# about a minute on a 2-core CPU, and the identity does not depend on which setting meets which mode.
REGIME_MODES = {"t0.7-topk50-topp0.9": [("sd", {}), ("ssd", {})],
                "t1.0-topp0.95": [("ssd", {"fallback": "neural"}), ("ssd", {"fallback": "fast"})]}


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(REGIME_SETTINGS))
def test_seeded_output_equals_ar_on_regime_pair(regime, setting):
    pair, chats = regime
    temperature, top_k, top_p = REGIME_SETTINGS[setting]
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=32, ignore_eos=True,
                             seed=40 + i) for i in range(len(chats))]
    with LLM(str(pair.target), max_model_len=1024, coupling="gumbel") as ar:
        want = [o.token_ids for o in ar.chat(chats, params)]
    for mode, extra in REGIME_MODES[setting]:
        with LLM(str(pair.target), draft=str(pair.draft), mode=mode, k=4, max_model_len=1024, max_batch=2,
                 coupling="gumbel", **extra) as llm:
            got = [o.token_ids for o in llm.chat(chats, params)]
            stats = llm.stats()
        assert got == want, (mode, extra)
        assert 0 < stats["draft_tokens_accepted"] < stats["draft_tokens_proposed"]
        if mode == "ssd":
            assert stats["cache_hits"] > 0
