"""``LoadedModel``: what every loader returns."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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
        formats: names of the matrices held in a GGUF block format -> that
            format (``quantized.FORMATS``); each such weight is its GGUF rows,
            uint8 ``[n, row_bytes]``.
    """

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: str | None
    source: str
    name: str
    formats: dict[str, str] = field(default_factory=dict)

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or ModelLoadError when the model has none."""
        if self.tokenizer is None:
            raise ModelLoadError(
                f"model at {self.source} has no tokenizer files (tokenizer.json); "
                "pass token ids instead"
            )
        return self.tokenizer

    def core_model(self, device: str = "cpu", backend: str = "auto", batch_invariant: bool = True,
                   int8_activations: bool = True, tensor_parallel=None, cuda_graphs: bool = True,
                   draft_sm_share: float = 0.0):
        """The C++ model (``ssd._C.Model``) built from these weights, cached per placement.

        device: "cpu", "cuda" or "cuda:N". backend: "auto" (the device's own
        kernels) or "aten" (the reference backend over ATen ops). batch_invariant:
        False lets the cuda backend use stock cuBLAS products (faster; greedy sd
        is then not token-identical to ar). int8_activations: the matrices held
        in blocks (``formats``) multiply int8 activations (the default, faster)
        or fp32 ones (exactly the model of the dequantised weights).
        tensor_parallel: None, or ``(rank, size, all_gather, broadcast)``: that rank's
        shard of a tensor-parallel group (``ssd.distributed``). cuda_graphs: the
        cuda backend replays a CUDA graph per padded forward shape (the same
        logits; ``EngineConfig.cuda_graphs``). draft_sm_share: the cuda backend
        runs the draft role's kernels on that share of the SMs
        (``EngineConfig.draft_sm_share``). Raises
        ValueError naming a device this build or machine cannot use.
        """
        cores = self.__dict__.setdefault("_cores", {})
        tp_key = None if tensor_parallel is None else (tensor_parallel[0], tensor_parallel[1], id(tensor_parallel[2]))
        key = (device, backend, bool(batch_invariant), bool(int8_activations), tp_key, bool(cuda_graphs),
               float(draft_sm_share))
        core = cores.get(key)
        if core is None:
            from .core import build_core_model

            self.drop_vocab_padding()
            core = build_core_model(self.config, self.weights, device=device, backend=backend,
                                    batch_invariant=batch_invariant, formats=self.formats,
                                    int8_activations=int8_activations, tensor_parallel=tensor_parallel,
                                    cuda_graphs=cuda_graphs, draft_sm_share=draft_sm_share)
            cores[key] = core
        return core

    def drop_vocab_padding(self) -> None:
        """Cuts the logit rows past the tokenizer: the one rule for every engine and mode.

        A checkpoint may have more embedding and ``lm_head`` rows than its
        tokenizer has ids (rows padded to a round number: Qwen2.5-0.5B has
        151936, Qwen2.5-7B 152064, their tokenizer 151665 ids). When the
        tokenizer's ids (added tokens included) are ``n`` < ``config.vocab_size``,
        both matrices keep their first ``n`` rows and ``config.vocab_size``
        becomes ``n``, so no padding id is ever sampled, in ar, sd and ssd
        alike, and a draft and a target sharing one tokenizer have equal
        vocabularies. Called by ``core_model`` before the first core is built;
        a model without a tokenizer, or whose tokenizer covers every row, is
        left as it is.
        """
        n = None if self.tokenizer is None else self.tokenizer.num_ids
        if n is None or n >= self.config.vocab_size:
            return
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in self.weights:
                self.weights[name] = self.weights[name][:n].contiguous()
        self.config.vocab_size = n

    def logits(self, token_ids: list[int], device: str = "cpu", backend: str = "auto",
               int8_activations: bool = True) -> torch.Tensor:
        """Scores a whole sequence through the paged C++ path.

        token_ids: [len] -> logits [len, vocab] (float32, on the host; vocab as
        ``drop_vocab_padding`` leaves it). int8_activations: see ``core_model``.
        """
        from .core import sequence_logits

        return sequence_logits(self.core_model(device, backend, int8_activations=int8_activations), token_ids)

    def __repr__(self) -> str:
        return (f"LoadedModel(name={self.name!r}, architecture={self.config.architecture!r}, "
                f"num_weights={len(self.weights)}, source={self.source!r})")


def end_of_sequence_ids(metadata_ids: Iterable[int | None], tokenizer: Tokenizer | None) -> list[int]:
    """The eos id list; the one rule for every model source.

    In order, duplicates dropped, Nones skipped:

    1. ``metadata_ids``, the ids the checkpoint names: for a HF directory
       generation_config.json's ``eos_token_id`` then config.json's, as the C++
       loader reads them (``csrc/model/checkpoint.h``; ``ssd_generate`` stops
       at these alone, having no tokenizer); for a GGUF file its eos, eot and
       eom ids.
    2. the tokenizer's eos token (tokenizer_config.json's ``eos_token``).
    3. the token that ends an assistant turn in the chat template
       (``<|im_end|>``, ``<|eot_id|>``, ...), so generation stops where the
       template would end the reply even if the metadata names another token.
    """
    ids: list[int] = []
    extra = [] if tokenizer is None else [
        tokenizer.eos_token_id, tokenizer.token_to_id(tokenizer.chat_turn_end_token())]
    for token_id in [*metadata_ids, *extra]:
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))
    return ids
