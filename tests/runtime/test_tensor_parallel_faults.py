"""Tensor parallelism's failures and its ranks' ways of meeting.

Checked: followers idle for several timeouts still follow (rank 0 pings
them); a rank that hangs ends the running request with an error within the
timeout, one that dies ends every request, running and waiting, at once; the
engine then counts as failed (LLM.failure(); new requests raise); a worker
that cannot load the model fails the constructor; torchrun's ranks
("env") give the tokens one process gives; a missing, wrong or unreachable
MASTER_ADDR/MASTER_PORT is an error within the timeout. No process is left.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ssd import LLM, SamplingParams
from tests.reference.processes import assert_gone, free_port, tensor_parallel_workers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and process deaths as on Linux")

REPO = Path(__file__).resolve().parents[2]


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_idle_followers_outlive_the_timeout(pair):
    """A follower waits for rank 0 no longer than the timeout: idle for three of them, it still follows
    because the engine pings it."""
    target, _ = pair
    with LLM(target, tensor_parallel_size=2, tensor_parallel_timeout_s=2.0, max_model_len=64) as llm:
        first = llm.generate([[1, 2, 3]], greedy(6))[0].token_ids
        time.sleep(6.5)
        assert llm.failure() is None
        again = llm.generate([[1, 2, 3]], greedy(6))[0]
        assert again.finish_reason == "length" and again.token_ids == first
        assert all(p.poll() is None for p in llm._workers.procs)
    assert not tensor_parallel_workers()


def test_a_hung_worker_fails_the_engine_within_the_timeout(pair):
    target, _ = pair
    llm = LLM(target, tensor_parallel_size=2, tensor_parallel_timeout_s=2.0, max_model_len=64)
    worker = llm._workers.procs[0]
    try:
        assert llm.generate([[1, 2, 3]], greedy(4))[0].finish_reason == "length"
        os.kill(worker.pid, signal.SIGSTOP)
        start = time.monotonic()
        out = llm.generate([[4, 5, 6]], greedy(4))[0]
        took = time.monotonic() - start
        assert out.finish_reason == "error" and "tensor parallelism" in out.error
        assert 1.5 < took < 12, took  # the timeout, and not much more
        assert "tensor parallelism" in llm.failure()
        with pytest.raises(RuntimeError, match="engine failed"):
            llm.generate([[1]], greedy(2))
    finally:
        llm.shutdown()  # kills the stopped worker: nothing told it to stop
    assert_gone([worker.pid])
    assert not tensor_parallel_workers()


def test_a_worker_dying_mid_generation_ends_every_request(pair):
    """Running and waiting requests all end with an error when a rank dies, and the engine fails."""
    target, _ = pair
    llm = LLM(target, tensor_parallel_size=2, max_model_len=256, max_batch=2)
    worker = llm._workers.procs[0]
    outs = []
    try:
        gen = threading.Thread(target=lambda: outs.extend(llm.generate([[i + 1, 2, 3] for i in range(4)],
                                                                       greedy(200))))
        gen.start()
        deadline = time.monotonic() + 60
        while llm.stats()["generated_tokens"] < 10:  # 2 run, 2 wait
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(worker.pid, signal.SIGKILL)
        gen.join(30)
        assert not gen.is_alive()
        assert [o.finish_reason for o in outs] == ["error"] * 4
        assert sum(len(o.token_ids) > 0 for o in outs) >= 2 and all(len(o.token_ids) < 200 for o in outs)
        assert llm.failure()
    finally:
        llm.shutdown()
    assert not tensor_parallel_workers()


def test_an_idle_engine_notices_a_dead_worker(pair):
    target, _ = pair
    with LLM(target, tensor_parallel_size=2, tensor_parallel_timeout_s=3.0, max_model_len=64) as llm:
        llm.generate([[1, 2, 3]], greedy(2))
        worker = llm._workers.procs[0]
        worker.kill()
        worker.wait(10)
        # the exit itself, or the engine's failed ping if that came first
        assert "rank 1 exited" in llm.failure() or "tensor parallelism" in llm.failure()
        deadline = time.monotonic() + 5  # the engine's own ping fails within a quarter of the timeout
        while not llm._engine.failure():
            assert time.monotonic() < deadline, "the engine did not notice the dead rank"
            time.sleep(0.05)
    assert not tensor_parallel_workers()


def test_ranks_loading_at_different_speeds_still_meet(pair, monkeypatch):
    """Rank 0 takes three timeouts longer than its worker to build its shard: the worker waits for it
    (up to LOAD_TIMEOUT_S), not only the group's timeout, and the first ping reaches it in time."""
    from ssd.models import LoadedModel

    target, _ = pair
    build = LoadedModel.core_model

    def slow_build(self, *args, **kwargs):  # this process only: the worker builds at its own speed
        time.sleep(3.0)
        return build(self, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "core_model", slow_build)
    with LLM(target, tensor_parallel_size=2, tensor_parallel_timeout_s=1.0, max_model_len=64) as llm:
        out = llm.generate([[1, 2, 3]], greedy(4))[0]
        assert out.finish_reason == "length" and llm.failure() is None
    assert not tensor_parallel_workers()


