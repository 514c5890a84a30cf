"""Fake devices for the placement and KV budget checks, so they are tested without a GPU.

``FakeDevices`` stands in for the machine in ``EngineConfig``'s validation and
resolution (``TestingConfig(fake_devices=...)``); ``resolve_engine_config``
runs that resolution for given model configs, as the engine does once the
weights are loaded, and returns what it filled in.
"""
from __future__ import annotations

from dataclasses import dataclass

_GIB = 2**30


@dataclass(frozen=True)
class FakeDevices:
    """cuda: (free_bytes, total_bytes) of cuda:0, cuda:1, ...; its length is the
    number of GPUs (empty: none). host_bytes: the CPU's memory."""

    cuda: tuple[tuple[int, int], ...] = ()
    host_bytes: int = 64 * _GIB

    def __post_init__(self):
        cuda = tuple(tuple(d) for d in self.cuda)
        for d in cuda:
            if len(d) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in d) \
                    or d[0] > d[1]:
                raise ValueError(f"fake_devices.cuda: every device is (free_bytes, total_bytes) with "
                                 f"0 <= free <= total, got {d!r}")
        object.__setattr__(self, "cuda", cuda)
        if not isinstance(self.host_bytes, int) or isinstance(self.host_bytes, bool) or self.host_bytes < 0:
            raise ValueError(f"fake_devices.host_bytes: must be an integer >= 0, got {self.host_bytes!r}")

    def to_dict(self) -> dict:
        return {"cuda": [list(d) for d in self.cuda], "host_bytes": self.host_bytes}


def resolve_engine_config(target, draft=None, *, testing=None, **fields) -> dict:
    """EngineConfig's checks and automatic fields for these models, against
    ``testing.fake_devices`` (when set) instead of this machine's devices.

    target / draft: ``ssd.models.ModelConfig``; fields: EngineConfig's (the
    device fields may name GPUs this machine lacks). Returns the resolved
    {max_model_len, kv_capacity_tokens}, or raises the ValueError naming the
    field that the engine would raise.
    """
    from ssd import _C
    from ssd.config import EngineConfig
    from ssd.testing.switches import TestingConfig

    # EngineConfig's own checks see a CPU placement; the core's see the given one.
    devices = {name: fields.pop(name) for name in ("target_device", "draft_device") if name in fields}
    config = EngineConfig(**fields).to_dict() | devices
    testing = testing if testing is not None else TestingConfig()
    return _C.testing.resolve_engine_config(config, target.to_dict(), None if draft is None else draft.to_dict(),
                                            testing.to_dict())
