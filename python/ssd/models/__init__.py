"""Model loading: HuggingFace directories and GGUF files -> ``LoadedModel``.

    from ssd.models import load
    model = load("path/to/model_dir_or_file.gguf", device="cpu", dtype=torch.bfloat16)
    model.config, model.weights["model.norm.weight"], model.require_tokenizer()

Checkpoints are read by the C++ loader and weights checked by its rules
(``ssd._C``, imported on the first ``load``, not on ``import ssd.models``).
"""
from .config import ModelConfig, RopeScaling
from .errors import ChatTemplateError, ModelLoadError
from .loaded import LoadedModel
from .loader import load, load_tokenizer
from .tokenizer import Tokenizer

__all__ = [
    "ChatTemplateError",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "RopeScaling",
    "Tokenizer",
    "load",
    "load_tokenizer",
]
