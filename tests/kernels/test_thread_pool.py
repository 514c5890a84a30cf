"""The CPU thread pool (`_C.testing.thread_pool_visits`): every index of every job runs exactly once, in
non-empty chunks that start on a multiple of the grain, whatever the thread count. The pool's timing
decisions (a worker late or absent, the caller running jobs alone after one) may change who runs a
chunk, never whether it runs: more threads than cores and a competing busy process provoke them."""
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
