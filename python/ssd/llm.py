"""``LLM``: generate, stream and chat over the C++ engine.

The engine runs on its own thread; the response dispatcher (ssd.dispatch)
routes its responses to per-request handles, which turn tokens into text and
apply stop strings. Every method may be called from several threads at once.
"""
from __future__ import annotations

import atexit
import dataclasses
import numbers
import queue
import threading
import weakref
from typing import Iterator, Sequence

from ssd import _logging
from ssd.config import EngineConfig, SamplingParams
from ssd.models.core import release_freed_memory
from ssd.dispatch import RequestOutput, ResponseDispatcher, StreamChunk
from ssd.models.tokenizer import TooManyTokens

__all__ = ["LLM", "RequestOutput", "StreamChunk"]


# Engines still running at interpreter exit are shut down by an atexit hook,
# which runs before the interpreter stops threads: the dispatcher's thread must
# not be stopped inside the engine's wait.
_running: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _shutdown_running() -> None:
    for llm in list(_running):
        llm.shutdown()


def _is_token_id(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def _token_id_list(prompt) -> list[int] | None:
    """A prompt of token ids as a list of ints (Python or numpy integers, or a
    1-D numpy integer array); None when it is not one."""
    if type(prompt).__module__ == "numpy" and hasattr(prompt, "ndim"):
        if prompt.ndim == 1 and prompt.dtype.kind in "iu":
            return [int(t) for t in prompt.tolist()]
        return None
    if isinstance(prompt, Sequence) and not isinstance(prompt, str) and all(_is_token_id(t) for t in prompt):
        return [int(t) for t in prompt]
    return None

class LLM:
    """Generation over a target model (HF directory or GGUF file).

    mode "ar": autoregressive; mode "sd": speculative decoding with `draft`
    (a smaller model sharing the target's vocabulary) proposing `k` tokens per
    round, verified losslessly: the output law is the target's. mode "ssd":
    asynchronous speculative speculative decoding (SAGUARO): a draft worker on
    its own thread prepares the next speculation for the likely verification
    outcomes while the target verifies; same output law.

    target / draft: a path, or a ``LoadedModel`` from ``ssd.models.load``
    (loaded with this config's dtype, or draft_dtype for the draft; reused, e.g.
    across several engines).
    testing: an ``ssd.testing.TestingConfig`` of test-only switches (tests only).

    >>> llm = LLM(target="path/to/model", mode="ar", max_model_len=1024)
    >>> llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))[0].text
    """

    def __init__(self, target, *, mode: str = "ar", draft=None,
                 config: EngineConfig | None = None, testing=None, **engine_kwargs):
        if config is None:
            config = EngineConfig(mode=mode, **engine_kwargs)
        elif engine_kwargs:
            raise ValueError("pass either config= or engine keyword arguments, not both")
        if config.mode == "ar" and draft is not None:
            raise ValueError("draft: mode 'ar' takes no draft model (use mode='sd')")
        if config.mode != "ar" and draft is None:
            raise ValueError(f"draft: mode {config.mode!r} needs a draft model")
        from ssd import _C, models
        from ssd.testing.switches import TestingConfig

        if testing is not None and not isinstance(testing, TestingConfig):
            raise ValueError(f"testing: expected ssd.testing.TestingConfig, got {type(testing).__name__}")
        self.config = config
        self._core = _C
        self._closed = False
        self._shutdown_lock = threading.Lock()
        _logging.sync_level(_C)

        def load(source, dtype):
            # An already loaded model (ssd.models.load with this config's dtype) is reused as is.
            if isinstance(source, models.LoadedModel):
                return source
            return models.load(source, dtype=dtype)

        if draft is not None:
            models.loader.check_same_tokenizer(target, draft)  # before any weights load
        self._workers = self._group = self._store = None
        int8 = config.quant_activations == "int8"
        if config.tensor_parallel_size > 1 and config.tensor_parallel_init == "env":
            self._store = self._env_store(config)  # before loading: the other ranks connect meanwhile
        self.model = load(target, config.dtype)
        tensor_parallel = self._tensor_parallel(config, int8) if config.tensor_parallel_size > 1 else None
        try:
            self.draft_model = None if draft is None else load(draft, config.draft_dtype or config.dtype)
            self._build(config, int8, tensor_parallel, testing)
        except BaseException:
            if self._workers is not None:
                self._workers.kill()
            raise
        _running.add(self)

    def _env_store(self, config: EngineConfig):
        """"env": (rank, local rank) from the environment and the store every rank meets at."""
        from ssd import distributed

        rank, world, local_rank = distributed.env_ranks()
        if world != config.tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} differs from WORLD_SIZE {world}")
        self._env_rank = rank, local_rank
        return distributed.env_store(rank, world, config.tensor_parallel_timeout_s)

    def _tensor_parallel(self, config: EngineConfig, int8: bool) -> tuple:
        """This process's membership of the target's group, as rank 0 (ssd.distributed): with "spawn" it
        starts ranks 1.. as processes; with "env" the user started every rank, and on ranks 1.. this follows
        rank 0 and then exits the process (status 0 once rank 0 shuts down, 1 when the group fails)."""
        from ssd import distributed

        size, timeout = config.tensor_parallel_size, config.tensor_parallel_timeout_s
        if config.tensor_parallel_init == "env":
            rank, local_rank = self._env_rank
            if rank != 0:
                raise SystemExit(distributed.follow(
                    self.model, self._store, rank, size, device=distributed.rank_device(config.target_device, local_rank),
                    backend=config.backend, int8_activations=int8, threads=config.target_threads, timeout_s=timeout))
        else:
            self._store = distributed.host_store(size, timeout)
            self._workers = distributed.WorkerProcesses(
                self.model.source, size, self._store.port, dtype=config.dtype, device=config.target_device,
                backend=config.backend, int8_activations=int8, threads=config.target_threads, timeout_s=timeout)
        self._group = distributed.RankGroup(0, size, config.target_device, timeout)
        return self._group.spec()

    def _build(self, config: EngineConfig, int8: bool, tensor_parallel, testing) -> None:
        from ssd import _C

        core = self.model.core_model(config.target_device, config.backend, batch_invariant=config.batch_invariant,
                                     int8_activations=int8, tensor_parallel=tensor_parallel,
                                     cuda_graphs=config.cuda_graphs)
        self._target_core = core
        self.model.weights.clear()  # the core holds its own (fused) copies
        draft_core = None
        if self.draft_model is not None:
            draft_core = self.draft_model.core_model(config.draft_device, config.backend,
                                                     batch_invariant=config.batch_invariant, int8_activations=int8,
                                                     cuda_graphs=config.cuda_graphs,
                                                     draft_sm_share=config.draft_sm_share)
            self.draft_model.weights.clear()
        release_freed_memory()  # the loaders' temporaries (a GGUF reader's metadata, fused parts)
        if self._group is not None:  # the followers build their shards meanwhile; the engine pings them at once
            from ssd.distributed import announce_ready, wait_ready

            announce_ready(self._store, 0)
            wait_ready(self._store, 0, config.tensor_parallel_size,
                       check=self._workers.check if self._workers is not None else None)
            self._group.join(self._store)
        try:
            self._engine = _C.Engine(config.to_dict(), core, list(self.model.eos_token_ids), draft_core,
                                     testing.to_dict() if testing is not None else {})
        finally:
            _logging.forward(_C)
        # The fields the engine fills in (max_model_len, kv_capacity_tokens), as it resolved them.
        self.config = dataclasses.replace(config, **self._engine.config())
        self._dispatcher = ResponseDispatcher(self._engine, _C, self.model.tokenizer)

    # ----------------------------------------------------------------- input
    @property
    def tokenizer(self):
        return self.model.tokenizer

    def _prompt_ids(self, index: int, prompt) -> tuple[str | None, list[int]]:
        limit = self.config.max_model_len
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            raise TypeError(f"prompt {index}: bytes are not a prompt; decode them to a str, or pass a list of "
                            "token ids")
        if isinstance(prompt, str):
            if self.model.tokenizer is None:
                raise ValueError(f"prompt {index}: a text prompt needs a tokenizer, and "
                                 f"{self.model.source} has none; pass token ids instead")
            try:
                ids = self.model.tokenizer.encode_within(prompt, limit - 1)
            except TooManyTokens as e:
                raise ValueError(f"prompt {index}: {e.num_tokens} tokens do not fit max_model_len {limit} (at "
                                 "least one token must be generated)") from None
            except ValueError as e:  # not valid Unicode
                raise ValueError(f"prompt {index}: {e}") from None
            text = prompt
        else:
            ids, text = _token_id_list(prompt), None
            if ids is None:
                raise ValueError(f"prompt {index}: must be a string, a list of integer token ids or a 1-D "
                                 f"integer array, got {type(prompt).__name__}")
        vocab = self.model.config.vocab_size
        if not ids:
            raise ValueError(f"prompt {index}: is empty")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {index}: token id {bad[0]} is outside the vocabulary (size {vocab})")
        if len(ids) >= limit:
            raise ValueError(f"prompt {index}: {len(ids)} tokens do not fit max_model_len {limit} (at least one "
                             "token must be generated)")
        return text, ids

    def _prepare(self, prompts, params) -> list[tuple[int, str | None, list[int], SamplingParams]]:
        """Checks every prompt and params entry; [(index, text, ids, params)]. An empty list is no prompts."""
        if isinstance(prompts, (str, bytes, bytearray, memoryview)) or (
                _token_id_list(prompts) is not None and len(prompts) > 0):
            prompts = [prompts]  # one prompt (bytes: refused by _prompt_ids)
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"params: got {len(params)} SamplingParams for {len(prompts)} prompts")
        vocab = self.model.config.vocab_size
        prepared = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"params {i}: expected SamplingParams, got {type(p).__name__}")
            bad = [t for t in p.stop_token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"params {i}: stop_token_ids: token id {bad[0]} is outside the vocabulary (size {vocab})")
            if p.stop and self.model.tokenizer is None:
                raise ValueError(f"params {i}: stop strings need a tokenizer, and {self.model.source} has none")
            text, ids = self._prompt_ids(i, prompt)
            prepared.append((i, text, ids, p))
        return prepared

    # ---------------------------------------------------------------- engine
    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = False) -> list[RequestOutput]:
        """Generates for every prompt (strings or token-id lists); outputs in prompt order.

        Every prompt and params entry is checked before anything is queued; an
        invalid one raises ValueError naming its index (TypeError for bytes).
        No prompts (``[]``): no outputs.
        """
        prepared = self._prepare(prompts, params)
        if not prepared:
            return []
        finished: queue.SimpleQueue = queue.SimpleQueue()
        # All at once: the engine's first step then prefills the whole batch.
        handles = self._dispatcher.submit(prepared, done_queue=finished)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(handles), desc="generate", unit="req")
        try:
            for _ in handles:
                while True:
                    try:
                        finished.get(timeout=1.0)
                        break
                    except queue.Empty:
                        self._dispatcher.check()
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            for h in handles:  # only when interrupted (an exception, e.g. KeyboardInterrupt)
                h.cancel()
        return [h.output for h in handles]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yields StreamChunk as tokens arrive; closing the iterator cancels the request.

        The prompt is checked and queued when the first chunk is asked for.
        """
        (handle,) = self._dispatcher.submit(self._prepare([prompt], params))
        try:
            while True:
                chunk = handle.next_chunk()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            handle.cancel()

    def chat(self, messages, params: SamplingParams | None = None):
        """Applies the model's chat template and generates.

        messages: one conversation (a list of {"role", "content"} dicts; a
        content may be OpenAI's list of text parts) -> one RequestOutput; a
        list of conversations -> a list of them.
        """
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else list(messages)
        outputs = self.generate([self.chat_prompt(conv) for conv in conversations], params)
        return outputs[0] if single else outputs

    def chat_prompt(self, messages) -> str:
        """One conversation rendered by the model's chat template, as chat() sends it."""
        return self.model.require_tokenizer().apply_chat_template(messages, add_generation_prompt=True)

    def cancel_all(self) -> None:
        """Cancels every request in flight (they end with finish_reason "cancelled")."""
        self._dispatcher.cancel_all()

    def failure(self) -> str | None:
        """Why this engine can no longer generate, or None while it can: a tensor-parallel rank that is
        gone or hung (every request then ends with finish_reason "error" and new ones raise RuntimeError).
        ``ssd serve`` reports it on /health and exits."""
        why = self._engine.failure()
        if why:
            return why
        if self._workers is not None and not self._closed:
            for rank, status in self._workers.failed():
                return f"tensor parallelism: rank {rank} exited with status {status}"
        return None

    def stats(self) -> dict:
        stats = dict(self._engine.stats())
        if self.config.tensor_parallel_size > 1:
            # the target's all-gathers (two per layer and forward) and their seconds, summing included
            stats["tensor_parallel_collectives"] = self._target_core.collective_calls
            stats["tensor_parallel_collective_s"] = self._target_core.collective_seconds
        _logging.forward(self._core)
        return stats

    def shutdown(self) -> None:
        """Stops the engine (idempotent): requests in flight end as cancelled, later calls raise."""
        engine = getattr(self, "_engine", None)
        if engine is None:
            return
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
            engine.shutdown()  # a tensor-parallel engine stops its followers (unless the group failed)
            self._dispatcher.close()
            if self._workers is not None:
                if engine.failure() or self._workers.failed():  # some were not told to stop
                    self._workers.kill()
                else:
                    self._workers.close()
        _logging.forward(self._core)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        self.shutdown()
