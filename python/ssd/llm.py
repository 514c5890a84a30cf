"""``LLM``: generate, stream and chat over the C++ engine.

The engine runs on its own thread; this class enqueues requests, pumps the
engine's responses and turns tokens into text (stop strings are applied here,
on the detokenized text). One LLM is meant to be driven from one Python thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

from ssd import _logging
from ssd.config import EngineConfig, SamplingParams

@dataclass
class RequestOutput:
    """The result of one request.

    finish_reason: "stop", "length", "cancelled" or "error" (then `error` says why).
    """

    index: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)


@dataclass
class StreamChunk:
    """New tokens and the text they completed; the last chunk has finish_reason."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None


class _Tracker:
    """Accumulates one request's tokens and applies stop strings."""

    def __init__(self, output: RequestOutput, params: SamplingParams, tokenizer):
        self.output = output
        self.params = params
        self.tokenizer = tokenizer
        self.emitted_text = 0  # characters already handed to a stream
        self.done = False
        self.hold_back = max((len(s) for s in params.stop), default=1) - 1

    def add(self, tokens: list[int]) -> bool:
        """Appends tokens; returns True when a stop string ended the request."""
        out = self.output
        for tok in tokens:
            out.token_ids.append(tok)
            if self.tokenizer is None:
                continue
            before = len(out.text)
            out.text = self.tokenizer.decode(out.token_ids)
            if self.params.stop:
                cut = _find_stop(out.text, self.params.stop, max(0, before - self.hold_back - 1))
                if cut is not None:
                    out.text = out.text[:cut]
                    return True
        return False

    def pending_text(self, final: bool) -> str:
        text = self.output.text
        end = len(text) if final else len(text) - self.hold_back
        if not final and text.endswith("\ufffd"):  # an incomplete UTF-8 sequence
            end = min(end, len(text) - 1)
        if end <= self.emitted_text:
            return ""
        chunk = text[self.emitted_text:end]
        self.emitted_text = end
        return chunk


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


