"""Model loading: HuggingFace directories and GGUF files -> ``LoadedModel``.

    from ssd.models import load
    model = load("path/to/model_dir_or_file.gguf", device="cpu", dtype=torch.bfloat16)
    model.config, model.weights["model.norm.weight"], model.require_tokenizer()

Nothing here depends on the C++ extension.
"""
from .config import ModelConfig, RopeScaling
from .errors import ChatTemplateError, ModelLoadError
from .loaded import LoadedModel
from .loader import load
from .tokenizer import Tokenizer

__all__ = [
    "ChatTemplateError",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "RopeScaling",
    "Tokenizer",
    "load",
]
