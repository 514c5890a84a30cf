"""The response dispatcher: one reader thread between the C++ engine and its callers.

The engine hands out its responses (new tokens, finishes) in one queue. A
single thread awaits that queue (without holding the GIL while it waits) and
routes every response to its request's ``RequestHandle``, which turns tokens
into text (incrementally), applies stop strings and queues ``StreamChunk``s.
Callers on any thread then wait on their own handles only, so ``generate()``,
``stream()`` and ``chat()`` can run from several threads on one ``LLM`` and
each request gets exactly its own tokens.

Every wait has an exit: handles end when their request ends, when the engine
shuts down (its pending requests end as cancelled) or, should the reader
thread itself fail, with that error.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from ssd import _logging

# How long one blocking call waits before it checks again that the reader is alive.
_POLL_S = 0.5


@dataclass
class TokenLogprob:
    """One token's log-probability under the processed distribution it was drawn from,
    and the most likely tokens there: [(token id, logprob)], probability desc, id asc
    (tokens the processing gave probability 0 are not listed)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RequestOutput:
    """The result of one request.

    finish_reason: "stop", "length", "cancelled" or "error" (then `error` says why).
    metrics: the engine's measurements of the request (ssd.metrics documents them).
    logprobs: one TokenLogprob per token, when SamplingParams.logprobs asked for them.
    """

    index: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None


@dataclass
class StreamChunk:
    """New tokens and the text they completed; the last chunk has finish_reason.
    logprobs: one TokenLogprob per token of token_ids, when asked for."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None


class _Text:
    """A request's text, decoded one token at a time, with its stop strings.

    A token's text is decoded once (``DecodeStream``: bytes of a character
    split over tokens wait for the rest), so the work per token does not grow
    with the output. Streams are held back by the longest stop string less one
    character, so a stop string is never streamed in part.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.decoder = tokenizer.stream_decoder() if tokenizer is not None else None
        self.stop = stop
        self.hold_back = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.sent = 0  # characters handed to a stream

    def add(self, token: int) -> bool:
        """Appends a token's text; True when a stop string ended the request (text cut before it)."""
        if self.decoder is None:
            return False
        piece = self.decoder(token)
        if not piece:
            return False
        start = max(0, len(self.text) - self.hold_back)
        self.text += piece
        if self.stop:
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                return True
        return False

    def finish(self, token_ids: list[int], cut: bool) -> None:
        """The final text: one full decode (which also renders bytes left incomplete), unless a stop string cut it."""
        if self.tokenizer is not None and not cut:
            self.text = self.tokenizer.decode(token_ids)

    def take(self, final: bool) -> str:
        """Text not yet streamed (all of it when final)."""
        end = len(self.text) if final else len(self.text) - self.hold_back
        if end <= self.sent:
            return ""
        chunk, self.sent = self.text[self.sent:end], end
        return chunk


