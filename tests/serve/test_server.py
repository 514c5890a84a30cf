"""ssd serve, driven by the real openai client over 127.0.0.1: outputs equal LLM's, streams,
disconnects, errors, metrics, overload. The model is SmolLM2-135M-Instruct (GGUF, with its
tokenizer and chat template); sd and ssd use it as its own draft."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ssd import LLM, SamplingParams
from ssd.assets import smollm2_gguf_path
from ssd.async_llm import AsyncLLM
from ssd.serve import ServerState, ServerThread
from ssd.serve import app as app_module
from ssd.serve.app import build_app
from tests.fuzz.server_stub import http_scope

MODEL = "smollm2"
CHAT = [{"role": "user", "content": "Name three rivers."}]


def _engine(mode: str) -> LLM:
    path = str(smollm2_gguf_path())
    draft = None if mode == "ar" else path
    # Fixed speculation: the metrics tests count proposals, which the adaptive policy may skip
    # (a model drafting for itself costs as much as it saves).
    return LLM(path, mode=mode, draft=draft, max_model_len=512, max_batch=16, kv_cache_gib=0.5, adaptive=False)


@pytest.fixture(scope="module", params=["ar", "sd", "ssd"])
def served(request):
    llm = _engine(request.param)
    state = ServerState(AsyncLLM(llm), model_name=MODEL, max_in_flight=200)
    with ServerThread(state) as srv:
        yield llm, state, srv
    llm.shutdown()


@pytest.fixture(scope="module")
def ar_served():
    llm = _engine("ar")
    state = ServerState(AsyncLLM(llm), model_name=MODEL, max_in_flight=200)
    with ServerThread(state) as srv:
        yield llm, state, srv
    llm.shutdown()


def client(srv, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120, **kw)


def greedy(n=24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, **kw)


def wait_idle(llm: LLM, state: ServerState, timeout=30.0) -> dict:
    """Until the server and the engine hold no request; the engine's stats then."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = llm.stats()
        if state.in_flight == 0 and s["num_running"] == 0 and s["num_waiting"] == 0:
            return s
        time.sleep(0.05)
    raise AssertionError(f"still busy: server {state.in_flight}, engine {s['num_running']}/{s['num_waiting']}")


def test_temperature_zero_equals_llm(served):
    llm, _, srv = served
    c = client(srv)
    want_chat = llm.chat(CHAT, greedy())
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want_chat.text
    assert r.choices[0].finish_reason == want_chat.finish_reason == "length"
    assert r.usage.completion_tokens == len(want_chat.token_ids)
    assert r.usage.prompt_tokens == len(want_chat.prompt_token_ids)
    parts = list(c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0, stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == want_chat.text
    assert parts[-1].choices[0].finish_reason == "length"

    want = llm.generate(["Once upon a time"], greedy(20))[0]
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 20
    parts = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                      stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == want.text
    assert parts[-1].choices == [] and parts[-1].usage.completion_tokens == 20
    # Token ids as the prompt, and a stop string.
    ids = llm.tokenizer.encode("The capital of France is")
    want = llm.generate([ids], greedy(30, stop=["."]))[0]
    r = c.completions.create(model=MODEL, prompt=ids, max_tokens=30, temperature=0, stop=["."])
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason


def test_64_streams_a_quarter_disconnecting(served):
    """Every stream that stays completes with all its tokens; those that leave free their requests.
    (12 tokens each: four times max_batch streams at once is the point, not their length.)"""
    llm, state, srv = served
    prompts = [f"Count from {i} to {i + 40}:" for i in range(64)]
    want = {p: o.text for p, o in zip(prompts, llm.generate(prompts, greedy(12)))}

    async def one(ac, i, prompt):
        leaves = i % 4 == 0  # asks for many tokens, and disconnects after the first chunk
        stream = await ac.completions.create(model=MODEL, prompt=prompt, max_tokens=300 if leaves else 12,
                                             temperature=0, stream=True, extra_body={"ignore_eos": leaves})
        text, reason = "", None
        async for part in stream:
            text += part.choices[0].text
            reason = part.choices[0].finish_reason or reason
            if leaves:
                await stream.close()
                return None
        return text, reason

    async def main():
        async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0,
                                      timeout=300) as ac:
            return await asyncio.gather(*(one(ac, i, p) for i, p in enumerate(prompts)))

    aborted = 'ssd_requests_total{"finish_reason": "abort"}'
    before = _scrape(srv).get(aborted, 0)
    results = asyncio.run(main())
    for i, (prompt, res) in enumerate(zip(prompts, results)):
        if i % 4 == 0:
            assert res is None
        else:
            assert res == (want[prompt], "length"), i
    # The 16 that left were cancelled, not run on to their 300 tokens (which takes far longer than this).
    stats = wait_idle(llm, state, timeout=5.0)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert _scrape(srv)[aborted] - before == 16


