"""``LoadedModel``: what every loader returns."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .config import ModelConfig
from .errors import ModelLoadError
from .tokenizer import Tokenizer


@dataclass
class LoadedModel:
    """A model's config, weights and tokenizer, ready for the engine.

    Attributes:
        config: architecture hyper-parameters.
        weights: HuggingFace parameter name -> tensor, each contiguous in the
            requested dtype on the requested device (see ``weights.expected_shapes``
            for names and shapes; ``lm_head.weight`` is absent when tied).
        tokenizer: the model's tokenizer, or None when it ships none.
        eos_token_ids: ids that end generation (see ``end_of_sequence_ids``).
        bos_token_id: id of the beginning-of-sequence token, or None.
        chat_template: jinja2 chat template, or None.
        source: the path the model was loaded from.
        name: short display name (directory name or GGUF file stem).
    """

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: str | None
    source: str
    name: str

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or ModelLoadError when the model has none."""
        if self.tokenizer is None:
            raise ModelLoadError(
                f"model at {self.source} has no tokenizer files (tokenizer.json); "
                "pass token ids instead"
            )
        return self.tokenizer

    def core_model(self):
        """The C++ model (``ssd._C.Model``) built from these weights, cached."""
        core = self.__dict__.get("_core")
        if core is None:
            from .core import build_core_model

            core = build_core_model(self.config, self.weights)
            self.__dict__["_core"] = core
        return core

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """Scores a whole sequence through the paged C++ path.

        token_ids: [len] -> logits [len, vocab] (float32).
        """
        from .core import sequence_logits

        return sequence_logits(self.core_model(), token_ids)

    def __repr__(self) -> str:
        return (f"LoadedModel(name={self.name!r}, architecture={self.config.architecture!r}, "
                f"num_weights={len(self.weights)}, source={self.source!r})")


def end_of_sequence_ids(*groups: int | Iterable[int | None] | None,
                        tokenizer: Tokenizer | None = None) -> list[int]:
    """The eos id list: every id given, then the chat turn-end token's id.

    Each group is an id, a list of ids, or None (skipped). Ids keep the order
    of first appearance; duplicates are dropped. When the tokenizer's chat
    template ends an assistant turn with a special token (``<|im_end|>``,
    ``<|eot_id|>``, ...), that token's id is appended, so generation stops
    where the template would end the reply even if the metadata names another
    eos token.
    """
    ids: list[int] = []
    for group in groups:
        for token_id in _as_id_list(group):
            if token_id not in ids:
                ids.append(token_id)
    if tokenizer is not None:
        turn_end = tokenizer.token_to_id(tokenizer.chat_turn_end_token())
        if turn_end is not None and turn_end not in ids:
            ids.append(turn_end)
    return ids


def _as_id_list(group: int | Iterable[int | None] | None) -> list[int]:
    """``None`` -> ``[]``, ``5`` -> ``[5]``, ``[5, None, 7]`` -> ``[5, 7]``."""
    if group is None:
        return []
    if isinstance(group, int):
        return [group]
    return [int(i) for i in group if i is not None]
