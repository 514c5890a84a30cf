"""The OpenAI request bodies ssd accepts, and their translation to ``SamplingParams``.

pydantic reads a body (``parse_body``) with JSON's own types, strictly: an
integer field takes a JSON integer (not ``"10"``, ``true`` or ``10.0``), a
boolean takes ``true``/``false``, a role is one of OpenAI's. The value rules
(ranges of max_tokens, temperature, top_p, seed, ...) are SamplingParams', the
one place they live. Unknown fields are ignored, as OpenAI's API does. Every
refusal is a ``RequestError`` whose ``param`` names the JSON field
(``messages[0].content``, ``stop``).
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from ssd.config import SamplingParams

_SEED_MASK = 2**64 - 1
# OpenAI's chat roles ("function" is its deprecated form of "tool").
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class RequestError(Exception):
    """A request the server refuses: HTTP status, OpenAI error type and code, the field at fault."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class ContentPart(_Body):
    """One part of a message's content; only type "text" is served (the library says so, naming the type)."""

    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal[ROLES]
    content: Union[str, list[ContentPart], None] = None


class _Common(_Body):
    """Fields chat and completion requests share."""

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

    def message_dicts(self) -> list[dict]:
        """The messages as LLM.chat_prompt takes them (content parts included)."""
        return [m.model_dump(exclude_none=True) for m in self.messages]


class CompletionRequest(_Common):
    prompt: Union[str, list[int]]
    logprobs: int | None = None
    echo: Literal[False] = False


def parse_body(model: type[_Common], body: bytes) -> _Common:
    """The request ``body`` read as ``model``; RequestError naming the first field at fault."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _refusal(e.errors(include_url=False)) from None


def _refusal(errors: list[dict]) -> RequestError:
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        why = str(first.get("msg", "")).removeprefix("Invalid JSON: ")
        if "surrogate" in why or "hex escape" in why:
            why += " (its text is not valid Unicode: a \\u escape of a lone surrogate)"
        return RequestError(f"the body is not valid JSON: {why}")
    param = field_path(first.get("loc", ()))
    if param is None:
        return RequestError(f"the body must be a JSON object: {first.get('msg', 'invalid value')}")
    # A union field reports one error per member it tried: the member read furthest into the value names the
    # field (stop: ["a", 5] is at stop[1], not stop); members that failed at the same place are said together.
    field = first["loc"][0]
    paths = [field_path(e.get("loc", ())) for e in errors if e.get("loc", (None,))[0] == field]
    param = max(paths, key=lambda p: (p or "").count("[") + (p or "").count("."))
    said = []
    for e in errors:
        if field_path(e.get("loc", ())) == param and e.get("msg") not in said:
            said.append(e.get("msg"))
    return RequestError(f"{param}: {'; or '.join(said)}", param=param)


def field_path(loc) -> str | None:
    """pydantic's error location as the JSON path a client wrote, ``messages[0].content``: a union's
    member tags (``str``, ``list[str]``, ``ContentPart``) are not fields and are left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _is_field_name(part):
            out += f".{part}" if out else part
    return out or None


def _is_field_name(part: str) -> bool:
    return part.isidentifier() and part.islower() and part not in ("str", "int", "float", "bool", "none")


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
