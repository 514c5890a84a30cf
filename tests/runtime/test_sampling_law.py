"""The law of sampled tokens equals the exact processed distribution (G-tests)."""
import itertools

import numpy as np
import pytest
import torch

from ssd import LLM, SamplingParams
from tests.reference.sampling_ref import processed_probs
from tests.reference.stats import g_test, samples_for_power
from tests.reference.tiny_models import TinySpec, build_tiny_model

VOCAB = 6
PROMPT = [1, 4, 2, 5, 3]


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    spec = TinySpec(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, seed=5, init_std=0.1)
    path, _ = build_tiny_model(spec, tmp_path_factory.mktemp("law"))
    return path


@pytest.fixture(scope="module", params=["rejection", "gumbel"])
def llm(small_vocab_model, request):
    """ar under each coupling: inverse-CDF draws of keyed uniforms, or Gumbel-max draws of keyed noise."""
    engine = LLM(small_vocab_model, max_model_len=64, max_batch=256, max_batched_tokens=4096, coupling=request.param)
    yield engine
    engine.shutdown()


def joint_law(llm, temperature, top_k, top_p):
    """Exact law of the first two generated tokens: [VOCAB * VOCAB]."""
    first = processed_probs(llm.model.logits(PROMPT)[-1], temperature, top_k, top_p)
    law = np.zeros(VOCAB * VOCAB)
    for a in range(VOCAB):
        if first[a] == 0:
            continue
        second = processed_probs(llm.model.logits(PROMPT + [a])[-1], temperature, top_k, top_p)
        law[a * VOCAB:(a + 1) * VOCAB] = (first[a] * second).numpy()
    return law


def sample_counts(llm, n, temperature, top_k, top_p, seed0):
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=2,
                             ignore_eos=True, seed=seed0 + i) for i in range(n)]
    outs = llm.generate([PROMPT] * n, params)
    counts = np.zeros(VOCAB * VOCAB)
    for o in outs:
        assert o.finish_reason == "length", o.error
        counts[o.token_ids[0] * VOCAB + o.token_ids[1]] += 1
    return counts


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 3, 1.0), (1.2, 0, 0.8)])
def test_two_token_law(llm, temperature, top_k, top_p):
    law = joint_law(llm, temperature, top_k, top_p)
    assert (law > 0).sum() >= 4, "law too concentrated to test"
    n = samples_for_power(law, tv=0.01, alpha=0.01, power=0.9)
    counts = sample_counts(llm, n, temperature, top_k, top_p, seed0=1000)
    assert g_test(counts, law) > 0.01
    # The same test rejects a law that is off: the processed law at another temperature.
    wrong = joint_law(llm, temperature * 1.25, top_k, top_p)
    assert g_test(counts, wrong) < 0.01


def test_seed_reproduces_output(llm):
    p = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=42)
    alone = llm.generate([PROMPT], p)[0].token_ids
    noise = [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=s) for s in range(7)]
    crowd = llm.generate([PROMPT[:3]] * 3 + [PROMPT] + [PROMPT[:2]] * 4, noise[:3] + [p] + noise[3:])
    assert crowd[3].token_ids == alone
    other = llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=43))
    assert other[0].token_ids != alone
