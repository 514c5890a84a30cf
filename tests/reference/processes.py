"""Helpers for tests that start processes: waiting for them to be gone, and finding tensor-parallel workers."""
from __future__ import annotations

import socket
import time

import psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_gone(pids, wait_s: float = 10.0) -> None:
    """Every pid has exited (a zombie counts as exited) within wait_s."""
    deadline = time.monotonic() + wait_s
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"processes left behind: {pids}"
        time.sleep(0.1)


def tensor_parallel_workers(pid: int | None = None) -> list[psutil.Process]:
    """The tensor-parallel worker processes (python -m ssd.distributed) below ``pid`` (default: this process)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for c in children:
        try:
            if "ssd.distributed" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE:
                found.append(c)
        except psutil.NoSuchProcess:
            pass
    return found
