"""User-facing configuration: ``EngineConfig`` and ``SamplingParams``.

Both mirror C++ structs (``csrc/include/ssd/config.h``) field by field and are
validated by the C++ core, the one place the rules live; a violation raises
``ValueError`` naming the field. Validation loads the extension on first use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def _core():
    from ssd import _C  # imported lazily: `import ssd` stays light

    return _C


@dataclass
class EngineConfig:
    """Engine settings (one config for every mode).

    max_model_len: prompt + generated tokens per request.
    max_batch: sequences per step; max_batched_tokens: tokens per forward
    (longer prompts are prefilled in chunks). kv_capacity_tokens: KV cache
    size in tokens (0: max_batch * max_model_len). dtype: weight storage,
    "float32" or "bfloat16" (activations and the KV cache are float32).
    """

    mode: str = "ar"
    max_model_len: int = 2048
    max_batch: int = 32
    max_batched_tokens: int = 2048
    kv_block_size: int = 16
    kv_capacity_tokens: int = 0
    dtype: str = "float32"
    target_device: str = "cpu"
    target_threads: int = 1
    draft_device: str = "cpu"
    draft_threads: int = 1
    k: int = 4

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{f.name}: must be an integer, got {value!r}")
            if f.type == "str" and not isinstance(value, str):
                raise ValueError(f"{f.name}: must be a string, got {value!r}")
        _core().validate_engine_config(self.to_dict())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    Logits are processed as temperature, then top-k, then top-p (ties at a cut
    keep the lowest token ids). temperature 0 is greedy. top_k 0 (or -1) and
    top_p 1 disable those filters. stop: strings that end the request (the
    text is cut before the stop string); stop_token_ids: token ids that end it
    (kept in token_ids). seed keys the request's random streams: the same seed
    gives the same output whatever else runs in the batch.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{name}: must be a number, got {value!r}")
        for name in ("top_k", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: must be an integer, got {value!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed: must be an integer in [0, 2**64), got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: every stop string must be a non-empty string, got {s!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise ValueError(f"stop_token_ids: must be integers, got {t!r}")
        _core().validate_sampling_params(self.core_dict())

    def core_dict(self) -> dict:
        """The fields the C++ core reads (stop strings are handled in Python)."""
        d = dataclasses.asdict(self)
        d.pop("stop")
        return d
