"""SamplingParams.logprobs: each token's log-probability under the distribution it was drawn from
(the target's logits at its position, through temperature, top-k and top-p), checked against
transformers' logits and the reference logits processing, in every mode."""
from __future__ import annotations

import math

import pytest
import torch

from ssd import LLM, SamplingParams
from tests.reference.sampling_ref import processed_probs

PARAMS = dict(temperature=0.8, top_k=20, top_p=0.9)


@pytest.fixture(scope="module")
def hf_target(pair):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(pair[0], attn_implementation="eager").eval()


def reference(hf_model, prompt: list[int], tokens: list[int], n_top: int):
    """[(logprob of the token, [(id, logprob)] of the n_top most likely)] per position."""
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([prompt + tokens])).logits[0].to(torch.float64)
    out = []
    for i, token in enumerate(tokens):
        p = processed_probs(logits[len(prompt) - 1 + i], **PARAMS)
        order = sorted(range(p.numel()), key=lambda t: (-float(p[t]), t))[:n_top]
        out.append((math.log(float(p[token])), [(t, math.log(float(p[t]))) for t in order if p[t] > 0]))
    return out


@pytest.mark.parametrize("backend", ["auto", "aten"])  # aten: computed on the device side of the round
@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_logprobs_are_those_of_the_processed_target_distribution(pair, hf_target, mode, backend):
    target, draft = pair
    prompts = [[1, 2, 3], [40, 41], [7] * 5, [100, 200, 30, 4]]
    with LLM(target, mode=mode, draft=None if mode == "ar" else draft, k=3, max_model_len=128,
             backend=backend) as llm:
        params = SamplingParams(max_tokens=24, seed=5, logprobs=5, ignore_eos=True, **PARAMS)
        outs = [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]
        chunks = list(llm.stream(prompts[0], params))
    # A stream's chunks carry their tokens' logprobs (its tokens may differ from generate's: in ssd a
    # seeded sample depends on the proposals).
    outs.append(([t for c in chunks for t in c.token_ids], [lp for c in chunks for lp in (c.logprobs or [])]))
    checked = 0
    for prompt, (token_ids, logprobs) in zip(prompts + prompts[:1], outs):
        assert len(logprobs) == len(token_ids) == 24
        for got, token, (want_lp, want_top) in zip(logprobs, token_ids,
                                                   reference(hf_target, prompt, token_ids, 5)):
            assert got.token == token
            assert got.logprob == pytest.approx(want_lp, abs=2e-4), (mode, prompt)
            assert len(got.top) == len(want_top)
            assert [lp for _, lp in got.top] == pytest.approx([lp for _, lp in want_top], abs=2e-4)
            # Ids in the same order, unless two are near-tied (then either order is right).
            assert [t for t, _ in got.top] == [t for t, _ in want_top] or _near_ties(want_top)
            checked += 1
    assert checked == 5 * 24


def _near_ties(top) -> bool:
    return any(abs(a[1] - b[1]) < 1e-4 for a, b in zip(top, top[1:]))


def test_greedy_logprobs_and_no_logprobs(pair):
    """Temperature 0 draws from a one-hot distribution: logprob 0, nothing else listed. Without
    logprobs requested, none are reported."""
    with LLM(pair[0], max_model_len=64) as llm:
        out = llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=6, logprobs=3))[0]
        assert [(lp.logprob, lp.top) for lp in out.logprobs] == [(0.0, [(t, 0.0)]) for t in out.token_ids]
        assert llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=6))[0].logprobs is None


@pytest.mark.parametrize("value,message", [(21, r"logprobs: must be none or in \[0, 20\], got 21"),
                                           (-1, r"logprobs: -1 is out of range")])
def test_logprobs_range(value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(logprobs=value)
