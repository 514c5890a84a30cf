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


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used (from /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class ForeignLoad:
    """Measures how much CPU *other* processes used while the block ran.

    fraction = (machine busy CPU-s - this process's CPU-s - excluded CPU-s) / (wall-s * logical CPUs).
    A few percent is noise; tens of percent mean the numbers are contended. `exclude_pids` are
    processes the benchmark started on purpose (a competing busy process): their share is
    reported apart, as excluded_fraction. With `own_children`, the CPU time of this process's
    waited-for children (a peer's binary it ran) counts as its own, and so does that of
    `own_pids` (running processes it started: tensor-parallel workers).
    """

    fraction: float | None = None
    excluded_fraction: float | None = None

    def __init__(self, exclude_pids: tuple[int, ...] | list[int] = (), own_children: bool = False,
                 own_pids: tuple[int, ...] | list[int] = ()):
        self.exclude_pids = tuple(exclude_pids)
        self.own_children = own_children
        self.own_pids = tuple(own_pids)

    def _own_seconds(self) -> float:
        seconds = time.process_time() + sum(process_cpu_seconds(pid) or 0.0 for pid in self.own_pids)
        if not self.own_children:
            return seconds
        t = os.times()
        return seconds + t.children_user + t.children_system

    def _excluded_seconds(self) -> float | None:
        seconds = [process_cpu_seconds(pid) for pid in self.exclude_pids]
        return None if None in seconds else sum(seconds)

    def __enter__(self):
        self.busy0, self.own0, self.wall0 = machine_busy_seconds(), self._own_seconds(), time.perf_counter()
        self.excluded0 = self._excluded_seconds()
        return self

    def __exit__(self, *exc):
        busy1, own1, wall1 = machine_busy_seconds(), self._own_seconds(), time.perf_counter()
        excluded1 = self._excluded_seconds()
        cpu_seconds = (wall1 - self.wall0) * (os.cpu_count() or 1)
        if self.busy0 is None or busy1 is None or self.excluded0 is None or excluded1 is None:
            self.fraction = self.excluded_fraction = None
        else:
            excluded = excluded1 - self.excluded0
            other = (busy1 - self.busy0) - (own1 - self.own0) - excluded
            self.fraction = max(0.0, other / cpu_seconds)
            self.excluded_fraction = excluded / cpu_seconds


def wait_idle(max_wait: float, probe: float = 1.0, exclude_pids: tuple[int, ...] = ()) -> bool:
    """Waits up to max_wait s until other processes (but `exclude_pids`) use under CONTENDED of the
    CPUs for `probe` s."""
    deadline = time.monotonic() + max_wait
    while True:
        with ForeignLoad(exclude_pids) as load:
            time.sleep(probe)
        if load.fraction is None or load.fraction < CONTENDED:
            return True
        if time.monotonic() >= deadline:
            return False