def test_a_stream_stopped_inside_a_send_cancels_its_request(ar_served, monkeypatch):
    """Starlette stops a stream whose client left by cancelling the task that sends it. Stopped inside a send, the
    body's generator is suspended, not closed: unless the server closes it, its request runs on to max_tokens until
    the garbage collector finds the generator (the 64-stream test above saw 1-3 of 16 run on for 5 s). Here the
    generator is held, so only an explicit close can end the request early."""
    llm, state, srv = ar_served
    held = []
    events = app_module._Call._events

    def holding(call):
        held.append(events(call))
        return held[-1]

    monkeypatch.setattr(app_module._Call, "_events", holding)
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    scope = http_scope("POST", "/v1/completions", [(b"content-type", b"application/json")])

    async def main():
        left, requested = asyncio.Event(), []

        async def receive():
            if not requested:
                requested.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message):  # as uvicorn's: after the client left, a send does nothing
            if message["type"] == "http.response.body" and not left.is_set():
                # The client leaves while the first chunk is being written, by when the app is in its next send.
                asyncio.get_running_loop().call_later(0.3, left.set)
                await asyncio.sleep(0.6)

        await asyncio.wait_for(build_app(state)(scope, receive, send), timeout=60)
        # Within this loop: asyncio.run's end closes every generator still open, which a server's loop never does.
        end = time.monotonic() + 60
        while state.in_flight or llm.stats()["num_running"]:
            assert time.monotonic() < end, "the request is still running"
            await asyncio.sleep(0.05)

    aborted = 'ssd_requests_total{"finish_reason": "abort"}'
    before = _scrape(srv).get(aborted, 0)
    asyncio.run(main())
    assert len(held) == 1
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert _scrape(srv).get(aborted, 0) - before == 1  # cancelled, not run on to its 480 tokens ("length")


