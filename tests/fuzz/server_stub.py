"""The HTTP app over a stub engine, driven in-process (the server fuzz target, and server tests that need no model).

``stub_state()``: a ServerState whose engine has the small tokenizer of
``tokenizer_files`` (with its ChatML template), the library's own prompt
checks (``LLM._prompt_ids``, ``LLM.chat_prompt``) and a model path that no
response may show; each request streams one token per step up to max_tokens
(at most ``STEPS``). ``call(app, ...)``: one request through the ASGI app,
without a socket; ``http_scope``: its scope.
"""
from __future__ import annotations

import asyncio
import io
import json
from types import SimpleNamespace

import tokenizers

from ssd.dispatch import StreamChunk
from ssd.llm import LLM
from ssd.models.tokenizer import Tokenizer
from ssd.serve import ServerState
from tests.fuzz.tokenizer_files import CHATML, default_files

MODEL_PATH = "/srv/secret-models/stub-model.gguf"  # no response may name it
STEPS = 3


def stub_tokenizer() -> Tokenizer:
    backend = tokenizers.Tokenizer.from_str(default_files()["tokenizer.json"].decode())
    return Tokenizer(backend, bos_token="<|im_start|>", eos_token="<|im_end|>", chat_template=CHATML,
                     source=MODEL_PATH)


class _StubLLM:
    _prompt_ids = LLM._prompt_ids
    chat_prompt = LLM.chat_prompt

    def __init__(self, tokenizer: Tokenizer, max_model_len: int):
        self.model = SimpleNamespace(tokenizer=tokenizer, source=MODEL_PATH, require_tokenizer=lambda: tokenizer,
                                     config=SimpleNamespace(vocab_size=tokenizer.vocab_size))
        self.draft_model = None
        self.tokenizer = tokenizer
        self.config = SimpleNamespace(max_model_len=max_model_len, max_batch=4)


class _StubRequest:
    def __init__(self, params):
        self.steps = min(params.max_tokens, STEPS)
        self.closed = False

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True

    async def __aiter__(self):
        for i in range(self.steps):
            await asyncio.sleep(0)
            last = i == self.steps - 1
            yield StreamChunk([1], "a", "length" if last else None)


class StubEngine:
    """What the app uses of an AsyncLLM, without a model."""

    def __init__(self, max_model_len: int = 64):
        self.llm = _StubLLM(stub_tokenizer(), max_model_len)
        self.config = self.llm.config
        self.tokenizer = self.llm.tokenizer

    def submit(self, prompt_ids, params):
        return _StubRequest(params)

    def stats(self) -> dict:
        return {}

    def abort_all(self) -> None:
        pass


def stub_state(**kw) -> ServerState:
    return ServerState(StubEngine(), model_name="stub", **kw)


def http_scope(method: str, path: str, headers) -> dict:
    """An ASGI HTTP scope, as uvicorn makes one."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": b"", "headers": list(headers), "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}


async def call(app, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request through the ASGI app."""
    sent, done, given = [], asyncio.Event(), []

    async def receive():
        if not given:
            given.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await app(http_scope(method, path, head), receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = io.BytesIO()
    for m in sent:
        if m["type"] == "http.response.body":
            out.write(m.get("body", b""))
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, out.getvalue()


def error_of(status: int, body: bytes) -> dict:
    """The error object of a refusal, checked to be OpenAI's shape (AssertionError otherwise)."""
    obj = json.loads(body)
    assert set(obj) == {"error"}, obj
    err = obj["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert MODEL_PATH not in err["message"] and "/srv/" not in err["message"], err
    return err
