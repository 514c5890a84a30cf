"""User-facing configuration: ``EngineConfig`` and ``SamplingParams``.

Both mirror C++ structs (``csrc/include/ssd/config.h``) field by field and are
validated by the C++ core, the one place the rules live; a violation raises
``ValueError`` naming the field. Validation loads the extension on first use.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _integer(name: str, value, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    """value as an int in [lo, hi] (numpy integers accepted); ValueError naming the field otherwise.

    Nothing is wrapped or clamped: an integer outside the range is refused.
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is out of range [{lo}, {hi}]")
    return value


def _number(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    return float(value)


def _core():
    from ssd import _C  # imported lazily: `import ssd` stays light

    return _C


@dataclass
class EngineConfig:
    """Engine settings (one config for every mode).

    max_model_len: prompt + generated tokens per request; 0 (the default):
    what the model supports (its max_position_embeddings), lowered with a
    logged warning to what the KV budget holds.
    max_batch: sequences per step; max_batched_tokens: tokens per forward
    (longer prompts are prefilled in chunks). kv_cache_gib: memory of the KV
    caches (target and draft together) in GiB, the engine's memory budget
    (an ssd draft's speculation tree adds its blocks on top); on the CPU it
    is reserved up front but becomes resident only as sequences use it. It
    must fit each device's free memory (the CPU's: its RAM). "auto": on a
    GPU, what the device has free once the weights are loaded, less a margin
    of max(1 GiB, 10 % of its memory), shared by the caches on it; on the
    CPU, 4 GiB.
    kv_capacity_tokens: KV slots per model, overriding kv_cache_gib (0: from
    the budget). dtype: weight storage, "float32" or "bfloat16", a GGUF
    block format for the matrices ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1";
    quantized at load) or "auto" (a GGUF file's matrices stay in their own
    format where ssd has kernels for it, the k-quants q4_k, q5_k and q6_k
    included; see ssd.models.quantized); activations and the KV cache
    are float32. draft_dtype: the draft's ("": dtype's). quant_activations:
    what products with quantized matrices multiply: "int8" (activations
    quantized per 32-value block, as llama.cpp does; the faster) or "float32"
    (exactly the model of the dequantised weights).

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
    coupling (every mode) is how sampled draws are made: "rejection" (the
    draft samples on its own and the target verifies by rejection sampling:
    the target's law, but which sample a seed gives depends on the
    proposals) or "gumbel" (every token is the Gumbel-max draw under noise
    keyed by (seed, position, token), shared by draft and target; a proposal
    is accepted exactly when it is the target's draw, so seeded sd and ssd
    outputs are token-identical to ar's whatever the draft did).
    draft_matmul_min_rows:
    draft forwards over at least this many rows (the ssd tree, sd batches)
    use bf16 pair kernels (AVX512-BF16, many rows cost about one); the draft's
    numerics never change the output law. 0 turns that off; so does a CPU
    without AVX512-BF16, where the fp32 kernels run instead.

    Placement (docs/gpu.md): target_device is "cpu", "cuda" or "cuda:N";
    draft_device (sd and ssd; mode ar refuses anything but "cpu") is "cpu",
    the target's GPU (the draft runs on its own stream) or another GPU, and a
    GPU only when the target is on one. A CUDA device on a machine or build
    without one, or past its last GPU, is a ValueError naming the field.
    batch_invariant: True (the default) keeps every row's logits bitwise
    independent of the batch on CUDA too, which is what makes greedy
    sd token-identical to ar; False lets the CUDA backend use stock cuBLAS
    products (on bf16 activations for bf16 weights) and, for prefills, stock
    bf16 dense attention (flash attention), faster and not token-identical. The CPU is always invariant. cuda_graphs: True (the
    default) lets the CUDA backend pad each forward of up to 512 tokens to a
    batch bucket and replay a CUDA graph captured per bucket shape (one
    launch per step instead of hundreds; with batch_invariant the same
    logits, bit for bit);
    False launches every kernel. Ignored on the CPU. draft_sm_share: with
    the draft on the target's GPU (sd, ssd), 0 (the default) runs the draft's
    kernels on every SM at a lower stream priority than the target's; a value
    in (0, 1) confines them to that share of the SMs (a CUDA green context,
    CUDA 12.5+ drivers), so the target keeps the rest (docs/gpu.md). Any other
    placement with a share > 0 is a ValueError. backend: "auto" (each
    device's own kernels) or "aten" (the reference backend over ATen ops;
    on the CPU it stands in for a device: the target's logits stay in
    tensors and every round runs the device path, which is how that path is
    tested without a GPU). kv_cache_dtype: the KV caches' element type,
    "float32", "bfloat16" (half the bytes and half the attention reads; each
    K / V value is rounded to bf16 as it is written, attention computes in
    fp32) or "auto" (the default): bfloat16 for a cache on a GPU, float32 on
    the CPU. Greedy sd and ssd stay token-identical to ar under either.

    adaptive (sd and ssd; the default True): every step the engine decides,
    per sequence, how many of its k proposals the target verifies (0 makes
    it an autoregressive step) and, in ssd, whether the draft builds trees,
    from the speed model over measured forward times and online acceptance
    and cache-hit estimates, so speculation is turned down where it would
    cost throughput (large batches, text the draft predicts badly). The
    decision uses only what is known before the verify forward, so it never
    changes the output law (nor temperature-0 output). False: every round
    verifies k proposals and ssd always builds trees (the fixed modes).

    tensor_parallel_size: processes the target is split over (its heads and
    MLP rows; docs/architecture.md#tensor-parallelism): ssd.LLM starts ranks
    1.. as worker processes on this machine (gloo), each with target_threads
    threads; rank 0, this process, schedules, samples and runs the draft.
    The target must be a path then (the workers load it too).
    tensor_parallel_timeout_s (default 60): how long a rank waits for the
    others inside a step, and a follower for rank 0 between steps (an idle
    engine pings its followers every quarter of it): over gloo a rank that
    hangs ends every request with an error within this time (one that dies,
    at once), and the engine fails (LLM.failure(); ssd serve exits 1); over
    NCCL, NCCL's watchdog aborts the processes after it.
    tensor_parallel_init: "spawn" (the default: ssd.LLM starts ranks 1.. on
    this machine) or "env": every rank is started by the user, torchrun or
    by hand on each machine, and reads RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT and LOCAL_RANK (rank r runs on target_device's GPU plus
    LOCAL_RANK); on ranks 1.. ``LLM(...)`` follows rank 0 and exits the
    process when rank 0 shuts down (docs/architecture.md#tensor-parallelism).
    On GPUs the ranks talk over NCCL, on CPUs over gloo.
    """

    mode: str = "ar"
    max_model_len: int = 0
    max_batch: int = 32
    max_batched_tokens: int = 2048
    kv_block_size: int = 16
    kv_cache_gib: float | str = 4.0
    kv_capacity_tokens: int = 0
    dtype: str = "float32"
    draft_dtype: str = ""
    quant_activations: str = "int8"
    target_device: str = "cpu"
    target_threads: int = 1
    draft_device: str = "cpu"
    draft_threads: int = 1
    k: int = 4
    fanout: str | list[int] = "confidence"
    fanout_budget: str | int = "auto"
    saguaro_c: float = 1.0
    fallback: str = "auto"
    coupling: str = "gumbel"
    draft_matmul_min_rows: int = 4
    batch_invariant: bool = True
    cuda_graphs: bool = True
    draft_sm_share: float = 0.0
    backend: str = "auto"
    kv_cache_dtype: str = "auto"
    adaptive: bool = True
    tensor_parallel_size: int = 1
    tensor_parallel_timeout_s: float = 60.0
    tensor_parallel_init: str = "spawn"

    def __post_init__(self):
        if isinstance(self.fanout, str):
            if self.fanout not in ("geometric", "confidence"):
                raise ValueError("fanout: must be 'geometric', 'confidence' or a list of k + 1 integers, "
                                 f"got {self.fanout!r}")
        elif isinstance(self.fanout, (list, tuple)) and all(
                isinstance(f, numbers.Integral) and not isinstance(f, bool) for f in self.fanout):
            self.fanout = list(self.fanout)
        else:
            raise ValueError("fanout: must be 'geometric', 'confidence' or a list of k + 1 integers, "
                             f"got {self.fanout!r}")
        if self.fanout_budget != "auto" and (not isinstance(self.fanout_budget, numbers.Integral)
                                             or isinstance(self.fanout_budget, bool) or self.fanout_budget < 1):
            raise ValueError(f"fanout_budget: must be 'auto' or an integer >= 1, got {self.fanout_budget!r}")
        if self.kv_cache_gib != "auto" and not (isinstance(self.kv_cache_gib, numbers.Real)
                                                and not isinstance(self.kv_cache_gib, bool)
                                                and self.kv_cache_gib > 0):
            raise ValueError(f"kv_cache_gib: must be a number of GiB > 0 or 'auto', got {self.kv_cache_gib!r}")
        if not isinstance(self.saguaro_c, numbers.Real) or isinstance(self.saguaro_c, bool):
            raise ValueError(f"saguaro_c: must be a number in [0, 1], got {self.saguaro_c!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                setattr(self, f.name, _integer(f.name, value))
            elif f.type == "float":
                setattr(self, f.name, _number(f.name, value))
            elif f.type == "str" and not isinstance(value, str):
                raise ValueError(f"{f.name}: must be a string, got {value!r}")
            elif f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name}: must be True or False, got {value!r}")
        if isinstance(self.fanout, list):
            self.fanout = [_integer("fanout", v) for v in self.fanout]
        if self.fanout_budget != "auto":
            self.fanout_budget = _integer("fanout_budget", self.fanout_budget)
        if self.kv_cache_gib != "auto":
            self.kv_cache_gib = float(self.kv_cache_gib)
        _core().validate_engine_config(self.to_dict())

    def to_dict(self) -> dict:
        """The fields as the C++ core reads them."""
        d = dataclasses.asdict(self)
        fanout = d.pop("fanout")
        d["fanout_list"] = [] if isinstance(fanout, str) else fanout
        d["fanout_mode"] = fanout if isinstance(fanout, str) else "geometric"
        d["fanout_budget"] = 0 if d["fanout_budget"] == "auto" else d["fanout_budget"]
        d["kv_cache_gib"] = 0.0 if d["kv_cache_gib"] == "auto" else d["kv_cache_gib"]
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
    gives the same output whatever else runs in the batch. logprobs (0-20):
    report each token's log-probability under the distribution it was drawn
    from (after temperature, top-k and top-p: exact, the engine's own) and
    that many of the most likely tokens there (RequestOutput.logprobs).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None

    def __post_init__(self):
        self.temperature = _number("temperature", self.temperature)
        self.top_p = _number("top_p", self.top_p)
        self.top_k = _integer("top_k", self.top_k)
        self.max_tokens = _integer("max_tokens", self.max_tokens)
        if self.top_k == -1:
            self.top_k = 0
        if self.seed is not None:
            self.seed = _integer("seed", self.seed, 0, 2**64 - 1)
        if self.logprobs is not None:
            self.logprobs = _integer("logprobs", self.logprobs, 0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: must be True or False, got {self.ignore_eos!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: every stop string must be a non-empty string, got {s!r}")
            if not s.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in s):
                raise ValueError(f"stop: {s!r} is not valid Unicode (it holds a lone surrogate)")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise ValueError(f"stop_token_ids: must be a list of token ids, got {self.stop_token_ids!r}")
        # Token ids are int32 in the core; the vocabulary bound is checked where the model is known.
        self.stop_token_ids = [_integer("stop_token_ids", t, 0, 2**31 - 1) for t in self.stop_token_ids]
        _core().validate_sampling_params(self.core_dict())

    def core_dict(self) -> dict:
        """The fields the C++ core reads (stop strings are handled in Python)."""
        d = dataclasses.asdict(self)
        d.pop("stop")
        d["logprobs"] = -1 if self.logprobs is None else self.logprobs
        return d


@dataclass(frozen=True)
class ServerLimits:
    """The server's limits and timeouts (``ssd serve --max-body-bytes --header-timeout --body-timeout
    --max-connections``; docs/serving.md).

    max_body_bytes: a request body's size (413 past it). header_timeout_s: from a
    connection's first byte of a request (or its opening) to the end of that
    request's headers (408). body_timeout_s: from the end of the headers to the
    end of the body (408). max_connections: open connections; one past it gets 503
    for its request and is closed.
    """

    max_body_bytes: int = 4 * 2**20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 512

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{f.name}: must be a number > 0, got {value!r}")
