"""The engine's decisions reach Python's `logging` under "ssd", and nothing does by default."""
import logging
import random

import pytest

from ssd import LLM, SamplingParams
from ssd.testing import TestingConfig


def _preempting_run(model, **engine):
    """A batch that cannot all fit in the KV cache: the scheduler must preempt."""
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(40)] for _ in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    with LLM(model, max_model_len=128, max_batch=16, kv_block_size=8, kv_capacity_tokens=256, **engine) as llm:
        llm.generate(prompts, params)
        return llm.stats()


def _ssd_records(caplog):
    return [r for r in caplog.records if r.name == "ssd"]


def test_silent_by_default(pair, caplog):
    caplog.set_level(logging.WARNING)  # Python's default threshold
    stats = _preempting_run(pair[0])
    assert stats["num_preemptions"] >= 1
    assert _ssd_records(caplog) == []


def test_preemptions_and_fallback_switches_are_logged(pair, caplog):
    caplog.set_level(logging.INFO, logger="ssd")
    stats = _preempting_run(pair[0])
    messages = [r.getMessage() for r in _ssd_records(caplog)]
    preempted = [m for m in messages if m.startswith("preempted request")]
    assert len(preempted) == stats["num_preemptions"] >= 1
    assert all(r.levelno == logging.INFO for r in _ssd_records(caplog))
    caplog.clear()
    # Every lookup misses; the auto fallback tries the free n-gram kind first, and says so.
    target, draft = pair
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=128, fallback="auto",
             testing=TestingConfig(always_miss=True)) as ssd:
        ssd.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
        stats = ssd.stats()
    switches = [m for m in (r.getMessage() for r in _ssd_records(caplog)) if m.startswith("ssd fallback:")]
    assert stats["fallback_fast"] > 0
    assert switches and switches[0].startswith("ssd fallback: fast")


@pytest.mark.parametrize("level", [logging.DEBUG, logging.ERROR])
def test_level_follows_the_logger(pair, caplog, level):
    caplog.set_level(level, logger="ssd")
    _preempting_run(pair[0])
    got = any(r.getMessage().startswith("preempted request") for r in _ssd_records(caplog))
    assert got == (level <= logging.INFO)
