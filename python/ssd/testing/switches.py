"""``TestingConfig``: the engine's test-only switches.

They reach the engine only through ``LLM(..., testing=TestingConfig(...))``:
never through the environment and never through ``EngineConfig``, so no user
setting can turn one on by accident. Each one changes the engine on purpose.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class TestingConfig:
    """always_miss: in mode ssd every speculation-cache lookup misses and no
    trees are built (every round after the first is a fallback's).
    fault_fast_argmax: deliberately WRONG: one-hot (fast fallback) proposals
    are verified greedily at any temperature, which breaks the output law; the
    law tests use it to show that they can fail.
    """

    __test__ = False  # not a pytest test class despite its name

    always_miss: bool = False
    fault_fast_argmax: bool = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"testing.{f.name}: must be True or False, got {getattr(self, f.name)!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
