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

    Speculative modes: k draft tokens per round. ssd (SAGUARO): fanout is
    "confidence" (a greedy sequence's tree holds the B outcomes most likely
    by the draft's probabilities, its acceptance calibrated online per
    probability decile; sampled sequences use "geometric"), "geometric"
    (F_0..F_K from online estimates of the acceptance rate and the miss
    exponent) or an explicit list of k + 1 counts; fanout_budget is
    B = sum F_j, "auto" (sized so the draft's tree fits inside one verify
    forward, from measured times) or an integer; saguaro_c is the C of
    SAGUARO sampling (1.0: plain sampling); fallback on a cache miss is
    "neural" (the draft re-drafts), "fast" (n-gram prompt lookup) or "auto"
    (by batch size, where the speed model says fast beats neural).
    draft_matmul_min_rows:
    draft forwards over at least this many rows (the ssd tree, sd batches)
    use bf16 pair kernels (AVX512-BF16, many rows cost about one); the draft's
    numerics never change the output law. 0 turns that off.
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
    fanout: str | list[int] = "confidence"
    fanout_budget: str | int = "auto"
    saguaro_c: float = 1.0
    fallback: str = "auto"
    draft_matmul_min_rows: int = 4

    def __post_init__(self):
        if isinstance(self.fanout, str):
            if self.fanout not in ("geometric", "confidence"):
                raise ValueError("fanout: must be 'geometric', 'confidence' or a list of k + 1 integers, "
                                 f"got {self.fanout!r}")
        elif isinstance(self.fanout, (list, tuple)) and all(
                isinstance(f, int) and not isinstance(f, bool) for f in self.fanout):
            self.fanout = list(self.fanout)
        else:
            raise ValueError("fanout: must be 'geometric', 'confidence' or a list of k + 1 integers, "
                             f"got {self.fanout!r}")
        if self.fanout_budget != "auto" and (not isinstance(self.fanout_budget, int)
                                             or isinstance(self.fanout_budget, bool) or self.fanout_budget < 1):
            raise ValueError(f"fanout_budget: must be 'auto' or an integer >= 1, got {self.fanout_budget!r}")
        if not isinstance(self.saguaro_c, (int, float)) or isinstance(self.saguaro_c, bool):
            raise ValueError(f"saguaro_c: must be a number in [0, 1], got {self.saguaro_c!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{f.name}: must be an integer, got {value!r}")
            if f.type == "str" and not isinstance(value, str):
                raise ValueError(f"{f.name}: must be a string, got {value!r}")
        _core().validate_engine_config(self.to_dict())

    def to_dict(self) -> dict:
        """The fields as the C++ core reads them."""
        d = dataclasses.asdict(self)
        fanout = d.pop("fanout")
        d["fanout_list"] = [] if isinstance(fanout, str) else fanout
        d["fanout_mode"] = fanout if isinstance(fanout, str) else "geometric"
        d["fanout_budget"] = 0 if d["fanout_budget"] == "auto" else d["fanout_budget"]
        d["saguaro_c"] = float(d["saguaro_c"])
        return d


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
