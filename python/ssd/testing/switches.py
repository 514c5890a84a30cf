"""``TestingConfig``: the engine's test-only switches.

They reach the engine only through ``LLM(..., testing=TestingConfig(...))``:
never through the environment and never through ``EngineConfig``, so no user
setting can turn one on by accident. Each one changes the engine on purpose.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .devices import FakeDevices


@dataclass(frozen=True)
class TestingConfig:
    """always_miss: in mode ssd every speculation-cache lookup misses and no
    trees are built (every round after the first is a fallback's).
    auto_alternate: in mode ssd with fallback "auto", the fast and the neural
    kind answer misses in turn (one draft-worker batch each) instead of as the
    speed model picks from measured times, so every run sees both kinds.

    The fault_* switches are deliberately WRONG, each on one path: they break
    the output law there, and the law tests use them to show that they can fail.
    fault_fast_argmax: one-hot (fast fallback) proposals are verified greedily
    at any temperature (coupling "rejection" only: the Gumbel verification
    never reads q).
    fault_resume_stream: after a preemption, the resumed sequence keys every
    later verification's draws by the length it resumed at (derived once, never
    advanced), so all its rounds repeat one set of draws.
    fault_truncated_q: in mode ssd, a round verifying fewer proposals than its
    speculation holds (max_model_len or KV room cut it) pairs them with the
    speculation's last q rows instead of its first (coupling "rejection" only).
    fault_batch_top_kp: the verifier applies the first verified request's
    top-k and top-p to every later request, as if they were batch-wide.
    fault_worker_dies: in mode ssd the draft worker's thread ends at its first
    verification outcome without answering, as if it had died; the engine must
    end the affected requests with an error instead of waiting forever.
    fault_shared_noise: with coupling "gumbel", the target draws every
    position with the noise of position 0 (shared across positions), so a
    request's tokens are correlated.
    fault_peek_target: each round verifies only its leading proposals that
    the target is sure to accept (p(x) >= q(x) at each, read off that round's
    own target logits), dropping the rest: a lookahead chosen from the
    target's current logits, which the adaptive policy must never do
    (coupling "rejection", temperature > 0).
    forced_lookahead: the adaptive policy's choice forced: round r of a
    request verifies forced_lookahead[(step + request id) % len] proposals
    (clamped to [0, k]; 0 is an autoregressive step; ssd builds trees for
    every round), so lookaheads switch within a request and differ across a
    batch. Empty: the policy (or the fixed mode) decides.
    tree_blocks: in mode ssd the draft KV holds only this many blocks beyond
    the sequences' own (0: room for a full tree of every sequence), so
    speculation trees run out of blocks and stay partial.
    draft_answer_delay_ms: in mode ssd the draft worker waits this many
    milliseconds before answering each batch of verification outcomes, as a
    slow link between the devices would: a wait that no part of the adaptive
    policy's step model measures, only its measured step times show.
    fake_devices: an ``ssd.testing.FakeDevices`` that stands in for this
    machine's devices (how many GPUs, their free memory, the CPU's) in the
    placement and KV budget checks of ``resolve_engine_config``, so those
    are tested without a GPU.
    """

    __test__ = False  # not a pytest test class despite its name

    always_miss: bool = False
    auto_alternate: bool = False
    fault_fast_argmax: bool = False
    fault_resume_stream: bool = False
    fault_truncated_q: bool = False
    fault_batch_top_kp: bool = False
    fault_worker_dies: bool = False
    fault_shared_noise: bool = False
    fault_peek_target: bool = False
    forced_lookahead: tuple[int, ...] = ()
    tree_blocks: int = 0
    draft_answer_delay_ms: int = 0
    fake_devices: FakeDevices | None = None

    def __post_init__(self):
        forced = self.forced_lookahead
        if not isinstance(forced, (list, tuple)) or any(
                not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31 for v in forced):
            raise ValueError("testing.forced_lookahead: must be a sequence of integers in [0, 2**31), "
                             f"got {forced!r}")
        object.__setattr__(self, "forced_lookahead", tuple(forced))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "forced_lookahead":
                continue
            if f.name == "fake_devices":
                if value is not None and not isinstance(value, FakeDevices):
                    raise ValueError(f"testing.fake_devices: expected ssd.testing.FakeDevices, got {value!r}")
                continue
            if f.type == "int":
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                    raise ValueError(f"testing.{f.name}: must be an integer in [0, 2**31), got {value!r}")
            elif not isinstance(value, bool):
                raise ValueError(f"testing.{f.name}: must be True or False, got {value!r}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["forced_lookahead"] = list(self.forced_lookahead)
        d["fake_devices"] = None if self.fake_devices is None else self.fake_devices.to_dict()
        return d
