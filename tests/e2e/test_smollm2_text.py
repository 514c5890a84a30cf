"""Text out of a real tokenizer (SmolLM2's GGUF): incremental detokenization,
stop strings, streams, and the memory the default configuration takes."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from ssd import LLM, SamplingParams
from ssd.assets import smollm2_gguf_path
from ssd.dispatch import _Text


@pytest.fixture(scope="module")
def llm():
    with LLM(str(smollm2_gguf_path()), max_model_len=512) as engine:
        yield engine


def test_incremental_text_equals_a_full_decode(llm):
    """Random ids (multi-byte characters split over tokens included): the pieces
    streamed, and the final text, equal one decode of all the ids."""
    tok = llm.tokenizer
    rng = random.Random(0)
    for trial in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 30))]
        if trial % 2:
            ids = tok.encode("naïve café 日本語 🎉\n  def f(x):") + ids[:3]
        text = _Text(tok, [])
        streamed = ""
        for i in ids:
            text.add(i)
            streamed += text.take(final=False)
        text.finish(ids, cut=False)
        streamed += text.take(final=True)
        assert text.text == streamed == tok.decode(ids)


def test_each_token_is_decoded_once(llm, monkeypatch):
    """A stream of n tokens does not re-decode its output per token (quadratic):
    the only full decode is the final one."""
    calls = []
    decode = llm.tokenizer.decode
    monkeypatch.setattr(llm.tokenizer, "decode", lambda ids, **kw: calls.append(len(ids)) or decode(ids, **kw))
    chunks = list(llm.stream("Once upon a time", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))
    assert sum(len(c.token_ids) for c in chunks) == 40
    assert calls == [40]


@pytest.mark.parametrize("stop", [None, ["the"], [" and", "\n"]])
def test_stream_equals_generate(llm, stop):
    params = SamplingParams(temperature=0.8, max_tokens=48, seed=5, stop=stop)
    want = llm.generate(["Tell me a story about a dragon."], params)[0]
    chunks = list(llm.stream("Tell me a story about a dragon.", params))
    assert "".join(c.text for c in chunks) == want.text
    assert [t for c in chunks for t in c.token_ids] == want.token_ids
    assert chunks[-1].finish_reason == want.finish_reason
    if stop:
        assert want.finish_reason == "stop" and not any(s in want.text for s in stop)


def test_a_stop_string_keeps_the_metrics(llm):
    out = llm.generate(["The capital of France is"],
                       SamplingParams(temperature=0, max_tokens=64, stop=["Paris"], ignore_eos=True))[0]
    assert out.finish_reason == "stop" and "Paris" not in out.text
    m = out.metrics
    assert m["prompt_tokens"] == len(out.prompt_token_ids)
    assert m["generated_tokens"] == len(out.token_ids)
    assert 0 < m["time_to_first_token"] <= m["finish_time"]


# The peak is VmHWM: getrusage's ru_maxrss survives exec, so it would report the parent's.
_MEMORY_SCRIPT = """
import json
from ssd import LLM, SamplingParams
from ssd.assets import smollm2_gguf_path
llm = LLM(str(smollm2_gguf_path()))
out = llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=32))[0]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
peak = int(status["VmHWM"].split()[0]) * 1024
print(json.dumps({"peak": peak, "max_model_len": llm.config.max_model_len, "tokens": len(out.token_ids)}))
llm.shutdown()
"""


def test_default_configuration_stays_under_1_5_gb():
    """The defaults load SmolLM2 with max_model_len = its 8192 positions and a
    KV budget reserved, not touched: one generate() peaks under 1.5 GB."""
    run = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["max_model_len"] == 8192 and got["tokens"] == 32
    assert got["peak"] < 1.5e9, f"peak resident memory {got['peak'] / 1e9:.2f} GB"
