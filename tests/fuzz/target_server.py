"""Fuzz target: request bodies of the HTTP API, in-process against the app over a stub engine.

The first byte picks the endpoint (chat or completions); the rest is the body.
Documented errors: none (every input must get a response).
Oracle: the status is below 500; a refusal is OpenAI's error shape
(``error.message``, ``type``, ``param``, ``code``) and names no file of the
server; a 200 is a completion object, or a stream of JSON events ending in
``data: [DONE]``; afterwards no request is left admitted.
"""
from __future__ import annotations

import asyncio
import json

from ssd.serve.app import build_app
from tests.fuzz.server_stub import MODEL_PATH, call, error_of, stub_state

DOCUMENTED = ()
PATHS = ("/v1/completions", "/v1/chat/completions")

_state = stub_state(max_in_flight=8)
_app = build_app(_state)
_loop = asyncio.new_event_loop()


def test_one_input(data: bytes) -> None:
    path = PATHS[data[0] % 2] if data else PATHS[0]
    status, headers, out = _loop.run_until_complete(asyncio.wait_for(call(_app, "POST", path, data[1:]), 10))
    assert status < 500, (status, out)
    assert MODEL_PATH.encode() not in out, out
    if status >= 400:
        error_of(status, out)
    elif headers.get("content-type", "").startswith("text/event-stream"):
        events = [e for e in out.decode().split("\n\n") if e]
        assert events and events[-1] == "data: [DONE]", out
        for e in events[:-1]:
            assert e.startswith("data: ") and isinstance(json.loads(e[6:]), dict), e
    else:
        assert status == 200 and json.loads(out)["choices"], out
    assert _state.in_flight == 0 and _state.http_active == 0, (_state.in_flight, _state.http_active)


def _body(**fields) -> bytes:
    return json.dumps({"model": "stub", **fields}).encode()


def seeds() -> list[bytes]:
    chat = [{"role": "system", "content": "ab"}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    return [
        b"\x00" + _body(prompt="ab ab", max_tokens=2),
        b"\x00" + _body(prompt=[1, 2, 3], max_tokens=3, stream=True, stream_options={"include_usage": True}),
        b"\x00" + _body(prompt="Hello", max_tokens=2, n=2, seed=7, stop=["b"], logprobs=2, temperature=0.5),
        b"\x01" + _body(messages=chat, max_tokens=2),
        b"\x01" + _body(messages=chat, max_completion_tokens=2, stream=True, logprobs=True, top_logprobs=1),
        b"\x01" + _body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        b"\x01" + _body(messages=[{"role": "alien", "content": "ab"}]),
        b"\x00" + _body(prompt="ab", max_tokens="10", stream="yes"),
        b"\x00" + b'{"model": "stub", "prompt": "\\ud800"}',
        b"\x01" + b"[" * 300 + b"]" * 300,
    ]


DICTIONARY = ['"model"', '"stub"', '"prompt"', '"messages"', '"role"', '"content"', '"user"', '"assistant"',
              '"system"', '"tool"', '"type"', '"text"', '"image_url"', '"max_tokens"', '"max_completion_tokens"',
              '"temperature"', '"top_p"', '"top_k"', '"stop"', '"seed"', '"n"', '"stream"', '"stream_options"',
              '"include_usage"', '"logprobs"', '"top_logprobs"', '"ignore_eos"', '"presence_penalty"', '"echo"',
              'true', 'false', 'null', '-1', '0', '1e400', '18446744073709551616', '\\ud800', '<|im_start|>',
              '{', '}', '[', ']', ':', ',']
