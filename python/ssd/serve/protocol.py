"""The OpenAI request bodies ssd accepts, and their translation to ``SamplingParams``.

pydantic checks the JSON types; the value rules (ranges of max_tokens,
temperature, top_p, seed, ...) are SamplingParams', the one place they live.
Unknown fields are ignored, as OpenAI's API does.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict

from ssd.config import SamplingParams

_SEED_MASK = 2**64 - 1


class RequestError(Exception):
    """A request the server refuses: HTTP status, OpenAI error type and code, the field at fault."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | None = None


class _Common(BaseModel):
    """Fields chat and completion requests share."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # an extension (vLLM and llama.cpp have it too)
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False  # an extension, for benchmarks


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_Common):
    prompt: Union[str, list[int]]
    logprobs: int | None = None
    echo: Literal[False] = False


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` of a request seeded with `seed`: choice 0 keeps
    the seed (so n=1 samples what LLM.generate does with it), the others get
    splitmix64 mixes of (seed, index), so choices differ."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _SEED_MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _SEED_MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _SEED_MASK
    return z ^ (z >> 31)


def logprobs_wanted(req: _Common) -> int | None:
    """How many top alternatives per token a request asks for, or None for no logprobs.

    Chat: logprobs (true/false) and top_logprobs (0-20, needs logprobs); completions: logprobs (0-20).
    """
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise RequestError("top_logprobs: needs logprobs set to true", param="top_logprobs")
        if not req.logprobs:
            return None
        n, field = req.top_logprobs or 0, "top_logprobs"
    else:
        if req.logprobs is None:
            return None
        n, field = req.logprobs, "logprobs"
    if not 0 <= n <= 20:
        raise RequestError(f"{field}: must be in [0, 20], got {n}", param=field)
    return n


def sampling_params(req: _Common, max_tokens: int | None, room: int) -> list[SamplingParams]:
    """One SamplingParams per choice. room: tokens left in max_model_len after the prompt (the
    default max_tokens). Raises RequestError naming the field."""
    if req.presence_penalty != 0 or req.frequency_penalty != 0:
        field = "presence_penalty" if req.presence_penalty != 0 else "frequency_penalty"
        raise RequestError(f"{field}: penalties are not supported yet (they come with the next change to the "
                           "logits-processing routine); send 0", param=field)
    n_top = logprobs_wanted(req)
    if not 1 <= req.n <= 128:
        raise RequestError(f"n: must be in [1, 128], got {req.n}", param="n")
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"max_tokens: must be >= 1, got {max_tokens}", param="max_tokens")
    if max_tokens is not None and max_tokens > room:
        raise RequestError(f"max_tokens: {max_tokens} tokens do not fit: the prompt leaves {room} of the "
                           "model's context", param="max_tokens")
    out = []
    for i in range(req.n):
        try:
            out.append(SamplingParams(
                temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                max_tokens=max_tokens if max_tokens is not None else room, stop=req.stop,
                ignore_eos=req.ignore_eos, seed=None if req.seed is None else choice_seed(req.seed, i),
                logprobs=n_top))
        except ValueError as e:
            field = str(e).split(":", 1)[0]
            raise RequestError(str(e), param=field if field.isidentifier() else None) from None
    return out
