"""The ssd draft worker's decisions reach the ``ssd`` logger, and only when asked for."""
import logging

from ssd import LLM, SamplingParams


def run(pair, caplog, level):
    target, draft = pair
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with caplog.at_level(level, logger="ssd"):
        with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=128, max_batch=4, fanout="geometric",
                 fallback="neural") as ssd:
            ssd.generate([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], params)
    return [r.getMessage() for r in caplog.records if r.name == "ssd"]


def test_tree_summaries_at_debug(pair, caplog):
    messages = run(pair, caplog, logging.DEBUG)
    trees = [m for m in messages if m.startswith("ssd tree: ")]
    assert trees, messages
    assert all(" branches, fork points " in m for m in trees)


def test_silent_above_info(pair, caplog):
    assert run(pair, caplog, logging.WARNING) == []
