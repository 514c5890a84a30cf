"""The OpenAI-compatible HTTP API over an ``AsyncLLM`` (FastAPI).

Endpoints: POST /v1/chat/completions and /v1/completions (streamed as
server-sent events, or not), GET /v1/models, /health and /metrics. A request
is admitted while fewer than ``max_in_flight`` requests are in the server
(the engine's batch plus a bounded waiting queue); past that it gets 503 with
a Retry-After header, and so does every request while the server drains.
A client that disconnects cancels its requests, which frees their KV blocks.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ssd.async_llm import AsyncLLM
from ssd.serve.metrics import HitRateWatch, ServerMetrics
from ssd.serve.protocol import ChatCompletionRequest, CompletionRequest, RequestError, sampling_params

# Engine finish reasons as OpenAI clients know them ("cancelled": the server cut the request short).
_FINISH = {"stop": "stop", "length": "length", "cancelled": "abort"}


@dataclasses.dataclass
class ServerState:
    """What the handlers share. max_in_flight: requests admitted at once (503 past it)."""

    engine: AsyncLLM
    model_name: str
    api_key: str | None = None
    max_in_flight: int = 256
    hit_rate_threshold: float = 0.6
    draining: bool = False
    in_flight: int = 0

    def __post_init__(self):
        self.metrics = ServerMetrics(self.engine.stats)
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.hit_rate = HitRateWatch(self.engine.stats, self.hit_rate_threshold)


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return _error(RequestError(f"the body is not valid JSON: {first.get('msg', '')}"))
    param = ".".join(loc) or None
    return _error(RequestError(f"{param or 'body'}: {first.get('msg', 'invalid value')}", param=param))


class _Call:
    """One HTTP request's generation: its engine requests (one per choice) and what it reports."""

    def __init__(self, state: ServerState, req, prompt, *, chat: bool):
        self.state, self.req, self.chat = state, req, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        if req.model != state.model_name:
            raise RequestError(f"The model '{req.model}' does not exist (this server serves '{state.model_name}')",
                               status=404, param="model", code="model_not_found")
        llm = state.engine.llm
        try:
            _, self.prompt_ids = llm._prompt_ids(0, prompt)
        except ValueError as e:
            field = "messages" if chat else "prompt"
            raise RequestError(f"{field}: {str(e).removeprefix('prompt 0: ')}", param=field) from None
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
        self.params = sampling_params(req, max_tokens, state.engine.config.max_model_len - len(self.prompt_ids))
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.completion_tokens = 0
        self.requests = []
        self._pumped = False

    def admit(self) -> None:
        s = self.state
        if s.draining:
            s.metrics.rejected.labels("draining").inc()
            raise RequestError("the server is shutting down", status=503, type="server_unavailable",
                               headers={"Retry-After": "5"})
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
            raise RequestError(f"generation failed: {errors[0]}", status=500, type="server_error")
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
                    err = RequestError(f"generation failed: {chunk.error}", status=500, type="server_error")
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
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


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


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="ssd", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ssd = state

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_request, exc):
        return _validation_error(exc)

    @app.exception_handler(RequestError)
    async def _on_refused(_request, exc):
        return _error(exc)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if state.api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {state.api_key}":
                return _error(RequestError("invalid or missing API key", status=401, type="authentication_error",
                                           code="invalid_api_key"))
        return await call_next(request)

    @app.get("/health")
    async def health():
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
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        if not messages:
            raise RequestError("messages: must hold at least one message", param="messages")
        try:
            prompt = state.engine.llm.chat_prompt(messages)
        except ValueError as e:  # ChatTemplateError (a bad role order, ...), or a model without a tokenizer
            raise RequestError(f"messages: {e}", param="messages") from None
        return await _serve(_Call(state, req, prompt, chat=True), request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await _serve(_Call(state, req, req.prompt, chat=False), request)

    return app


async def _serve(call: _Call, request: Request):
    call.admit()
    if call.req.stream:
        return call.stream()
    try:
        return await call.complete(request)
    finally:
        call.abandon()
