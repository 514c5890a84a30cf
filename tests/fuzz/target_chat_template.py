"""Fuzz target: chat templates, compiled and rendered as ssd does (python/ssd/models/chat_template.py).

Input: the first byte picks the conversation and add_generation_prompt; the
rest is the template (UTF-8, undecodable bytes replaced). The template renders
through ``Tokenizer.apply_chat_template`` and ``chat_turn_end_token`` (what
loading a model runs).

Documented error: ChatTemplateError. Anything else, a hang over 5 s or RSS
over the harness's limit (a template building gigabytes) is a crash.
"""
from __future__ import annotations

from tokenizers import Tokenizer as Backend
from tokenizers import models

from ssd.models import ChatTemplateError, Tokenizer

DOCUMENTED = (ChatTemplateError,)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "sunny", "name": "get_weather"}],
    [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}],
    [],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _tokenizer(template: str) -> Tokenizer:
    backend = Backend(models.BPE())
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|eot_id|>"])
    return Tokenizer(backend, bos_token="<s>", eos_token="</s>", chat_template=template, source="fuzz")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    messages = CONVERSATIONS[data[0] % len(CONVERSATIONS)]
    tokenizer = _tokenizer(data[1:].decode("utf-8", errors="replace"))
    extra = {"tools": TOOLS} if data[0] & 8 else {}
    try:
        tokenizer.apply_chat_template(messages, add_generation_prompt=bool(data[0] & 16), **extra)
    except DOCUMENTED:
        return  # rendering once more could only fail again, after up to another 2 s
    tokenizer.chat_turn_end_token()  # catches ChatTemplateError itself


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}{% set content = '<|start_header_id|>' + m['role'] + "
          "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
TOOLS_TEMPLATE = ("{%- if tools %}{{- '<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
                  "{%- endfor %}{{- '</tools>' }}{%- endif %}{%- set ns = namespace(multi_step_tool=true, "
                  "last_query_index=messages|length - 1) %}{%- for message in messages %}"
                  "{%- if message.content is string %}{%- set content = message.content %}{%- else %}"
                  "{%- set content = '' %}{%- endif %}{%- if message.tool_calls %}{%- for tool_call in "
                  "message.tool_calls %}{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.function.name }}"
                  "{{- '\", \"arguments\": ' }}{{- tool_call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
                  "{%- endfor %}{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + "
                  "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MISC = ("{% macro render(m) %}{{ m.role|upper }}: {{ m.content|default('', true)|string|replace('\\n', ' ') }}"
        "{% endmacro %}{% for m in messages|selectattr('role', 'ne', 'tool') %}{{ render(m) }}"
        "{% if not loop.last %}\\n{% endif %}{% else %}{{ raise_exception('no messages') }}{% endfor %}"
        "{{ strftime_now('%Y') if false }}{% generation %}{{ '%s-%d'|format('x', 3) }}{% endgeneration %}"
        "{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i ~ ',' }}{% endfor %}"
        "{{ messages|map(attribute='role')|join(',') }}{{ (messages|length * 2) ** 2 }}")


def seeds() -> list[bytes]:
    return [bytes([i * 9]) + t.encode() for i, t in enumerate([CHATML, LLAMA3, TOOLS_TEMPLATE, MISC])]


DICTIONARY = ["{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", " for ", " in ", " endfor ", " if ", " else ",
              " endif ", " set ", " endset ", " macro ", " endmacro ", " call ", " filter ", " endfilter ", "namespace(",
              "range(", "loop.", "caller()", "messages", "message", "tools", "|tojson", "|join(", "|replace(",
              "|center(", "|indent(", "|format(", "|batch(", "|slice(", "|list", "|string", "|length", "|map(", "~",
              " * ", " ** ", " + ", " % ", ".format(", ".ljust(", ".join(", ".replace(", ".expandtabs(", "9999999999",
              "raise_exception(", "strftime_now(", "lipsum(", "cycler(", "joiner(", "{% generation %}", "recursive",
              "loop(", "self.", "__class__", "attr(", "|attr('__init__')", "{% include ", "{% extends ", "{% import "]
