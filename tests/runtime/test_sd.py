"""Synchronous speculative decoding (mode "sd"): exact at temperature 0 and in law."""
import itertools
import random

import numpy as np
import pytest

import ssd.models
from ssd import LLM, SamplingParams
from tests.reference import law
from tests.reference.stats import g_test, samples_for_power


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


# (target_device, draft_device): all on the CPU; with a GPU, both models on it,
# and the draft on the CPU beside a GPU target.
PLACEMENTS = [pytest.param(("cpu", "cpu"), id="cpu"),
              pytest.param(("cuda", "cuda"), id="cuda", marks=pytest.mark.cuda),
              pytest.param(("cuda", "cpu"), id="cuda-draft-cpu", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("max_batch", [1, 8])
@pytest.mark.parametrize("same_draft", [False, True])
def test_greedy_equals_ar(pair, max_batch, same_draft, placement):
    target, draft = pair
    target_device, draft_device = placement
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(32)]
    with LLM(target, max_model_len=256, target_device=target_device) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(64))]
    # draft_matmul_min_rows=0: a draft that is the target must also compute like it
    # (the bf16 pair kernels would otherwise serve its many-row forwards). A
    # draft that is the target on another device computes otherwise, so it is
    # only all but always accepted.
    with LLM(target, draft=target if same_draft else draft, mode="sd", adaptive=False, k=3, max_model_len=256,
             max_batch=max_batch, draft_matmul_min_rows=0 if same_draft else 4,
             target_device=target_device, draft_device=draft_device) as sd:
        got = [o.token_ids for o in sd.generate(prompts, greedy(64))]
        stats = sd.stats()
    assert got == want
    assert stats["rounds"] > 0
    rate = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
    if same_draft and target_device == draft_device:
        assert rate == 1.0  # the draft IS the target: every greedy proposal is accepted
        assert stats["rounds"] == 32 * 64 // 4
    elif same_draft:
        assert rate > 0.95


def test_greedy_with_preemption_equals_ar(pair):
    target, draft = pair
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(4, 40))] for _ in range(24)]
    with LLM(target, max_model_len=128) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(48))]
    with LLM(target, draft=draft, mode="sd", adaptive=False, k=4, max_model_len=128, max_batch=16, kv_block_size=8,
             kv_capacity_tokens=512) as sd:
        got = [o.token_ids for o in sd.generate(prompts, greedy(48))]
        assert sd.stats()["num_preemptions"] >= 1
    assert got == want


VOCAB = 4
PROMPT = [1, 3, 0, 2]
N_TOKENS = 7  # with k = 2 (up to 3 tokens a round), at least three rounds


def exact_joint(model, temperature, top_k, top_p):
    """Law of the first N_TOKENS tokens of `model` by enumeration."""
    return law.exact_joint(model, PROMPT, N_TOKENS, VOCAB, temperature, top_k, top_p)


views = law.views


LAW_CASES = [(1.0, 0, 1.0, 512), (0.9, 3, 0.9, 512), (1.0, 0, 1.0, 1), (0.9, 3, 0.9, 4)]


@pytest.mark.parametrize("temperature,top_k,top_p,max_batch", LAW_CASES)
def test_output_law_equals_target(small_pair, temperature, top_k, top_p, max_batch):
    check_output_law(small_pair, temperature, top_k, top_p, max_batch)


@pytest.mark.cuda
@pytest.mark.parametrize("draft_device,case", [("cuda", LAW_CASES[0]), ("cpu", LAW_CASES[1])])
def test_output_law_equals_target_on_cuda(small_pair, draft_device, case):
    # Two cases, not all four: the device check (scripts/gpu_check.sh) has a time budget.
    check_output_law(small_pair, *case, target_device="cuda", draft_device=draft_device)


def check_output_law(small_pair, temperature, top_k, top_p, max_batch, **placement):
    target, draft = small_pair
    # The target's exact law, by enumeration on the CPU (the oracle).
    joint = exact_joint(ssd.models.load(target), temperature, top_k, top_p)
    # The rejection coupling's law (the Gumbel coupling's: tests/runtime/test_gumbel_coupling.py).
    with LLM(target, draft=draft, mode="sd", adaptive=False, k=2, max_model_len=32, max_batch=max_batch,
             max_batched_tokens=8192, coupling="rejection", **placement) as sd:
        laws = views(joint)
        n = max(samples_for_power(law, tv=0.01, alpha=0.001, power=0.9) for law in laws)
        params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                 max_tokens=N_TOKENS, ignore_eos=True, seed=7_000_000 + i) for i in range(n)]
        outs = sd.generate([PROMPT] * n, params)
        stats = sd.stats()
    counts = np.zeros_like(joint)
    for o in outs:
        assert len(o.token_ids) == N_TOKENS
        counts[tuple(o.token_ids)] += 1
    accept = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
    assert 0.05 < accept < 0.95, "both acceptance and rejection must be exercised"
    assert stats["rounds"] >= 3 * n
    for law, observed in zip(laws, views(counts)):
        assert g_test(observed, law) > 0.001
    # The same test rejects the draft's own law: it has the power to see a wrong output law.
    with LLM(draft, max_model_len=32) as draft_llm:
        wrong = views(exact_joint(draft_llm.model, temperature, top_k, top_p))
    assert min(g_test(o, w) for o, w in zip(views(counts), wrong)) < 1e-6


def test_seeded_output_does_not_depend_on_batch(small_pair):
    target, draft = small_pair
    p = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=5)
    # One draft kernel path for every batch size (by default forwards of 4+ rows
    # take the bf16 pair kernels and smaller ones the exact path).
    with LLM(target, draft=draft, mode="sd", adaptive=False, k=2, max_model_len=64, draft_matmul_min_rows=1,
             coupling="rejection") as sd:
        alone = sd.generate([PROMPT], p)[0].token_ids
        noise = [SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=s) for s in range(5)]
        crowd = sd.generate([PROMPT[:2]] * 2 + [PROMPT] + [PROMPT[:3]] * 3, noise[:2] + [p] + noise[2:])
    assert crowd[2].token_ids == alone


def test_draft_vocabulary_must_match(pair, small_pair):
    with pytest.raises(ValueError, match=r"draft vocabulary \(4 tokens\) differs from the target's \(256 tokens\)"):
        LLM(pair[0], draft=small_pair[1], mode="sd", adaptive=False, max_model_len=64)
    with pytest.raises(ValueError, match="needs a draft model"):
        LLM(pair[0], mode="sd", adaptive=False, max_model_len=64)
    with pytest.raises(ValueError, match="takes no draft model"):
        LLM(pair[0], draft=pair[1], mode="ar", max_model_len=64)
