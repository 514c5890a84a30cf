"""Chat templates: compiled and rendered in a bounded jinja2 sandbox.

The environment is shaped like HuggingFace's ``apply_chat_template``
(``raise_exception``, ``strftime_now``, a non-escaping ``tojson``,
``{% generation %}``, loop controls). A template comes from a model's files,
which may be hostile or corrupt, so on top of jinja2's sandbox (no attribute
access to internals, no mutation of values) a render is bounded:

* in time: compiling and rendering stop after ``RENDER_SECONDS`` (a template
  renders in milliseconds; more is a runaway loop);
* in size: no single operation may build a string, list or integer beyond
  ``MAX_SIZE`` items (``MAX_INT_BITS`` bits) -- repetition, concatenation
  (``+``, ``~``), powers, ``%`` formatting, string methods and the filters
  that grow their input -- so that doubling a string in a loop fails instead
  of exhausting memory.

Every failure is a ``ChatTemplateError``.
"""
from __future__ import annotations

import datetime
import functools
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from .errors import ChatTemplateError

RENDER_SECONDS = 2.0
MAX_SIZE = 1 << 24  # characters or items
MAX_INT_BITS = 1 << 14


class _TimeUp(BaseException):
    """Raised into the template's frames when the deadline passes.

    A BaseException, so that no ``except Exception`` inside jinja2 swallows it.
    """


class _Deadline:
    """Context manager: the current thread's Python code raises ``_TimeUp`` after ``seconds``.

    A trace function sees every Python call, and every line of the template's
    own compiled code (its loops); it checks the clock every 256 events. Lines
    elsewhere (jinja2's runtime, filters) are not traced: that would slow a
    render several times over, and their loops call functions, which are seen.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> _Deadline:
        self.end = time.monotonic() + self.seconds
        self.events = 0
        self.previous = sys.gettrace()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        sys.settrace(self.previous)

    def _trace(self, frame: Any, event: str, arg: Any) -> Callable | None:
        self.events += 1
        if self.events % 256 == 0 and time.monotonic() > self.end:
            raise _TimeUp
        return self._trace if frame.f_code.co_filename == "<template>" else None


def _too_large(what: str) -> jinja2.sandbox.SecurityError:
    return jinja2.sandbox.SecurityError(f"{what} would exceed the chat template size limit ({MAX_SIZE} items)")


def _size(value: Any) -> int:
    """Items in a string or sequence; an int's bits scaled so that MAX_INT_BITS counts as MAX_SIZE."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value.bit_length() * MAX_SIZE // MAX_INT_BITS
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _checked(value: Any, what: str) -> Any:
    if _size(value) > MAX_SIZE:
        raise _too_large(what)
    return value


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Reject ``left operator right`` before computing a result beyond the limits."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and abs(left) > 1 and right > 0:
        if right > MAX_INT_BITS or right * left.bit_length() > MAX_INT_BITS:
            raise _too_large("a power")
    elif operator == "*":
        if ints:
            bits = left.bit_length() + right.bit_length()
            if bits > MAX_INT_BITS:
                raise _too_large("a product")
        elif isinstance(right, int) and right > 0 and _size(left) * right > MAX_SIZE:
            raise _too_large("a repetition")
        elif isinstance(left, int) and left > 0 and _size(right) * left > MAX_SIZE:
            raise _too_large("a repetition")
    elif operator == "+" and not ints and _size(left) + _size(right) > MAX_SIZE:
        raise _too_large("a concatenation")
    elif operator == "%" and isinstance(left, str):
        _check_printf(left)


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_printf(fmt: str) -> None:
    """Reject printf-style widths and precisions beyond the limits (``'%999999999d' % 1``)."""
    for width, precision in _PRINTF_SPEC.findall(fmt):
        for n in (width, precision):
            if n == "*" or (n and int(n) > MAX_SIZE):
                raise _too_large("a formatted field")


_FORMAT_FIELD = re.compile(r"\{[^{}]*:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")
_FORMAT_NESTED = re.compile(r"\{\{|\{[^{}:]*\}")  # escaped braces and plain fields


def _check_format(fmt: str) -> None:
    """Reject str.format widths beyond the limits (``'{:>999999999}'``)."""
    for width, precision in _FORMAT_FIELD.findall(fmt):
        if int(width) > MAX_SIZE or (precision and int(precision) > MAX_SIZE):
            raise _too_large("a formatted field")


