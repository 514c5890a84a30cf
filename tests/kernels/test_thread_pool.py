"""The CPU thread pool (`_C.testing.thread_pool_visits`): every index of every job runs exactly once, in
non-empty chunks that start on a multiple of the grain, whatever the thread count. The pool's timing
decisions (a worker late or absent, the caller running jobs alone after one) may change who runs a
chunk, never whether it runs: more threads than cores and a competing busy process provoke them."""
import subprocess
import sys

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
