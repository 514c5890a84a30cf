"""Greedy sd and ssd equal ar token for token on the constructed SmolLM2 regime pair."""
import pytest

from ssd import LLM, SamplingParams
from ssd.assets import humaneval_prompts, mtbench_prompts
from ssd.testing import regime_pair


@pytest.fixture(scope="module")
def setup():
    pair = regime_pair(acceptance=0.75, cost_ratio=0.25)
    chats = [[{"role": "user", "content": q}] for q in mtbench_prompts(2) + humaneval_prompts(2)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    with LLM(str(pair.target), max_model_len=1024) as ar:
        want = [o.token_ids for o in ar.chat(chats, params)]
    return pair, chats, params, want


@pytest.mark.parametrize("mode,extra", [("sd", {}), ("ssd", {}), ("ssd", {"fallback": "neural"}),
                                        ("ssd", {"fallback": "fast"})])
def test_speculative_equals_ar_on_regime_pair(setup, mode, extra):
    pair, chats, params, want = setup
    with LLM(str(pair.target), draft=str(pair.draft), mode=mode, k=4, max_model_len=1024, **extra) as llm:
        got = [o.token_ids for o in llm.chat(chats, params)]
        stats = llm.stats()
    assert got == want
    # The pair is built to disagree sometimes: both acceptance and rejection happened.
    assert 0 < stats["draft_tokens_accepted"] < stats["draft_tokens_proposed"]
    if mode == "ssd":
        assert stats["cache_hits"] > 0 and stats["cache_lookups"] > stats["cache_hits"]
    if extra.get("fallback") == "fast":
        # Prompt lookup on real text beats uniformly random proposals (1 / vocab) by far.
        assert stats["fast_tokens_proposed"] > 0
        assert stats["fast_acceptance_rate"] > 100 * stats["random_token_acceptance"]
