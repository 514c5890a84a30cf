"""The CPU thread pool (`_C.testing.thread_pool_visits`): every index of every job runs exactly once, in
non-empty chunks that start on a multiple of the grain, whatever the thread count. The pool's decisions
(a worker late or absent, the caller running jobs alone while the cores are taken) may change who runs a
chunk, never whether it runs: more threads than cores and a competing busy process provoke them.
Whether it shares (`_C.testing.thread_pool_sharing`) follows the machine's run queue."""
import contextlib
import subprocess
import sys
import time

import pytest

from ssd import _C
from ssd.bench.contention import busy_process, usable_cpus


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("n, grain", [(1, 1), (2, 1), (7, 1), (100, 3), (1000, 16), (70_000, 1)])
def test_every_index_runs_once_per_job(n, grain, threads):
    jobs = 20 if n > 10_000 else 300
    counts, aligned = _C.testing.thread_pool_visits(n, grain, threads, jobs)
    assert aligned
    assert counts == [jobs] * n


def test_every_index_runs_once_beside_a_busy_process():
    with busy_process(usable_cpus()[-1]):
        for threads in (2, 3):
            counts, aligned = _C.testing.thread_pool_visits(512, 4, threads, 20_000)
            assert aligned and counts == [20_000] * 512, threads


def test_the_pool_shares_while_others_fit_beside_it():
    """Scripted readings of the others' runnable threads (one per look, every 64 jobs), 2 threads on
    this process's CPUs. The pool of fd72ce8, which stopped sharing after a few late workers on an idle
    machine, is what the first case guards against; a pool that shares whatever the load fails the second."""
    cpus = len(usable_cpus())
    room = cpus - 2  # CPUs left for others while the 2-thread pool shares
    idle = _C.testing.thread_pool_sharing(2, 4000, 50, [room])
    assert sum(idle) == len(idle), "a pool with room for the others stopped sharing"
    crowded = _C.testing.thread_pool_sharing(2, 4000, 50, [room + 1])
    # The moving average passes +0.5 at the 6th look (1 - (7/8)^6 > 0.5): jobs 384 on run alone.
    assert crowded[:384] == [1] * 384 and sum(crowded[384:]) == 0, sum(crowded)
    # Crowded for 20 looks, then free: back to sharing once the average falls under +0.25.
    back = _C.testing.thread_pool_sharing(2, 4000, 50, [room + 1] * 20 + [room])
    assert sum(back[384:1280]) == 0 and sum(back[2000:]) == 2000, (sum(back[384:1280]), sum(back[2000:]))


def test_the_run_queue_is_read_from_loadavg():
    assert _C.testing.loadavg_runnable("0.20 0.18 0.12 3/412 1234\n") == 3
    assert _C.testing.loadavg_runnable("0.20 0.18 0.12 17/412 1234") == 17
    for bad in ("", "0.20 0.18", "0.20 0.18 0.12 x/412", "0.20 0.18 0.12 3 412", "0.20 0.18 0.12 -3/412"):
        assert _C.testing.loadavg_runnable(bad) == -1, bad
    if sys.platform.startswith("linux"):
        with open("/proc/loadavg") as f:
            assert _C.testing.loadavg_runnable(f.read()) >= 1  # this thread is running


def test_the_pool_runs_jobs_alone_beside_busy_processes():
    """A busy process on every CPU: the machine's run queue (no script) stops the sharing."""
    cpus = usable_cpus()
    with contextlib.ExitStack() as stack:
        for cpu in cpus:
            stack.enter_context(busy_process(cpu))
        time.sleep(0.2)  # the busy processes are running
        shared = _C.testing.thread_pool_sharing(len(cpus), 5000, 2000)
    assert sum(shared) < len(shared) / 2, f"{len(cpus)} threads beside {len(cpus)} busy processes shared {sum(shared)} of {len(shared)} jobs"


# Each thread's stack (8 MiB by default) is address space: with RLIMIT_AS a
# little above what the process maps, starting 200 threads fails part-way.
_START_FAILS = """
import resource, sys
from ssd import _C
_C.testing.thread_pool_visits(4, 1, 2, 1)
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + 64 * 2**20, resource.RLIM_INFINITY))
try:
    _C.testing.thread_pool_visits(4, 1, 200, 1)
except RuntimeError as e:
    print("raised:", e)
    sys.exit(0)
print("no error")
sys.exit(1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_a_pool_whose_threads_cannot_start_raises():
    """The pool stops the threads it started and raises a clear error (it used
    to hang destroying its condition variable, or abort on a joinable thread)."""
    r = subprocess.run([sys.executable, "-c", _START_FAILS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "thread pool: could not start 200 threads" in r.stdout and "use fewer threads" in r.stdout, r.stdout
