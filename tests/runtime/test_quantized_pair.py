"""Speculative modes over quantized weights (dtype / draft_dtype, ssd.models.quantized).

A quantized target is a model of its own (the fp32 model of its dequantised
weights), so sd and ssd must give its greedy tokens and its output law, with
a draft quantized otherwise.
"""
import random

import pytest

import ssd.models as ssd_models
from ssd import LLM, SamplingParams
from tests.reference import law
from tests.reference.stats import samples_for_power


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_equals_ar(pair, mode):
    target, draft = pair
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(12)]
    with LLM(target, dtype="q4_0", max_model_len=256) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(48))]
        assert set(ar.model.formats.values()) == {"q4_0"}
    with LLM(target, draft=draft, mode=mode, dtype="q4_0", draft_dtype="q8_0", adaptive=False, k=3,
             max_model_len=256, max_batch=8) as spec:
        got = [o.token_ids for o in spec.generate(prompts, greedy(48))]
        assert set(spec.draft_model.formats.values()) == {"q8_0"}
        assert spec.stats()["draft_tokens_accepted"] > 0
    assert got == want
    # The fp32 target decodes otherwise: the tokens above are the quantized model's own.
    with LLM(target, max_model_len=256) as fp32:
        assert [o.token_ids for o in fp32.generate(prompts, greedy(48))] != want


VOCAB = 4
PROMPT = [1, 3, 0, 2]
N_TOKENS = 7


def test_ssd_output_law_is_the_quantized_targets(small_pair):
    target, draft = small_pair
    temperature, top_k, top_p = 1.0, 0, 1.0
    joint = law.exact_joint(ssd_models.load(target, dtype="q4_1"), PROMPT, N_TOKENS, VOCAB, temperature, top_k, top_p)
    laws = law.views(joint)
    n = max(samples_for_power(p, tv=0.01, alpha=0.001, power=0.9) for p in laws)
    params = [SamplingParams(temperature=temperature, max_tokens=N_TOKENS, ignore_eos=True, seed=4_000_000 + i)
              for i in range(n)]
    with LLM(target, draft=draft, mode="ssd", dtype="q4_1", draft_dtype="q4_0", adaptive=False, k=2,
             max_model_len=32, max_batch=512, max_batched_tokens=8192, fanout=[2, 2, 2],
             coupling="rejection") as spec:
        outs = spec.generate([PROMPT] * n, params)
        stats = spec.stats()
    counts = law.counts_of(outs, VOCAB, N_TOKENS)
    accept = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
    assert 0.05 < accept < 0.95, "both acceptance and rejection must be exercised"
    # and the same test rejects the quantized draft's own law: it could see a wrong one
    law.assert_law_and_power(counts, joint, law.exact_joint(ssd_models.load(draft, dtype="q4_0"), PROMPT, N_TOKENS,
                                                             VOCAB, temperature, top_k, top_p))
