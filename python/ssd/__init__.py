"""ssd: exact asynchronous speculative decoding with a C++ core.

``import ssd`` is light: the extension (and torch) load on first use of
``LLM``, ``ssd.models`` or a config's validation.
"""
from ssd._torch_check import check_torch as _check_torch

_check_torch()

from ssd.config import EngineConfig, SamplingParams  # noqa: E402

__all__ = ["LLM", "AsyncLLM", "EngineConfig", "SamplingParams", "RequestOutput", "StreamChunk"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("LLM", "RequestOutput", "StreamChunk"):
        from ssd import llm

        return getattr(llm, name)
    if name == "AsyncLLM":
        from ssd.async_llm import AsyncLLM

        return AsyncLLM
    if name == "models":
        import importlib

        return importlib.import_module("ssd.models")
    raise AttributeError(f"module 'ssd' has no attribute {name!r}")
