"""A request body made ready for the engine, off the event loop.

Reading the JSON, rendering the chat template and tokenising take time in
proportion to the body (a 4 MB prompt: about 2 s on one core), so they run on
``PREPARE_THREADS`` worker threads, not on the event loop that sends every
stream's chunks and answers /health. Bodies of ``LARGE_TEXT_CHARS`` bytes or
more are prepared one at a time on a thread of their own (``Preparer``), so
that small requests never wait behind them, and so that one thread's heap,
not every worker's, holds what the tokenizer's working memory leaves behind
(about 50 MB per thread that ever tokenised 2 MB, even after the heap is
trimmed). The tokenizer runs without the GIL, and a prompt longer than the
model's context is refused by its token count before its ids become a Python
list (``Tokenizer.encode_within``).

The workers are daemon threads with their own queue: a second signal exits the
server at once, even with a tokenisation under way.
"""
from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading

from ssd.config import SamplingParams
from ssd.models.tokenizer import LARGE_TEXT_CHARS
from ssd.serve.protocol import ChatCompletionRequest, CompletionRequest, RequestError, parse_body, sampling_params

PREPARE_THREADS = 3  # for bodies under LARGE_TEXT_CHARS; larger ones have one thread


@dataclasses.dataclass
class Prepared:
    """A request ready to admit: its body, prompt ids and one SamplingParams per choice."""

    req: ChatCompletionRequest | CompletionRequest
    chat: bool
    prompt_ids: list[int]
    params: list[SamplingParams]


def prepare(state, body: bytes, chat: bool) -> Prepared:
    """Reads and checks one body for ``state``'s engine (a ServerState); RequestError names what is wrong."""
    req = parse_body(ChatCompletionRequest if chat else CompletionRequest, body)
    if req.model != state.model_name:
        raise RequestError(f"The model '{req.model}' does not exist (this server serves '{state.model_name}')",
                           status=404, param="model", code="model_not_found")
    llm = state.engine.llm
    field = "messages" if chat else "prompt"
    try:
        if chat:
            messages = req.message_dicts()
            if not messages:
                raise RequestError("messages: must hold at least one message", param="messages")
            prompt = llm.chat_prompt(messages)
        else:
            prompt = req.prompt
        _, prompt_ids = llm._prompt_ids(0, prompt)
    except ValueError as e:  # ChatTemplateError (bad roles, content parts), a prompt too long or empty, ...
        message = state.public(str(e).removeprefix("prompt 0: "))
        param = message.split(":", 1)[0] if message.startswith(field) else field
        raise RequestError(message if message.startswith(field) else f"{field}: {message}", param=param) from None
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    params = sampling_params(req, max_tokens, state.engine.config.max_model_len - len(prompt_ids))
    if len(params) > state.max_in_flight:
        raise RequestError(f"n: {len(params)} choices can never be admitted: this server admits at most "
                           f"{state.max_in_flight} requests at once", param="n")
    return Prepared(req, chat, prompt_ids, params)


class Preparer:
    """``await preparer(state, body, chat)``: ``prepare`` on a worker; bodies of ``LARGE_TEXT_CHARS`` bytes or
    more on their own one."""

    def __init__(self):
        self._small = Workers(PREPARE_THREADS)
        self._large = Workers(1, name="ssd-prepare-large")

    async def __call__(self, state, body: bytes, chat: bool) -> Prepared:
        workers = self._large if len(body) >= LARGE_TEXT_CHARS else self._small
        return await workers.run(prepare, state, body, chat)


class Workers:
    """Daemon threads that run blocking calls for coroutines: ``await workers.run(fn, *args)``."""

    def __init__(self, threads: int = PREPARE_THREADS, name: str = "ssd-prepare"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = threads
        self._name = name
        self._started: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, fn, *args):
        """fn(*args) on a worker; its result, or its exception raised here."""
        self._start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return await future

    def _start(self) -> None:
        with self._lock:
            while len(self._started) < self._threads:
                t = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._started)}", daemon=True)
                t.start()
                self._started.append(t)

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
            if future.cancelled():  # its caller left while it waited (read across threads: at worst run anyway)
                continue
            try:
                result, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - handed to the caller, whatever it is
                result, error = None, e

            def settle(future=future, result=result, error=error):
                if future.cancelled():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for the result
            # Not held here until the next job: an error's traceback holds the frames of a whole request.
            del loop, future, fn, args, result, error, settle
