"""The OpenAI-compatible HTTP API over an ``AsyncLLM`` (FastAPI).

Endpoints: POST /v1/chat/completions and /v1/completions (streamed as
server-sent events, or not), GET /v1/models, /health and /metrics. Every
request first passes the guard (``guard.py``: API key, body size and read
time); a body is then read, rendered and tokenised on worker threads
(``prepare.py``), never on the event loop. A request is admitted while fewer
than ``max_in_flight`` requests are in the server (the engine's batch plus a
bounded waiting queue); past that it gets 503 with a Retry-After header, and
so does every request while the server drains. A client that disconnects
cancels its requests, streamed or not, which frees their KV blocks. Every
error has OpenAI's shape, and names no file of the server.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from ssd.async_llm import AsyncLLM
from ssd.config import ServerLimits
from ssd.serve.guard import SHUTTING_DOWN, Guard
from ssd.serve.metrics import HitRateWatch, ServerMetrics
from ssd.serve.prepare import Prepared, Preparer
from ssd.serve.protocol import RequestError

# Engine finish reasons as OpenAI clients know them ("cancelled": the server cut the request short).
_FINISH = {"stop": "stop", "length": "length", "cancelled": "abort"}


@dataclasses.dataclass
class ServerState:
    """What the handlers share. max_in_flight: requests admitted at once (503 past it); limits: body size,
    timeouts and connections; protect_metrics: /metrics needs the API key too."""

    engine: AsyncLLM
    model_name: str
    api_key: str | None = None
    max_in_flight: int = 256
    hit_rate_threshold: float = 0.6
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    protect_metrics: bool = False
    draining: bool = False
    in_flight: int = 0
    http_active: int = 0  # HTTP requests inside the app (the guard counts them)

    def __post_init__(self):
        self.metrics = ServerMetrics(self.engine.stats)
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.hit_rate = HitRateWatch(self.engine.stats, self.hit_rate_threshold)
        self.prepare = Preparer()
        self.body_cuts: set = set()  # callables that end a body read at a drain's deadline
        llm = self.engine.llm
        models = [m for m in (getattr(llm, "model", None), getattr(llm, "draft_model", None)) if m is not None]
        self._paths = sorted({m.source for m in models if getattr(m, "source", "")}, key=len, reverse=True)

    def public(self, message: str) -> str:
        """``message`` with the served models' file paths replaced by the served name."""
        for path in self._paths:
            message = message.replace(path, self.model_name)
        return message

    def failure(self) -> str | None:
        """Why the engine can no longer generate (a lost tensor-parallel rank), or None."""
        failure = getattr(self.engine, "failure", None)
        return failure() if failure is not None else None

    def cut_body_reads(self) -> None:
        for cut in list(self.body_cuts):
            cut()


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class _Call:
    """One HTTP request's generation: its engine requests (one per choice) and what it reports."""

    def __init__(self, state: ServerState, prepared: Prepared):
        self.state, self.req, self.chat = state, prepared.req, prepared.chat
        self.prompt_ids, self.params = prepared.prompt_ids, prepared.params
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.include_usage = bool(self.req.stream_options and self.req.stream_options.include_usage)
        self.completion_tokens = 0
        self.requests = []
        self._pumped = False

    def admit(self) -> None:
        s = self.state
        if s.draining:
            s.metrics.rejected.labels("draining").inc()
            raise RequestError("the server is shutting down", **SHUTTING_DOWN)
        if s.in_flight + len(self.params) > s.max_in_flight:
            s.metrics.rejected.labels("overloaded").inc()
            raise RequestError(f"the server is at capacity ({s.max_in_flight} requests); retry later", status=503,
                               type="server_overloaded", headers={"Retry-After": "1"})
        self.t_admit = time.monotonic()
        try:
            for p in self.params:
                self.requests.append(s.engine.submit(self.prompt_ids, p))
        except RuntimeError as e:  # the engine is shut down (or its dispatcher failed)
            for r in self.requests:
                r.close()
            raise RequestError(f"the engine is not running: {e}", status=503, type="server_unavailable") from None
        s.in_flight += len(self.requests)
        s.metrics.prompt_tokens.inc(len(self.prompt_ids))

    def abandon(self) -> None:
        """A response that never started reading its requests (the client left first): cancels them."""
        if self._pumped:
            return
        self._pumped = True
        for r in self.requests:
            r.close()
            self.state.metrics.requests.labels("abort").inc()
        self.state.in_flight -= len(self.requests)

    async def chunks(self):
        """(choice index, StreamChunk) as they arrive, from every choice; ends when all have finished."""
        if self._pumped:
            return
        self._pumped = True
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, request):
            m, t_start, t_last = self.state.metrics, self.t_admit, None
            reason = "abort"
            try:
                async for chunk in request:
                    now = time.monotonic()
                    if chunk.token_ids:
                        n = len(chunk.token_ids)
                        if t_last is None:
                            m.ttft.observe(now - t_start)
                        else:
                            for _ in range(n):
                                m.itl.observe((now - t_last) / n)
                        t_last = now
                    if chunk.finish_reason is not None:
                        reason = _FINISH.get(chunk.finish_reason, "error")
                    await queue.put((i, chunk))
            finally:
                m.e2e.observe(time.monotonic() - t_start)
                m.requests.labels(reason).inc()
                self.state.in_flight -= 1
                await queue.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(self.requests)]
        try:
            open_ = len(tasks)
            while open_:
                i, chunk = await queue.get()
                if chunk is None:
                    open_ -= 1
                    continue
                self.completion_tokens += len(chunk.token_ids)
                self.state.metrics.generation_tokens.inc(len(chunk.token_ids))
                yield i, chunk
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": self.completion_tokens,
                "total_tokens": len(self.prompt_ids) + self.completion_tokens}

    def _envelope(self, choices: list, obj: str, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.state.model_name,
                "choices": choices, **extra}

    # ------------------------------------------------------------- responses
    def logprobs(self, chunk_logprobs, text_offset: int = 0):
        """The OpenAI logprobs object of some tokens (None when the request asked for none)."""
        if chunk_logprobs is None:
            return None
        tok = self.state.engine.tokenizer

        def piece(t: int) -> str:
            return tok.decode([t], skip_special_tokens=False) if tok is not None else f"<{t}>"

        if self.chat:
            def entry(t, lp):
                s = piece(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}

            return {"content": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, lp) for t, lp in x.top]}
                                for x in chunk_logprobs], "refusal": None}
        tokens = [piece(x.token) for x in chunk_logprobs]
        offsets, at = [], text_offset
        for s in tokens:
            offsets.append(at)
            at += len(s)
        return {"tokens": tokens, "token_logprobs": [x.logprob for x in chunk_logprobs],
                "top_logprobs": [{piece(t): lp for t, lp in x.top} for x in chunk_logprobs], "text_offset": offsets}

    async def complete(self, request: Request) -> JSONResponse:
        texts, reasons, errors = [""] * len(self.requests), [None] * len(self.requests), []
        token_logprobs = [[] for _ in self.requests]
        watch = asyncio.ensure_future(_until_disconnected(request))
        try:
            async for i, chunk in _racing(self.chunks(), watch):
                texts[i] += chunk.text
                token_logprobs[i] += chunk.logprobs or []
                if chunk.finish_reason is not None:
                    reasons[i] = _FINISH.get(chunk.finish_reason)
                    if chunk.finish_reason == "error":
                        errors.append(chunk.error)
        finally:
            watch.cancel()
        if errors:
            raise RequestError(self.state.public(f"generation failed: {errors[0]}"), status=500,
                               type="server_error")
        wanted = self.params[0].logprobs is not None
        lps = [self.logprobs(lp) if wanted else None for lp in token_logprobs]
        if self.chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": lp,
                        "finish_reason": r} for i, (t, r, lp) in enumerate(zip(texts, reasons, lps))]
        else:
            choices = [{"index": i, "text": t, "logprobs": lp, "finish_reason": r}
                       for i, (t, r, lp) in enumerate(zip(texts, reasons, lps))]
        obj = "chat.completion" if self.chat else "text_completion"
        return JSONResponse(self._envelope(choices, obj, usage=self.usage()))

    def stream(self) -> StreamingResponse:
        return _Stream(self, self._events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _events(self):
        obj = "chat.completion.chunk" if self.chat else "text_completion"

        def event(choices, **extra) -> str:
            body = self._envelope(choices, obj, **extra)
            if self.include_usage and "usage" not in body:
                body["usage"] = None
            return f"data: {_json(body)}\n\n"

        offsets = [0] * len(self.requests)

        def choice(i, text, reason, first=False, logprobs=None):
            lp = self.logprobs(logprobs, offsets[i])
            offsets[i] += len(text)
            if self.chat:
                delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}

        if self.chat:
            yield event([choice(i, "", None, first=True) for i in range(len(self.requests))])
        # Closed with this generator, not when the garbage collector finds it: that cancels its requests.
        async with contextlib.aclosing(self.chunks()) as chunks:
            async for i, chunk in chunks:
                if chunk.finish_reason == "error":
                    err = RequestError(self.state.public(f"generation failed: {chunk.error}"), status=500,
                                       type="server_error")
                    yield f"data: {_json(err.body())}\n\n"
                    continue
                reason = _FINISH.get(chunk.finish_reason) if chunk.finish_reason else None
                if chunk.text or reason or chunk.token_ids:
                    yield event([choice(i, chunk.text, reason, logprobs=chunk.logprobs)])
        if self.include_usage:
            yield event([], usage=self.usage())
        yield "data: [DONE]\n\n"


