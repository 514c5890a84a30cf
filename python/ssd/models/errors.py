"""Exceptions raised by the model-loading layer."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model path, file or setting that cannot be loaded.

    Every message names the problem and the path it concerns, so it can be
    shown to a user as is.
    """


class ChatTemplateError(ValueError):
    """A chat template failed to render (bad template or bad messages)."""
