"""``AsyncLLM``: the engine for asyncio programs (the HTTP server is one).

One ``LLM`` underneath. Its response dispatcher thread (``ssd.dispatch``), which
awaits the C++ engine without holding the GIL, hands each request's chunks to
the event loop that submitted it (``call_soon_threadsafe``); an ``async for``
reads them from that request's own ``asyncio.Queue``. Leaving the loop early
(``break``, an exception, the task cancelled because a client disconnected)
cancels the request, which frees its KV blocks. The registry of requests in
flight holds each weakly: a request never iterated leaves it when it finishes,
and one whose handle is dropped is cancelled.

    llm = AsyncLLM(LLM("model.gguf"))
    async for chunk in llm.generate("Hello", SamplingParams(max_tokens=16)):
        print(chunk.text, end="")
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import AsyncIterator

from ssd.config import SamplingParams
from ssd.dispatch import RequestOutput, StreamChunk
from ssd.llm import LLM

__all__ = ["AsyncLLM", "AsyncRequest"]


class AsyncRequest:
    """One submitted request: iterate it (``async for``) for its chunks.

    request_id: the caller's name for it (``AsyncLLM.abort`` takes it);
    prompt_token_ids: the prompt as the engine got it; output: the
    ``RequestOutput``, complete once the last chunk (the one with a
    finish_reason) has been yielded.
    """

    def __init__(self, owner: AsyncLLM, request_id: str, handle, queue: asyncio.Queue):
        self._owner = owner
        self._handle = handle
        self._queue = queue
        self.request_id = request_id
        self.prompt_token_ids: list[int] = handle.output.prompt_token_ids
        self.finished = False

    @property
    def output(self) -> RequestOutput:
        return self._handle.output

    def abort(self) -> None:
        """Cancels the request (its stream ends with finish_reason "cancelled")."""
        self._handle.cancel()

    def close(self) -> None:
        """For a request that will not be iterated: cancels it and forgets it."""
        self._handle.cancel()
        self._owner._forget(self.request_id, self)

    async def __aiter__(self) -> AsyncIterator[StreamChunk]:
        try:
            while not self.finished:
                # Every wait has an exit: the dispatcher ends every handle (engine
                # shutdown: "cancelled"; a failed reader: "error").
                chunk = await self._queue.get()
                self.finished = chunk.finish_reason is not None
                yield chunk
        finally:
            self._owner._forget(self.request_id, self)
            if not self.finished:
                self._handle.cancel()


class AsyncLLM:
    """asyncio front of an ``LLM``: ``submit``/``generate`` from coroutines, ``abort`` by id.

    Safe from several event loops and threads at once (each request's chunks
    go to the loop that submitted it).
    """

    def __init__(self, llm: LLM):
        self.llm = llm
        self._lock = threading.Lock()
        # Weakly: a dropped handle's request is cancelled (its finalizer), a finished one forgotten (its listener).
        self._requests: weakref.WeakValueDictionary[str, AsyncRequest] = weakref.WeakValueDictionary()
        self._next_id = 0

    @property
    def config(self):
        return self.llm.config

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def submit(self, prompt, params: SamplingParams | None = None, request_id: str | None = None) -> AsyncRequest:
        """Queues one prompt (text or token ids) now; call from a running event loop.

        Raises ValueError naming the problem when the prompt or params are invalid.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamChunk] = asyncio.Queue()
        ref: list[weakref.ref] = []  # the request, once made; the listener must not keep it alive

        def deliver(chunk: StreamChunk) -> None:  # on the loop: submit() has returned by now
            queue.put_nowait(chunk)
            request = ref[0]() if chunk.finish_reason is not None else None
            if request is not None:  # finished: in flight no longer, read or not
                self._forget(request.request_id, request)

        def listener(chunk: StreamChunk) -> None:  # on the dispatcher's thread, which holds its lock
            try:
                loop.call_soon_threadsafe(deliver, chunk)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to read the chunk

        prepared = self.llm._prepare([prompt], params)
        with self._lock:
            if request_id is None:
                request_id = f"req-{self._next_id}"
                self._next_id += 1
            if request_id in self._requests:
                raise ValueError(f"request_id: {request_id!r} is already in flight")
            (handle,) = self.llm._dispatcher.submit(prepared, listeners=[listener])
            request = AsyncRequest(self, request_id, handle, queue)
            weakref.finalize(request, handle.cancel)  # dropped unread: cancelled (a no-op once finished)
            ref.append(weakref.ref(request))
            self._requests[request_id] = request
        return request

    async def generate(self, prompt, params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[StreamChunk]:
        """Yields the request's chunks as they arrive; the last one has finish_reason."""
        async for chunk in self.submit(prompt, params, request_id):
            yield chunk

    def abort(self, request_id: str) -> bool:
        """Cancels the request in flight under that id; False when there is none."""
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return False
        request.abort()
        return True

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._requests)

    def abort_all(self) -> None:
        with self._lock:
            requests = list(self._requests.values())
        for r in requests:
            r.abort()

    def stats(self) -> dict:
        return self.llm.stats()

    def failure(self) -> str | None:
        return self.llm.failure()

    def shutdown(self) -> None:
        self.llm.shutdown()

    def _forget(self, request_id: str, request: AsyncRequest) -> None:
        with self._lock:
            if self._requests.get(request_id) is request:
                del self._requests[request_id]