def _check_str_method(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """``args``, after rejecting a call of a str method whose result would exceed the limits.

    The items ``str.join`` gets from a generator are collected into a list first, to count them.
    """
    name, text = getattr(obj, "__name__", ""), getattr(obj, "__self__", None)
    if not isinstance(text, str):
        return args
    if name == "join" and args and not isinstance(args[0], Sized):
        args = (list(args[0]), *args[1:])
    values = [*args, *kwargs.values()]
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if name in ("center", "ljust", "rjust", "zfill") and any(n > MAX_SIZE for n in numbers):
        raise _too_large(f"str.{name}")
    if name == "expandtabs" and numbers and numbers[0] * text.count("\t") + len(text) > MAX_SIZE:
        raise _too_large("str.expandtabs")
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_replace(text, args[0], args[1])
    if name == "join" and args:
        _check_join(text, args[0])
    return args


def _check_replace(text: str, old: str, new: str) -> None:
    occurrences = len(text) + 1 if not old else text.count(old)
    if len(text) + occurrences * len(new) > MAX_SIZE:
        raise _too_large("a replacement")


def _check_join(separator: str, items: Any) -> None:
    if isinstance(items, Sized) and len(separator) * len(items) > MAX_SIZE:
        raise _too_large("a join")


def _bounded_filter(name: str, fn: Callable) -> Callable:
    """``fn`` (a jinja2 filter) with its arguments checked before and its result after."""

    first = 1 if hasattr(fn, "jinja_pass_arg") else 0  # then args[0] is jinja2's context or environment

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if name == "join" and len(args) > first and not isinstance(args[first], Sized):
            args = (*args[:first], list(args[first]), *args[first + 1:])  # a generator: count it first
        values = [*args[first:], *kwargs.values()]
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if name in ("center", "indent", "batch", "slice", "wordwrap", "truncate") and any(
                abs(n) > MAX_SIZE for n in numbers):
            raise _too_large(f"the {name} filter")
        if name == "indent" and any(isinstance(v, str) and len(v) > 1 for v in values[1:]):
            text = values[0] if values and isinstance(values[0], str) else ""
            if (text.count("\n") + 1) * max(len(v) for v in values[1:] if isinstance(v, str)) > MAX_SIZE:
                raise _too_large("the indent filter")
        if name == "replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
            _check_replace(*values[:3])
        if name == "join" and len(values) >= 2 and isinstance(values[1], str):
            _check_join(values[1], values[0])
        if name == "format" and values and isinstance(values[0], str):
            _check_printf(values[0])
        return _checked(fn(*args, **kwargs), f"the {name} filter")

    return checked


def _checked_join(parts: Iterable[str]) -> str:
    """``"".join(parts)``, rejected before joining when the result would exceed the limits."""
    parts = list(parts)
    if sum(len(p) for p in parts) > MAX_SIZE:
        raise _too_large("the text of a block, macro or template")
    return "".join(parts)


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiled templates whose string building is size-checked.

    jinja2 compiles ``a ~ b`` to a plain join, and the text of ``{% set %}``
    blocks, macros and ``caller()`` to ``concat(buffer)``; the first goes
    through ``checked_concat``, the module-level ``concat`` is rebound to a
    checked join.
    """

    def visit_Template(self, node: jinja2.nodes.Template, frame: Any = None) -> None:
        super().visit_Template(node, frame)
        self.writeline("concat = environment.checked_join")

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.checked_concat(")
        super().visit_Concat(node, frame)
        self.write(")")


class _Environment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """HuggingFace's chat-template environment, bounded in the sizes it builds."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
                         finalize=lambda value: _checked(value, "an output"))
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self.filters["tojson"] = _bounded_filter("tojson", _tojson)
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        args = _check_str_method(__obj, args, kwargs)
        return _checked(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        _check_format(value.__self__)
        nested = "{" in _FORMAT_NESTED.sub("", value.__self__)  # a width taken from the arguments

        def checked(*args: Any, **kwargs: Any) -> str:
            if nested and any(isinstance(v, int) and v > MAX_SIZE for v in [*args, *kwargs.values()]):
                raise _too_large("a formatted field")
            return _checked(wrapper(*args, **kwargs), "a formatted string")

        return checked

    @staticmethod
    def checked_concat(text: str) -> str:
        return _checked(text, "a concatenation")

    checked_join = staticmethod(_checked_join)
    concat = staticmethod(_checked_join)  # joins the output of render()


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: HF's marker around assistant text.

    HuggingFace uses it to build assistant masks; here it renders its body unchanged.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    """Template helper: abort rendering with ``message``."""
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    """Template helper: the current local time formatted with ``fmt``."""
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Template filter: JSON without jinja2's HTML escaping (as HF templates expect)."""
    if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
        raise jinja2.sandbox.SecurityError("tojson: indent beyond 64")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def compile_template(template: str, source: str) -> jinja2.Template:
    """``template`` compiled in the bounded environment; ChatTemplateError when it does not compile."""
    try:
        with _Deadline(RENDER_SECONDS):
            return _Environment().from_string(template)
    except _TimeUp:
        raise ChatTemplateError(f"chat template of {source} does not compile within "
                                f"{RENDER_SECONDS:g} s") from None
    except Exception as exc:  # syntax errors, and what jinja2 or Python's compiler raise on odd input
        raise ChatTemplateError(f"chat template of {source} does not compile: {exc}") from exc


def render(template: jinja2.Template, variables: dict[str, Any], source: str) -> str:
    """``template`` rendered with ``variables``; ChatTemplateError for any failure."""
    try:
        with _Deadline(RENDER_SECONDS):
            return template.render(**variables)
    except _TimeUp:
        raise ChatTemplateError(f"chat template of {source} did not finish within "
                                f"{RENDER_SECONDS:g} s") from None
    except Exception as exc:  # raise_exception(), bad messages, template bugs, the limits above
        raise ChatTemplateError(f"chat template of {source} failed: {exc}") from exc


def text_messages(messages: Any) -> list[Any]:
    """The messages a template renders: each content given as OpenAI's list of
    parts (``[{"type": "text", "text": "..."}, ...]``) becomes its texts joined by
    newlines (as vLLM joins them); a string, None or a non-list content is left to
    the template. ChatTemplateError names a part that is not text:
    ``messages[0].content[1]: ...``."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            message = {**message, "content": "\n".join(_part_text(part, f"messages[{i}].content[{j}]")
                                                        for j, part in enumerate(content))}
        out.append(message)
    return out


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise ChatTemplateError(f"{where}: a content part must be an object with a type, got {type(part).__name__}")
    kind = part.get("type")
    if kind != "text":
        raise ChatTemplateError(f"{where}.type: content parts of type {kind!r} are not supported (only 'text')")
    text = part.get("text")
    if not isinstance(text, str):
        raise ChatTemplateError(f"{where}.text: a text part needs a string text, got {type(text).__name__}")
    return text
