"""Requests the API refuses, in-process against the app over a stub engine (tests/fuzz/server_stub.py):
every refusal is a 4xx in OpenAI's error shape naming the JSON field, strict JSON types, content parts,
the API key, the body's size and read time. No model, no socket."""
from __future__ import annotations

import asyncio
import hmac
import json
import time

import pytest

from ssd.config import ServerLimits
from ssd.serve import guard
from ssd.serve.app import build_app
from tests.fuzz.server_stub import MODEL_PATH, call, error_of, http_scope, stub_state

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = {"role": "user", "content": "Hello ab"}


def run(app, method, path, body=b"", headers=()):
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    return asyncio.run(call(app, method, path, body, headers))


@pytest.fixture
def app():
    return build_app(stub_state(max_in_flight=8))


@pytest.mark.parametrize("path,fields,param", [
    (COMPLETIONS, {"prompt": "ab", "max_tokens": "10"}, "max_tokens"),
    (COMPLETIONS, {"prompt": "ab", "max_tokens": True}, "max_tokens"),
    (COMPLETIONS, {"prompt": "ab", "max_tokens": 10.0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "ab", "n": "2"}, "n"),
    (COMPLETIONS, {"prompt": "ab", "stream": "yes"}, "stream"),
    (COMPLETIONS, {"prompt": "ab", "stream": 1}, "stream"),
    (COMPLETIONS, {"prompt": "ab", "temperature": "0.5"}, "temperature"),
    (COMPLETIONS, {"prompt": "ab", "temperature": True}, "temperature"),
    (COMPLETIONS, {"prompt": "ab", "stop": 5}, "stop"),
    (COMPLETIONS, {"prompt": "ab", "stop": ["a", 5]}, "stop[1]"),
    (COMPLETIONS, {"prompt": "ab", "stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
    (COMPLETIONS, {"prompt": "ab", "n": 9}, "n"),  # more choices than the server ever admits (8)
    (COMPLETIONS, {"prompt": "ab", "temperature": 1e400}, "temperature"),
    (CHAT, {"messages": [{"role": "alien", "content": "ab"}]}, "messages[0].role"),
    (CHAT, {"messages": [USER, {"role": "user", "content": 7}]}, "messages[1].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [USER], "logprobs": 1}, "logprobs"),
])
def test_a_bad_field_is_a_400_naming_it(app, path, fields, param):
    status, _, body = run(app, "POST", path, {"model": "stub", **fields})
    err = error_of(status, body)
    assert status == 400 and err["param"] == param and err["type"] == "invalid_request_error", (status, err)
    assert err["message"].startswith(param + ":"), err


def test_the_server_admits_n_up_to_its_capacity(app):
    status, _, body = run(app, "POST", COMPLETIONS, {"model": "stub", "prompt": "ab", "n": 8, "max_tokens": 1})
    assert status == 200 and len(json.loads(body)["choices"]) == 8, body


def test_content_parts_of_type_text_are_the_text(app):
    """OpenAI's content parts are accepted: text parts joined by newlines give the same prompt as that string."""
    def usage(content):
        status, _, body = run(app, "POST", CHAT, {"model": "stub", "max_tokens": 1,
                                                  "messages": [{"role": "user", "content": content}]})
        assert status == 200, body
        return json.loads(body)["usage"]["prompt_tokens"]

    parts = [{"type": "text", "text": "Hello ab"}, {"type": "text", "text": "ab ab"}]
    assert usage(parts) == usage("Hello ab\nab ab") != usage("Hello ab")


@pytest.mark.parametrize("body,says", [
    (b'{"model": "stub", "prompt": "\\ud800"}', "not valid Unicode"),
    (b'{"model": "stub", "prompt": "\\udc00 ab"}', "not valid Unicode"),
    (b'{"model": "stub", "prompt": "ab"', "not valid JSON"),
    (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
    (b'{"model": "stub", "prompt": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"", "not valid JSON"),
])
def test_a_body_that_is_no_request_is_a_400(app, body, says):
    status, _, out = run(app, "POST", COMPLETIONS, body)
    err = error_of(status, out)
    assert status == 400 and says in err["message"], (status, err)


def test_routing_errors_have_openais_shape(app):
    status, _, body = run(app, "GET", "/v1/nowhere")
    assert status == 404 and error_of(status, body)["code"] == "not_found"
    status, headers, body = run(app, "GET", COMPLETIONS)
    assert status == 405 and error_of(status, body)["code"] == "method_not_allowed"
    assert headers["allow"] == "POST"
    status, _, body = run(app, "POST", COMPLETIONS, {"model": "gpt-4", "prompt": "ab"})
    assert status == 404 and error_of(status, body)["code"] == "model_not_found"


def test_no_message_names_a_file_of_the_server():
    state = stub_state()
    state.engine.tokenizer.chat_template = "{{ raise_exception('no such role: ' ~ messages[0]['role']) }}"
    app = build_app(state)
    status, _, body = run(app, "POST", CHAT, {"model": "stub", "messages": [USER]})
    err = error_of(status, body)  # checks that MODEL_PATH is not in it
    assert status == 400 and err["param"] == "messages" and "no such role: user" in err["message"], err
    assert "chat template of stub failed" in err["message"], err
    assert MODEL_PATH not in body.decode()


def test_api_key_scheme_in_any_case_key_in_constant_time(monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(guard.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    app = build_app(stub_state(api_key="sekrit"))
    for scheme in ("Bearer", "bearer", "BEARER"):
        status, _, _ = run(app, "GET", "/v1/models", headers=[(b"authorization", f"{scheme} sekrit".encode())])
        assert status == 200, scheme
    assert compared[-1] == (b"sekrit", b"sekrit")
    for value in (b"Bearer wrong", b"Basic sekrit", b"sekrit", b""):
        status, _, body = run(app, "GET", "/v1/models", headers=[(b"authorization", value)])
        assert status == 401 and error_of(status, body)["code"] == "invalid_api_key", value
    assert run(app, "GET", "/metrics")[0] == 200 and run(app, "GET", "/health")[0] == 200  # open by default

    protected = build_app(stub_state(api_key="sekrit", protect_metrics=True))
    assert run(protected, "GET", "/metrics")[0] == 401
    assert run(protected, "GET", "/metrics", headers=[(b"authorization", b"bearer sekrit")])[0] == 200
    assert run(protected, "GET", "/health")[0] == 200


def _chunked(app, chunks, *, declared=None, pause_s=0.0, unfinished=False):
    """A body sent in pieces (more_body), with or without a Content-Length, and left unfinished or not;
    (status, headers, body) of the response."""
    sent = []

    async def main():
        queue = list(chunks)

        async def receive():
            if queue:
                await asyncio.sleep(pause_s)
                piece = queue.pop(0)
                return {"type": "http.request", "body": piece, "more_body": bool(queue) or unfinished}
            await asyncio.sleep(3600)  # the client sends nothing more

        async def send(message):
            sent.append(message)

        headers = [(b"content-type", b"application/json")]
        if declared is not None:
            headers.append((b"content-length", str(declared).encode()))
        await asyncio.wait_for(app(http_scope("POST", COMPLETIONS, headers), receive, send), 30)

    asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = dict(start["headers"])
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_body_past_the_size_limit_is_a_413_and_closes():
    app = build_app(stub_state(limits=ServerLimits(max_body_bytes=1000)))
    body = json.dumps({"model": "stub", "prompt": "ab " * 400}).encode()
    assert len(body) > 1000
    # Declared too large: refused before any of it is read.
    status, headers, out = _chunked(app, [], declared=len(body))
    assert status == 413 and error_of(status, out)["code"] == "request_too_large"
    assert headers[b"connection"] == b"close"
    # Not declared (chunked): refused once it passes the limit.
    status, headers, out = _chunked(app, [body[:600], body[600:900], body[900:]])
    assert status == 413 and headers[b"connection"] == b"close"
    # Up to the limit it is read.
    small = json.dumps({"model": "stub", "prompt": "ab", "max_tokens": 1}).encode()
    assert _chunked(app, [small[:5], small[5:]])[0] == 200


def test_a_body_that_does_not_arrive_in_time_is_a_408():
    app = build_app(stub_state(limits=ServerLimits(body_timeout_s=0.3)))
    t0 = time.monotonic()
    status, headers, out = _chunked(app, [b'{"model": "stub", '], declared=100, unfinished=True)
    assert status == 408 and error_of(status, out)["code"] == "request_timeout"
    assert headers[b"connection"] == b"close" and 0.3 <= time.monotonic() - t0 < 5
    # A slow body that completes in time is served.
    small = json.dumps({"model": "stub", "prompt": "ab", "max_tokens": 1}).encode()
    assert _chunked(app, [small[:5], small[5:10], small[10:]], pause_s=0.05)[0] == 200


def test_limits_must_be_positive():
    for field in ("max_body_bytes", "header_timeout_s", "body_timeout_s", "max_connections"):
        with pytest.raises(ValueError, match=f"{field}: must be a number > 0"):
            ServerLimits(**{field: 0})