class LLM:
    """Generation over a target model (HF directory or GGUF file).

    mode "ar": autoregressive; mode "sd": speculative decoding with `draft`
    (a smaller model sharing the target's vocabulary) proposing `k` tokens per
    round, verified losslessly: the output law is the target's. mode "ssd":
    asynchronous speculative speculative decoding (SAGUARO): a draft worker on
    its own thread prepares the next speculation for the likely verification
    outcomes while the target verifies; same output law.

    target / draft: a path, or a ``LoadedModel`` from ``ssd.models.load``
    (loaded with this config's dtype; reused, e.g. across several engines).
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
        import torch

        from ssd import _C, models
        from ssd.testing.switches import TestingConfig

        if testing is not None and not isinstance(testing, TestingConfig):
            raise ValueError(f"testing: expected ssd.testing.TestingConfig, got {type(testing).__name__}")
        self.config = config
        self._core = _C
        self._closed = False
        _logging.sync_level(_C)

        def load(source):
            # An already loaded model (ssd.models.load with this config's dtype) is reused as is.
            if isinstance(source, models.LoadedModel):
                return source
            return models.load(source, dtype=getattr(torch, config.dtype))

        self.model = load(target)
        self.draft_model = None if draft is None else load(draft)
        max_pos = self.model.config.max_position_embeddings
        if config.max_model_len > max_pos:
            raise ValueError(f"max_model_len: {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({max_pos})")
        core = self.model.core_model()
        self.model.weights.clear()  # the core holds its own (fused) copies
        draft_core = None
        if self.draft_model is not None:
            draft_core = self.draft_model.core_model()
            self.draft_model.weights.clear()
        self._engine = _C.Engine(config.to_dict(), core, list(self.model.eos_token_ids), draft_core,
                                 testing.to_dict() if testing is not None else {})
        self._trackers: dict[int, _Tracker] = {}

    # ----------------------------------------------------------------- input
    @property
    def tokenizer(self):
        return self.model.tokenizer

    def _prompt_ids(self, index: int, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.model.tokenizer is None:
                raise ValueError(f"prompt {index}: a text prompt needs a tokenizer, and "
                                 f"{self.model.source} has none; pass token ids instead")
            ids = self.model.tokenizer.encode(prompt)
            text = prompt
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids, text = [int(t) for t in prompt], None
        else:
            raise ValueError(f"prompt {index}: must be a string or a list of token ids, got {type(prompt).__name__}")
        vocab = self.model.config.vocab_size
        if not ids:
            raise ValueError(f"prompt {index}: is empty")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {index}: token id {bad[0]} is outside the vocabulary (size {vocab})")
        if len(ids) >= self.config.max_model_len:
            raise ValueError(f"prompt {index}: {len(ids)} tokens do not fit max_model_len "
                             f"{self.config.max_model_len} (at least one token must be generated)")
        return text, ids

    def _prepare(self, prompts, params) -> list[tuple[str | None, list[int], SamplingParams]]:
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
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
            prepared.append((text, ids, p))
        return prepared

    def _submit(self, index: int, text, ids, params: SamplingParams) -> int:
        rid = self._engine.enqueue(ids, params.core_dict())
        self._track(rid, index, text, ids, params)
        return rid

    def _track(self, rid: int, index: int, text, ids, params: SamplingParams) -> None:
        out = RequestOutput(index=index, prompt=text, prompt_token_ids=ids)
        self._trackers[rid] = _Tracker(out, params, self.model.tokenizer)

    # ---------------------------------------------------------------- engine
    def _pump(self, timeout: float) -> list[int]:
        """Routes ready responses to their trackers; returns the ids touched."""
        touched = []
        responses = self._engine.await_responses(timeout)
        _logging.forward(self._core)
        for r in responses:
            tracker = self._trackers.get(r["id"])
            if tracker is None or tracker.done:
                continue
            touched.append(r["id"])
            if tracker.add(r["tokens"]):
                tracker.done = True
                tracker.output.finish_reason = "stop"
                self._engine.cancel(r["id"])
            elif r["finished"]:
                tracker.done = True
                tracker.output.finish_reason = r["finish_reason"]
                tracker.output.error = r["error"] or None
            if r.get("metrics"):
                tracker.output.metrics.update(r["metrics"])
        return touched

    def generate(self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = False) -> list[RequestOutput]:
        """Generates for every prompt (strings or token-id lists); outputs in prompt order.

        Every prompt and params entry is checked before anything is queued; an
        invalid one raises ValueError naming its index.
        """
        prepared = self._prepare(prompts, params)
        # All at once: the engine's first step then prefills the whole batch.
        ids = self._engine.enqueue_batch([(toks, p.core_dict()) for _, toks, p in prepared])
        for i, (rid, (text, toks, p)) in enumerate(zip(ids, prepared)):
            self._track(rid, i, text, toks, p)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req")
        try:
            remaining = set(ids)
            while remaining:
                for rid in self._pump(0.05):
                    if rid in remaining and self._trackers[rid].done:
                        remaining.discard(rid)
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            for rid in ids:
                if not self._trackers[rid].done:
                    self._engine.cancel(rid)
        return [self._trackers.pop(rid).output for rid in ids]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yields StreamChunk as tokens arrive; closing the iterator cancels the request."""
        ((text, toks, p),) = self._prepare([prompt], params)
        rid = self._submit(0, text, toks, p)
        tracker = self._trackers[rid]
        sent_tokens = 0
        try:
            while True:
                self._pump(0.05)
                out = tracker.output
                new_tokens = out.token_ids[sent_tokens:]
                delta = tracker.pending_text(final=tracker.done)
                if new_tokens or delta or tracker.done:
                    sent_tokens = len(out.token_ids)
                    yield StreamChunk(new_tokens, delta,
                                      out.finish_reason if tracker.done else None, out.error)
                if tracker.done:
                    return
        finally:
            if not tracker.done:
                self._engine.cancel(rid)
            self._trackers.pop(rid, None)

    def chat(self, messages, params: SamplingParams | None = None):
        """Applies the model's chat template and generates.

        messages: one conversation (a list of {"role", "content"} dicts) ->
        one RequestOutput; a list of conversations -> a list of them.
        """
        tok = self.model.require_tokenizer()
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else list(messages)
        prompts = [tok.apply_chat_template(conv, add_generation_prompt=True) for conv in conversations]
        outputs = self.generate(prompts, params)
        return outputs[0] if single else outputs

    def cancel_all(self) -> None:
        for rid in list(self._trackers):
            self._engine.cancel(rid)

    def stats(self) -> dict:
        stats = dict(self._engine.stats())
        _logging.forward(self._core)
        return stats

    def shutdown(self) -> None:
        """Stops the engine (idempotent); later calls to generate raise."""
        engine = getattr(self, "_engine", None)
        if engine is None or self._closed:
            return
        self._closed = True
        engine.shutdown()
        _logging.forward(self._core)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        self.shutdown()
