"""A small tokenizer wrapper: encode, decode and chat templates.

It wraps a ``tokenizers.Tokenizer`` (built from ``tokenizer.json`` or from a
GGUF file's metadata) and renders chat templates in a bounded, sandboxed
jinja2 environment that offers the same helpers as HuggingFace's
``apply_chat_template`` (see ``chat_template.py``).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jinja2
import tokenizers
import tokenizers.decoders

from .chat_template import compile_template, render, text_messages
from .errors import ChatTemplateError, ModelLoadError

# Stand-in for an assistant reply when probing a chat template for the token
# it writes after each turn; plain ASCII so that no template filter alters it.
_TURN_END_PROBE = "ssdturnendprobe"


# Texts from this many characters on are tokenised one at a time, and the heap is trimmed after each:
# the Rust tokenizer's working memory is about 150 times the text (4 MB of text: 600 MB at its peak), which
# glibc's allocator keeps in its arenas after it is freed.
LARGE_TEXT_CHARS = 1 << 20
_LARGE_TEXT = threading.Lock()


def _release_heap() -> None:
    """Gives freed heap memory back to the system (glibc's malloc_trim; nothing elsewhere)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


class TooManyTokens(ValueError):
    """A text with more tokens than were allowed: ``num_tokens`` against ``limit``."""

    def __init__(self, num_tokens: int, limit: int) -> None:
        super().__init__(f"{num_tokens} tokens, more than {limit}")
        self.num_tokens, self.limit = num_tokens, limit


def check_unicode(text: str) -> None:
    """ValueError naming the first lone surrogate in ``text`` (a str that no UTF-8 can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode: a lone surrogate {text[e.start]!r} at character {e.start}") from None


class Tokenizer:
    """Text <-> token ids for one model.

    Args:
        backend: the ``tokenizers.Tokenizer`` doing the work.
        bos_token: text of the beginning-of-sequence token, if the model has one.
        eos_token: text of the end-of-sequence token, if the model has one.
        chat_template: jinja2 chat template, if the model has one.
        source: path the tokenizer came from (used in error messages).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
        source: str = "",
    ) -> None:
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self.source = source
        self._compiled: tuple[str, jinja2.Template] | None = None

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r})"

    # ------------------------------------------------------------------ ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def num_ids(self) -> int:
        """One more than the largest token id, added tokens included (ids may skip numbers)."""
        ids = self.backend.get_vocab(with_added_tokens=True).values()
        return max(ids, default=-1) + 1

    def vocabulary_difference(self, other: Tokenizer) -> str | None:
        """None when ``other`` maps every token to the same id; else the first difference, in words."""
        mine, theirs = (t.backend.get_vocab(with_added_tokens=True) for t in (self, other))
        if mine == theirs:
            return None
        if len(mine) != len(theirs):
            return f"{len(mine)} tokens against {len(theirs)}"
        token = min((t for t in mine if theirs.get(t) != mine[t]), key=mine.get)
        where = f"id {theirs[token]}" if token in theirs else "absent"
        return f"token {token!r} is id {mine[token]} against {where}"

    @property
    def bos_token_id(self) -> int | None:
        """Id of ``bos_token``, or None."""
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        """Id of ``eos_token``, or None."""
        return self.token_to_id(self.eos_token)

    @property
    def special_token_ids(self) -> list[int]:
        """Sorted ids of the special (control) tokens, e.g. ``<|im_end|>``."""
        added = self.backend.get_added_tokens_decoder()
        return sorted(i for i, token in added.items() if token.special)

    def token_to_id(self, token: str | None) -> int | None:
        """Id of a token's text, or None when the token is None or unknown."""
        if token is None:
            return None
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Text of a token id, or None when out of range."""
        return self.backend.id_to_token(int(token_id))

    # ------------------------------------------------------- encode/decode

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``.

        Special tokens written in the text (e.g. ``<|im_start|>``) map to their
        ids. ``add_special_tokens=True`` also applies the tokenizer's
        post-processor (e.g. a leading BOS for models that want one).

        Returns: list of ``len == num_tokens`` ints.
        """
        return self.encode_within(text, None, add_special_tokens)

    def encode_within(self, text: str, max_tokens: int | None, add_special_tokens: bool = False) -> list[int]:
        """``encode(text)``, or ``TooManyTokens`` when it has more than ``max_tokens`` tokens.

        The count is checked before the ids become a Python list, so a text far
        over the limit costs its tokenisation only. The Rust tokenizer runs
        without the GIL (``encode_batch_fast``: no character offsets, which
        ``encode`` computes and frees holding the GIL: 0.2 s for 4 MB of text).

        Raises: TypeError for a text that is not a str; ValueError for one that
        is not valid Unicode (a lone surrogate), naming the character.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() expects a str, got {type(text).__name__}")
        check_unicode(text)
        if len(text) < LARGE_TEXT_CHARS:
            return self._encode(text, max_tokens, add_special_tokens)
        with _LARGE_TEXT:
            try:
                return self._encode(text, max_tokens, add_special_tokens)
            finally:
                _release_heap()

    def _encode(self, text: str, max_tokens: int | None, add_special_tokens: bool) -> list[int]:
        (encoding,) = self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        count = len(encoding)
        if max_tokens is not None and count > max_tokens:
            del encoding  # not kept alive by the traceback's frame (150 bytes a character of text)
            raise TooManyTokens(count, max_tokens)
        return encoding.ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (a list, or a 1-D tensor/array of ``[num_tokens]``)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream_decoder(self) -> Callable[[int], str | None]:
        """A decoder for one growing sequence of ids, fed one id per call.

        Each call returns the text the id completed (None while the bytes of a
        character are still incomplete); the pieces join into ``decode(ids)``
        except for bytes never completed at the end. Each id is decoded once.
        """
        stream = tokenizers.decoders.DecodeStream(skip_special_tokens=True)
        backend = self.backend
        return lambda token_id: stream.step(backend, int(token_id))

    # ------------------------------------------------------- chat template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_vars: Any,
    ) -> str:
        """Render a conversation with the model's chat template.

        Args:
            messages: ``[{"role": "user", "content": "..."}, ...]``; a content may
                also be OpenAI's list of parts, of type text only
                (``[{"type": "text", "text": "..."}]``), which the template
                gets joined by newlines (``text_messages``).
            add_generation_prompt: end with the header of an assistant turn.
            template_vars: extra template variables (e.g. ``tools=[...]``);
                ``tools`` and ``documents`` default to None, as in HuggingFace.

        Returns: the prompt text; encode it with ``encode(text)`` (the template
        already writes any special tokens it wants).

        Raises:
            ChatTemplateError: the template does not compile, fails, runs over
                its time or size limits (``chat_template.py``), or a message's
                content is neither text nor parts of type text.
            ModelLoadError: the model has no chat template.
        """
        template = self._compiled_template()
        variables = {"tools": None, "documents": None, **self._special_token_vars()}
        variables.update(template_vars)
        variables.update(messages=text_messages(messages), add_generation_prompt=add_generation_prompt)
        return render(template, variables, self.source)

    def chat_turn_end_token(self) -> str | None:
        """The special token the chat template writes right after an assistant reply.

        E.g. ``<|im_end|>`` for ChatML templates, ``<|eot_id|>`` for Llama 3.
        Found by rendering ``[user, assistant]`` with a probe reply and
        reading the longest special token that follows it (after whitespace).
        None when there is no template, rendering fails, or no special token
        follows the reply.
        """
        if self.chat_template is None:
            return None
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": _TURN_END_PROBE},
        ]
        try:
            text = self.apply_chat_template(messages, add_generation_prompt=False)
        except ChatTemplateError:  # a template may reject the probe; then there is no answer
            return None
        _, found, after = text.partition(_TURN_END_PROBE)
        if not found:
            return None
        return self._leading_special_token(after.lstrip())

    # ------------------------------------------------------------- helpers

    def _leading_special_token(self, text: str) -> str | None:
        """Longest special token that ``text`` starts with, or None."""
        added = self.backend.get_added_tokens_decoder().values()
        matches = [t.content for t in added if t.special and text.startswith(t.content)]
        return max(matches, key=len, default=None)

    def _special_token_vars(self) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` template variables (only those set)."""
        pairs = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        return {name: value for name, value in pairs.items() if value is not None}

    def _compiled_template(self) -> jinja2.Template:
        """The chat template, compiled on first use (again if it was replaced)."""
        if self.chat_template is None:
            raise ModelLoadError(f"{self.source} has no chat template")
        if self._compiled is None or self._compiled[0] != self.chat_template:
            compiled = compile_template(self.chat_template, self.source)
            self._compiled = (self.chat_template, compiled)
        return self._compiled[1]