def _post(srv, path, body: bytes | dict, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=data, timeout=60,
                      headers={"content-type": "application/json", **(headers or {})})


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 2}, "top_p"),
    ({"temperature": -1}, "temperature"),
    ({"seed": -5}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"n": 0}, "n"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"prompt": "word " * 600}, "prompt"),
    ({"max_tokens": 600}, "max_tokens"),
])
def test_bad_completion_requests_get_400_naming_the_field(ar_served, body, param):
    _, _, srv = ar_served
    r = _post(srv, "/v1/completions", {"model": MODEL, "prompt": "hi", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert param in err["message"], err


def test_malformed_json_unknown_model_and_the_server_keeps_serving(ar_served):
    llm, state, srv = ar_served
    r = _post(srv, "/v1/chat/completions", b'{"model": "smollm2", "messages": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text
    r = _post(srv, "/v1/chat/completions", {"model": MODEL, "messages": "hello"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    with pytest.raises(openai.NotFoundError) as e:
        client(srv).chat.completions.create(model="gpt-4", messages=CHAT)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client(srv).chat.completions.create(model=MODEL, messages=CHAT, top_p=2)
    r = client(srv).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == llm.chat(CHAT, greedy(8)).text
    assert state.in_flight == 0


def test_n_choices_are_seeded_apart(ar_served):
    llm, _, srv = ar_served
    c = client(srv)
    kw = dict(model=MODEL, prompt="My favourite animal is", max_tokens=16, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    a = c.completions.create(n=3, **kw)
    b = c.completions.create(n=3, **kw)
    texts = [ch.text for ch in sorted(a.choices, key=lambda ch: ch.index)]
    assert texts == [ch.text for ch in sorted(b.choices, key=lambda ch: ch.index)]
    assert len(set(texts)) == 3, texts
    # Choice 0 keeps the seed: what LLM.generate samples with it.
    want = llm.generate(["My favourite animal is"],
                        SamplingParams(temperature=1.0, max_tokens=16, seed=7, ignore_eos=True))[0]
    assert texts[0] == want.text
    assert a.usage.completion_tokens == 3 * 16 and a.usage.prompt_tokens == len(want.prompt_token_ids)


def test_logprobs_are_the_engines(ar_served):
    """The logprobs a client gets are LLM's (the processed distribution's, tested in
    tests/runtime/test_logprobs.py), for chat and completions, streamed or not."""
    llm, _, srv = ar_served
    c = client(srv)
    sampling = dict(temperature=0.7, top_p=0.9, seed=3)
    want = llm.chat(CHAT, SamplingParams(max_tokens=12, logprobs=3, top_k=0, **sampling))
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, logprobs=True, top_logprobs=3,
                                  **sampling)
    content = r.choices[0].logprobs.content
    assert [x.logprob for x in content] == pytest.approx([x.logprob for x in want.logprobs], abs=1e-6)
    assert [t.logprob for x in content for t in x.top_logprobs] == pytest.approx(
        [lp for x in want.logprobs for _, lp in x.top], abs=1e-6)
    assert "".join(x.token for x in content) == r.choices[0].message.content == want.text
    parts = list(c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, logprobs=True,
                                           top_logprobs=3, stream=True, **sampling))
    streamed = [x.logprob for p in parts if p.choices and p.choices[0].logprobs
                for x in p.choices[0].logprobs.content]
    assert streamed == pytest.approx([x.logprob for x in want.logprobs], abs=1e-6)

    ids = llm.tokenizer.encode("Once upon a time")
    want = llm.generate([ids], SamplingParams(max_tokens=10, logprobs=2, **sampling))[0]
    r = c.completions.create(model=MODEL, prompt=ids, max_tokens=10, logprobs=2, **sampling)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([x.logprob for x in want.logprobs], abs=1e-6)
    assert [len(t) for t in lp.top_logprobs] == [len(x.top) for x in want.logprobs]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    with pytest.raises(openai.BadRequestError, match="top_logprobs: needs logprobs"):
        c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, top_logprobs=2)


def _scrape(srv) -> dict:
    text = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else "")
            out[key] = s.value
    return out


def test_metrics_count_what_the_clients_received(served):
    llm, state, srv = served
    wait_idle(llm, state)
    before = _scrape(srv)
    c = client(srv)
    got = 0
    for i in range(3):
        got += c.completions.create(model=MODEL, prompt=f"Item {i}:", max_tokens=10 + i, temperature=0
                                    ).usage.completion_tokens
    for part in c.completions.create(model=MODEL, prompt="Stream:", max_tokens=9, temperature=0, stream=True,
                                     stream_options={"include_usage": True}):
        if part.usage:
            got += part.usage.completion_tokens
    assert got == 10 + 11 + 12 + 9
    after = _scrape(srv)
    assert after["ssd_generation_tokens_total"] - before["ssd_generation_tokens_total"] == got
    done = 'ssd_requests_total{"finish_reason": "length"}'
    assert after[done] - before.get(done, 0) == 4
    assert after["ssd_time_to_first_token_seconds_count"] - before["ssd_time_to_first_token_seconds_count"] == 4
    assert after["ssd_num_requests_running"] == 0 and after["ssd_kv_blocks_used"] == 0
    if llm.config.mode != "ar":
        assert after["ssd_draft_tokens_proposed_total"] > before["ssd_draft_tokens_proposed_total"]
        assert 0 < after["ssd_acceptance_rate"] <= 1  # the model drafts for itself: nearly all accepted
    if llm.config.mode == "ssd":
        assert after["ssd_cache_lookups_total"] > 0 and 0 <= after["ssd_cache_hit_rate"] <= 1


def test_overload_gets_503_with_a_retry_hint(ar_served):
    llm, _, _ = ar_served
    state = ServerState(AsyncLLM(llm), model_name=MODEL, max_in_flight=2)
    with ServerThread(state) as srv:
        long = {"model": MODEL, "prompt": "Tell a long story:", "max_tokens": 200, "stream": True,
                "ignore_eos": True}
        streams = [httpx.stream("POST", srv.url + "/v1/completions", json=long, timeout=120) for _ in range(2)]
        for s in streams:
            assert s.__enter__().status_code == 200
        try:
            r = _post(srv, "/v1/completions", {"model": MODEL, "prompt": "one more", "max_tokens": 4})
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert r.json()["error"]["type"] == "server_overloaded"
        finally:
            for s in streams:
                s.__exit__(None, None, None)
        assert _scrape(srv)['ssd_requests_rejected_total{"reason": "overloaded"}'] == 1
        wait_idle(llm, state)
        r = _post(srv, "/v1/completions", {"model": MODEL, "prompt": "one more", "max_tokens": 4})
        assert r.status_code == 200, r.text


def test_api_key(ar_served):
    llm, _, _ = ar_served
    state = ServerState(AsyncLLM(llm), model_name=MODEL, api_key="sekrit")
    with ServerThread(state) as srv:
        with pytest.raises(openai.AuthenticationError):
            client(srv).models.list()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit", max_retries=0)
        assert [m.id for m in c.models.list()] == [MODEL]
        assert httpx.get(srv.url + "/health").status_code == 200  # health needs no key


def test_a_failed_engine_is_unhealthy_and_stops_the_server(ar_served):
    """LLM.failure() (a lost tensor-parallel rank): /health says so at once, and the server exits with
    ``failed`` set (ssd serve then exits 1)."""
    llm, _, _ = ar_served

    class Failing(AsyncLLM):
        why = None

        def failure(self):
            return self.why

    engine = Failing(llm)
    srv = ServerThread(ServerState(engine, model_name=MODEL, max_in_flight=8))
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        engine.why = f"tensor parallelism: rank 1 exited with status -9 (loaded from {llm.model.source})"
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json() == {
            "status": "failed", "error": f"tensor parallelism: rank 1 exited with status -9 (loaded from {MODEL})"}
        srv.thread.join(10)
        assert not srv.thread.is_alive() and srv.server.failed and not srv.server.forced
    finally:
        srv.stop()