def test_a_worker_that_cannot_load_the_model_fails_the_constructor(pair, tmp_path):
    from ssd import models

    target, _ = pair
    copy = tmp_path / "gone"
    shutil.copytree(target, copy)
    loaded = models.load(str(copy))  # rank 0 holds it; the worker will find no files
    shutil.rmtree(copy)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 exited with status 1"):
        LLM(loaded, tensor_parallel_size=2, max_model_len=64)
    assert time.monotonic() - start < 60
    assert not tensor_parallel_workers()


def test_torchrun_ranks_generate_what_one_process_does(pair, tmp_path):
    """The same script on both ranks, started by torchrun ("env" initialisation)."""
    target, _ = pair
    out, prompts = tmp_path / "tokens.json", [[1, 2, 3], [7, 8, 9, 10, 11], [200, 100]]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(REPO / "tests/reference/tp_env_rank.py"), str(target), str(out), json.dumps(prompts)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]  # both ranks exited 0
    with LLM(target, max_model_len=64) as one:
        want = [o.token_ids for o in one.generate(prompts, greedy(12))]
    assert json.loads(out.read_text()) == want


@pytest.mark.parametrize("environ, match", [
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT not set"),
    ({"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "tensor_parallel_size 2 differs from WORLD_SIZE 3"),
    ({"RANK": "two", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "must be integers"),
])
def test_env_initialisation_names_a_bad_environment(pair, monkeypatch, environ, match):
    target, _ = pair
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        LLM(target, tensor_parallel_size=2, tensor_parallel_init="env", max_model_len=64)


def test_nobody_at_master_port_is_an_error_within_the_timeout(pair, monkeypatch):
    target, _ = pair
    port = free_port()  # closed again: nothing listens there
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"could not reach rank 0's store at 127.0.0.1:{port} within 2 s"):
        LLM(target, tensor_parallel_size=2, tensor_parallel_init="env", tensor_parallel_timeout_s=2.0,
            max_model_len=64)
    assert time.monotonic() - start < 15


def test_a_master_port_in_use_is_an_error(pair, monkeypatch):
    target, _ = pair
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        with pytest.raises(RuntimeError, match="cannot host the ranks' store on 127.0.0.1"):
            LLM(target, tensor_parallel_size=2, tensor_parallel_init="env", tensor_parallel_timeout_s=2.0,
                max_model_len=64)


@pytest.mark.parametrize("field, value, match", [
    ("tensor_parallel_timeout_s", 0, "tensor_parallel_timeout_s: must be a number of seconds > 0"),
    ("tensor_parallel_timeout_s", float("inf"), "tensor_parallel_timeout_s: must be a number of seconds > 0"),
    ("tensor_parallel_init", "mpi", "tensor_parallel_init: must be 'spawn' or 'env', got 'mpi'"),
])
def test_bad_tensor_parallel_fields_are_named(field, value, match):
    from ssd import EngineConfig

    with pytest.raises(ValueError, match=match):
        EngineConfig(**{field: value})
