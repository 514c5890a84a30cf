"""How busy other processes keep the CPUs: a timed run on a shared machine is only as good as its quiet.

Read from /proc/stat (Linux); elsewhere the fractions are None and nothing waits.
"""
from __future__ import annotations

import os
import time

# Other processes' CPU share above which a measurement is reported as contended.
CONTENDED = 0.10


def machine_busy_seconds() -> float | None:
    """CPU seconds spent busy by all processes on the machine (from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """Measures how much CPU *other* processes used while the block ran.

    fraction = (machine busy CPU-s - this process's CPU-s) / (wall-s * logical CPUs).
    A few percent is noise; tens of percent mean the numbers are contended.
    """

    fraction: float | None = None

    def __enter__(self):
        self.busy0, self.own0, self.wall0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy1, own1, wall1 = machine_busy_seconds(), time.process_time(), time.perf_counter()
        if self.busy0 is None or busy1 is None:
            self.fraction = None
        else:
            other = (busy1 - self.busy0) - (own1 - self.own0)
            self.fraction = max(0.0, other / ((wall1 - self.wall0) * (os.cpu_count() or 1)))


def wait_idle(max_wait: float, probe: float = 1.0) -> bool:
    """Waits up to max_wait s until other processes use under CONTENDED of the CPUs for `probe` s."""
    deadline = time.monotonic() + max_wait
    while True:
        with ForeignLoad() as load:
            time.sleep(probe)
        if load.fraction is None or load.fraction < CONTENDED:
            return True
        if time.monotonic() >= deadline:
            return False