class _Stream(StreamingResponse):
    """A streamed response that cancels its requests when it ends early (the client left).

    Starlette stops a stream whose client left by cancelling the task that
    sends it, and when that task was in a send the body's generator is left
    suspended: closed only when the garbage collector gets to it, its
    requests ran on to their max_tokens meanwhile. So it is closed here.
    """

    def __init__(self, call: _Call, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._call = call

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self._call.abandon()


def _json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has left: after the body, the next message a client sends is its disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.25)  # not expected after a whole body; polls rather than spins


async def _racing(chunks, watch: asyncio.Future):
    """chunks until they end, or until `watch` (a client's disconnect) completes first."""
    it = chunks.__aiter__()
    try:
        while True:
            step = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({step, watch}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        await it.aclose()


def build_app(state: ServerState) -> Guard:
    """The ASGI application: the API behind the guard (``guard.py``)."""
    app = FastAPI(title="ssd", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ssd = state

    @app.exception_handler(RequestError)
    async def _on_refused(_request, exc):
        return _error(exc)

    @app.exception_handler(HTTPException)
    async def _on_http(request, exc):  # routing: no such endpoint, or not with this method
        if exc.status_code == 405:
            message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        elif exc.status_code == 404:
            message, code = f"no endpoint {request.url.path}", "not_found"
        else:
            message, code = str(exc.detail), None
        return _error(RequestError(message, status=exc.status_code, code=code, headers=exc.headers))

    @app.exception_handler(Exception)
    async def _on_bug(_request, exc):  # a bug: the server's log has the traceback, the client a 500
        return _error(RequestError(f"internal error ({type(exc).__name__})", status=500, type="server_error"))

    @app.get("/health")
    async def health():
        failure = state.failure()
        if failure:
            return JSONResponse({"status": "failed", "error": state.public(failure)}, status_code=503)
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "ssd", "max_model_len": state.engine.config.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(state, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(state, request, chat=False)

    return Guard(app, state)


async def _serve(state: ServerState, request: Request, chat: bool):
    call = _Call(state, await state.prepare(state, await request.body(), chat))
    call.admit()
    if call.req.stream:
        return call.stream()
    try:
        return await call.complete(request)
    finally:
        call.abandon()
