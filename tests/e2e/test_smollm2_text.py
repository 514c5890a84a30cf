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


def test_inputs_that_are_no_prompts_are_refused_and_none_is_none(llm):
    assert llm.generate([]) == [] and llm.generate([], SamplingParams(max_tokens=2)) == []
    with pytest.raises(TypeError, match="prompt 0: bytes are not a prompt"):
        llm.generate(b"Hello")  # once read as the token ids 72, 101, ...
    with pytest.raises(TypeError, match="prompt 1: bytes are not a prompt"):
        llm.generate(["Hello", bytearray(b"Hello")])
    for text, where in (("\ud800", 0), ("ok \udfff", 3)):  # the tokenizer raised TypeError
        with pytest.raises(ValueError, match=f"prompt 0: is not valid Unicode: a lone surrogate .* at character "
                                             f"{where}"):
            llm.generate(text)
    with pytest.raises(ValueError, match="not valid Unicode"):
        llm.chat([{"role": "user", "content": "\ud83d"}])
    with pytest.raises(ValueError, match="stop: .* is not valid Unicode"):
        SamplingParams(stop=["\ud800"])


def test_chat_takes_openais_text_parts(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a river."},
                                          {"type": "text", "text": "One word."}]}]
    joined = [{"role": "user", "content": "Name a river.\nOne word."}]
    assert llm.chat_prompt(parts) == llm.chat_prompt(joined)
    assert llm.chat(parts, greedy).token_ids == llm.chat(joined, greedy).token_ids
    with pytest.raises(ValueError, match=r"messages\[0\].content\[1\].type: content parts of type 'image_url'"):
        llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}])


def test_a_prompt_far_over_the_context_is_refused_by_its_count(llm):
    """The ids of a text over max_model_len never become a list (the count is read first); the message is
    the one a list of ids gets."""
    text = "word " * 19999 + "word"
    with pytest.raises(ValueError, match="prompt 0: 20000 tokens do not fit max_model_len 512"):
        llm.generate(text)
    with pytest.raises(ValueError, match="prompt 0: 20000 tokens do not fit max_model_len 512"):
        llm.generate([llm.tokenizer.encode(text)])
    from ssd.models.tokenizer import TooManyTokens

    with pytest.raises(TooManyTokens) as e:
        llm.tokenizer.encode_within(text, 100)
    assert (e.value.num_tokens, e.value.limit) == (20000, 100)
    at_limit = ("word " * 100).strip()
    assert len(llm.tokenizer.encode_within(at_limit, 100)) == 100


def test_ssd_tokenizer_writes_what_huggingface_loads_as_ssd_counts(tmp_path):
    """`ssd tokenizer` output loads with transformers, and gives the ids and chat prompts the server uses."""
    from transformers import AutoTokenizer

    from ssd.models import load_tokenizer

    r = subprocess.run([sys.executable, "-m", "ssd.cli", "tokenizer", str(smollm2_gguf_path()), "--out",
                        str(tmp_path / "tok")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    ours = load_tokenizer(smollm2_gguf_path())
    for text in ("Hello world 12345", "<|im_start|>user\nhi<|im_end|>\n", "  naïve café 日本語 🎉\n\tdef f(x):"):
        assert hf(text)["input_ids"] == ours.encode(text), text
    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]):
        assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
            ours.apply_chat_template(messages)
    r = subprocess.run([sys.executable, "-m", "ssd.cli", "tokenizer", str(tmp_path / "missing.gguf"), "--out",
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "model path does not exist" in r.stderr and "Traceback" not in r.stderr
