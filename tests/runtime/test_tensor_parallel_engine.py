"""ssd.LLM with tensor_parallel_size: the target split over processes.

Rank 0 (this process) runs the engine, leading its target shard; ranks 1.. are
worker processes (python -m ssd.distributed) over gloo that follow its
forwards. Checked: greedy sd and ssd give ar's tokens at the same size, the
collectives are counted, a group larger than the KV heads is refused, a
killed worker ends the next request with an error, and no worker process is
left behind.
"""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from ssd import LLM, SamplingParams
from tests.reference.processes import assert_gone, tensor_parallel_workers


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_greedy_sd_and_ssd_equal_ar_at_two_ranks(pair):
    target, draft = pair  # 4 KV heads: 2 each; intermediate 96: 64 and 32 rows
    rng = random.Random(4)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(8)]
    pids = []
    with LLM(target, max_model_len=256) as one_rank:
        one_rank_tokens = [o.token_ids for o in one_rank.generate(prompts, greedy(32))]
    with LLM(target, tensor_parallel_size=2, max_model_len=256) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(32))]
        pids += [p.pid for p in ar._workers.procs]
        stats = ar.stats()
        assert stats["tensor_parallel_collectives"] > 0 and stats["tensor_parallel_collective_s"] > 0
    # Not bitwise one rank's logits (the partial sums' order), but within 1e-6 here, which leaves
    # this model's greedy choices alone: a follower that lost its KV would not.
    assert want == one_rank_tokens
    # The target as its own draft (every proposal accepted: verify rows become tokens) and the
    # random draft (proposals rejected: the followers' caches roll back with rank 0's tables).
    for mode in ("sd", "ssd"):
        for name, proposer in (("itself", target), ("random draft", draft)):
            with LLM(target, draft=proposer, mode=mode, tensor_parallel_size=2, adaptive=False, k=3,
                     max_model_len=256, max_batch=4) as spec:
                got = [o.token_ids for o in spec.generate(prompts, greedy(32))]
                pids += [p.pid for p in spec._workers.procs]
                stats = spec.stats()
            assert stats["draft_tokens_accepted"] > 0 if proposer is target else stats["draft_tokens_proposed"] > 0
            assert got == want, (mode, name)
    assert_gone(pids)
    assert not tensor_parallel_workers()


def test_bf16_caches_at_two_ranks_give_one_ranks_tokens(pair):
    """The followers build their caches in rank 0's KV dtype (carried in each
    forward's header): a follower holding fp32 keys would drift from rank 0's
    bf16 ones."""
    target, draft = pair
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    with LLM(target, max_model_len=256, kv_cache_dtype="bfloat16") as one_rank:
        want = [o.token_ids for o in one_rank.generate(prompts, greedy(24))]
    with LLM(target, draft=target, mode="sd", adaptive=False, k=3, tensor_parallel_size=2, max_model_len=256,
             max_batch=4, kv_cache_dtype="bfloat16") as two_ranks:
        got = [o.token_ids for o in two_ranks.generate(prompts, greedy(24))]
    assert got == want
    assert not tensor_parallel_workers()


def test_a_group_larger_than_the_kv_heads_is_refused(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="tensor_parallel_size 5 is larger than the model's 4 KV heads"):
        LLM(target, tensor_parallel_size=5, max_model_len=64)
    deadline = time.monotonic() + 10
    while tensor_parallel_workers():
        assert time.monotonic() < deadline, "worker processes left behind"
        time.sleep(0.1)


def test_a_killed_worker_ends_the_next_request_with_an_error(pair):
    target, _ = pair
    with LLM(target, tensor_parallel_size=2, max_model_len=64) as llm:
        first = llm.generate([[1, 2, 3]], greedy(4))[0]
        assert first.finish_reason == "length" and len(first.token_ids) == 4
        worker = llm._workers.procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        start = time.monotonic()
        out = llm.generate([[4, 5, 6]], greedy(4))[0]
        assert out.finish_reason == "error"
        assert time.monotonic() - start < 30
    assert not tensor_parallel_workers()


def test_served_at_two_ranks_answers_the_openai_client():
    """ssd serve's app over an engine whose target (SmolLM2, 3 KV heads: 2 and 1) is split in two."""
    import openai

    from ssd.assets import smollm2_gguf_path
    from ssd.async_llm import AsyncLLM
    from ssd.serve import ServerState, ServerThread

    llm = LLM(str(smollm2_gguf_path()), tensor_parallel_size=2, max_model_len=256, kv_cache_gib=0.25)
    try:
        want = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=12))[0]
        state = ServerState(AsyncLLM(llm), model_name="smollm2", max_in_flight=8)
        with ServerThread(state) as srv:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            r = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=12, temperature=0)
            assert r.choices[0].text == want.text and r.usage.completion_tokens == 12
    finally:
        llm.shutdown()
    assert not tensor_parallel_workers()


def test_ssd_output_law_at_two_ranks(small_pair):
    """Sampled ssd over a target split in two has the target's law (the exact joint of 7 tokens
    over a vocabulary of 4, computed from the one-rank model: the split changes the logits by
    about 1e-6 of the largest, far below what the test can see)."""
    from ssd import models as ssd_models
    from tests.reference import law
    from tests.reference.stats import samples_for_power

    target, draft = small_pair
    prompt, n_tokens, vocab = [1, 3, 0, 2], 7, 4
    joint = law.exact_joint(ssd_models.load(target), prompt, n_tokens, vocab, 1.0, 0, 1.0)
    laws = law.views(joint)
    n = max(samples_for_power(p, tv=0.01, alpha=0.001, power=0.9) for p in laws)
    params = [SamplingParams(temperature=1.0, max_tokens=n_tokens, ignore_eos=True, seed=5_000_000 + i)
              for i in range(n)]
    with LLM(target, draft=draft, mode="ssd", tensor_parallel_size=2, adaptive=False, k=2, max_model_len=32,
             max_batch=512, max_batched_tokens=8192, fanout=[2, 2, 2], coupling="rejection") as spec:
        outs = spec.generate([prompt] * n, params)
        stats = spec.stats()
    counts = law.counts_of(outs, vocab, n_tokens)
    accept = stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"]
    assert 0.05 < accept < 0.95, "both acceptance and rejection must be exercised"
    law.assert_law_and_power(counts, joint, law.exact_joint(ssd_models.load(draft), prompt, n_tokens, vocab, 1.0,
                                                             0, 1.0))