class RequestHandle:
    """One request as the dispatcher fills it in.

    ``output`` is complete once ``done`` is set; ``next_chunk()`` yields its
    stream. Written by the reader thread only; read by the request's caller.
    """

    def __init__(self, rid: int, output: RequestOutput, stop: list[str], tokenizer, dispatcher: ResponseDispatcher,
                 done_queue: queue.SimpleQueue | None, listener=None):
        self.id = rid
        self.output = output
        self._text = _Text(tokenizer, stop)
        self._stopped = False  # a stop string ended it; the engine's final response is awaited
        self._chunks: queue.SimpleQueue[StreamChunk] = queue.SimpleQueue()
        self._done_queue = done_queue
        self._listener = listener
        self._dispatcher = dispatcher
        self.done = threading.Event()

    # ------------------------------------------------------- reader thread
    def _route(self, response: dict) -> bool:
        """Applies one engine response; True when it was the request's last."""
        out, new_tokens = self.output, []
        reported = response.get("logprobs")
        new_logprobs = [] if reported is not None else None
        if not self._stopped:
            for i, token in enumerate(response["tokens"]):
                out.token_ids.append(token)
                new_tokens.append(token)
                if reported is not None:
                    logprob, top = reported[i]
                    new_logprobs.append(TokenLogprob(token, logprob, [tuple(t) for t in top]))
                if self._text.add(token):
                    self._stopped = True
                    self._dispatcher.engine.cancel(self.id)
                    break
        if new_logprobs:
            if out.logprobs is None:
                out.logprobs = []
            out.logprobs.extend(new_logprobs)
        if not response["finished"]:
            delta = self._text.take(final=False)
            if new_tokens or delta:
                self._put(StreamChunk(new_tokens, delta, logprobs=new_logprobs))
            return False
        out.metrics.update(response.get("metrics") or {})
        if self._stopped:
            out.metrics["generated_tokens"] = len(out.token_ids)
        self._finish(new_tokens, "stop" if self._stopped else response["finish_reason"],
                     None if self._stopped else (response["error"] or None), new_logprobs)
        return True

    def _finish(self, new_tokens: list[int], reason: str, error: str | None, logprobs=None) -> None:
        self._text.finish(self.output.token_ids, cut=self._stopped)
        self.output.text = self._text.text
        self.output.finish_reason, self.output.error = reason, error
        self._put(StreamChunk(new_tokens, self._text.take(final=True), reason, error, logprobs))
        self.done.set()
        if self._done_queue is not None:
            self._done_queue.put(self)

    def _put(self, chunk: StreamChunk) -> None:
        """Queues a chunk for next_chunk(), or hands it to the listener (which must not block)."""
        if self._listener is not None:
            self._listener(chunk)
        else:
            self._chunks.put(chunk)

    # ------------------------------------------------------------- callers
    def next_chunk(self) -> StreamChunk:
        """The next chunk of the stream; blocks until there is one."""
        while True:
            try:
                return self._chunks.get(timeout=_POLL_S)
            except queue.Empty:
                self._dispatcher.check()

    def wait(self) -> RequestOutput:
        """Blocks until the request has ended; returns its output."""
        while not self.done.wait(_POLL_S):
            self._dispatcher.check()
        return self.output

    def cancel(self) -> None:
        """Ends the request (finish_reason "cancelled") unless it has ended already."""
        if not self.done.is_set():
            self._dispatcher.engine.cancel(self.id)


class ResponseDispatcher:
    """Owns the reader thread and the handles of the requests in flight.

    engine: an ``ssd._C.Engine``; core: the ``ssd._C`` module (for its log
    records); tokenizer: the model's ``Tokenizer`` or None.
    """

    def __init__(self, engine, core, tokenizer):
        self.engine = engine
        self._core = core
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._handles: dict[int, RequestHandle] = {}
        self._closing = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ssd-response-dispatcher", daemon=True)
        self._thread.start()

    def submit(self, requests, done_queue: queue.SimpleQueue | None = None, listeners=None) -> list[RequestHandle]:
        """Queues [(index, prompt text or None, token ids, SamplingParams)] at once; returns their handles.

        done_queue, when given, receives each handle as its request ends.
        listeners, when given, has one callable per request: it receives that
        request's chunks on the reader thread instead of next_chunk() (it
        must return at once, e.g. hand the chunk to an event loop).
        """
        with self._lock:  # held across enqueue, so no response can arrive before its handle exists
            if self._closing:
                raise RuntimeError("LLM is shut down")
            self.check()
            ids = self.engine.enqueue_batch([(toks, p.core_dict()) for _, _, toks, p in requests])
            handles = []
            listeners = listeners if listeners is not None else [None] * len(requests)
            for rid, (index, text, toks, params), listener in zip(ids, requests, listeners):
                output = RequestOutput(index=index, prompt=text, prompt_token_ids=list(toks))
                handle = RequestHandle(rid, output, params.stop, self._tokenizer, self, done_queue, listener)
                self._handles[rid] = handle
                handles.append(handle)
        return handles

    def cancel_all(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
        for h in handles:
            h.cancel()

    def check(self) -> None:
        """Raises RuntimeError when the reader thread has failed."""
        if self._failure is not None:
            raise RuntimeError(f"ssd response dispatcher failed: {self._failure!r}") from self._failure

    def close(self) -> None:
        """After the engine's shutdown: drains its last responses and stops the reader."""
        with self._lock:
            self._closing = True
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                closing = self._closing  # read before the await: a shut-down engine returns at once
                responses = self.engine.await_responses(_POLL_S)
                _logging.forward(self._core)
                with self._lock:
                    for r in responses:
                        handle = self._handles.get(r["id"])
                        if handle is not None and handle._route(r):
                            del self._handles[r["id"]]
                if closing and not responses:
                    break
        except BaseException as e:  # noqa: BLE001 - any failure must reach the waiting callers
            self._failure = e
        finally:
            with self._lock:
                left, self._handles = list(self._handles.values()), {}
            for h in left:  # not expected: the engine ends every request before it stops
                h._finish([], "error" if self._failure else "cancelled",
                          f"response dispatcher failed: {self._failure!r}" if self._failure else None)
