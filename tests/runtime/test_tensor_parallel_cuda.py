"""Tensor parallelism on GPUs: ranks 1.. on their own GPUs, talking over NCCL (scripts/gpu_check.sh's
tensor_parallel step; skipped with fewer than two GPUs).

Checked: greedy ar over a target split across two GPUs gives the tokens the unsplit target gives on
one (the partial sums' order changes the logits by about 1e-6 of the largest here, which leaves this
model's greedy choices alone), greedy sd at two ranks gives ar's, the collectives are counted, and
shutdown leaves no worker. (A lost rank is NCCL's watchdog's to handle, after the timeout: it aborts
the processes, so it is not tested here.)
"""
from __future__ import annotations

import random

import pytest

from ssd import LLM, SamplingParams
from tests.reference.processes import assert_gone, tensor_parallel_workers

pytestmark = [pytest.mark.cuda, pytest.mark.multi_gpu]


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_two_gpus_give_one_gpus_tokens(pair):
    target, draft = pair
    rng = random.Random(7)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    with LLM(target, target_device="cuda:0", max_model_len=128) as one:
        want = [o.token_ids for o in one.generate(prompts, greedy(24))]
    pids = []
    with LLM(target, target_device="cuda:0", tensor_parallel_size=2, max_model_len=128) as ar:
        got = [o.token_ids for o in ar.generate(prompts, greedy(24))]
        assert ar.stats()["tensor_parallel_collectives"] > 0
        pids += [p.pid for p in ar._workers.procs]
    assert got == want
    with LLM(target, draft=draft, mode="sd", target_device="cuda:0", draft_device="cuda:0", k=3, adaptive=False,
             tensor_parallel_size=2, max_model_len=128) as sd:
        assert [o.token_ids for o in sd.generate(prompts, greedy(24))] == want
        pids += [p.pid for p in sd._workers.procs]
    assert_gone(pids)
    assert not tensor_parallel_workers()
