"""Tensor parallelism's collectives over ``torch.distributed``, and its ranks.

A tensor-parallel model (``LoadedModel.core_model(tensor_parallel=(rank, size,
all_gather, broadcast))``; csrc/model/tensor_parallel.h for the split) needs
two collectives: every rank's partial sum [T, hidden] after o_proj and
down_proj, gathered in rank order (the model adds them in that order on every
rank), and, when rank 0 leads (``Model.lead`` / ``Model.follow``), each
forward's input sent from rank 0.

* ``tensor_parallel(group)``: those from an initialised ``torch.distributed``
  group, for a program that manages its own group.
* ``RankGroup``: a group of its own (gloo on CPUs, NCCL on GPUs) over a
  store, leaving ``torch.distributed``'s default group alone. ``ssd.LLM``
  uses it for ``tensor_parallel_size > 1``, the ranks meeting in one of two
  ways (``EngineConfig.tensor_parallel_init``):

  - "spawn": rank 0 hosts a store on 127.0.0.1 and starts ranks 1.. as fresh
    interpreters (``WorkerProcesses``: ``python -m ssd.distributed``);
  - "env": every rank is started by the user (torchrun, or by hand on each
    machine) and reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
    LOCAL_RANK (``env_store``); rank 0 hosts the store at MASTER_ADDR:MASTER_PORT
    (or torchrun's agent does).

  Either way, every rank loads the model and builds its shard, says so in
  the store (``announce_ready``), waits for all the others to have done so
  (``wait_ready``, up to ``LOAD_TIMEOUT_S``: ranks may load at different
  speeds) and only then joins the group, so joining waits for no one's load.

Timeouts (every wait has an exit): reaching the store, and every collective,
wait at most ``EngineConfig.tensor_parallel_timeout_s``; a follower waits for
rank 0 no longer than that either, so an idle engine pings its followers
(csrc/runtime/engine.cpp). Over gloo, a rank that is gone makes the others'
collectives raise at once, one that hangs after the timeout. Over NCCL a
collective does not block the host and NCCL's watchdog handles both after the
timeout: it aborts the processes.
"""
from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import torch

# How long rank 0 waits for the other ranks to load the model and build their shards.
LOAD_TIMEOUT_S = 900.0
# How long shutdown waits for a worker to exit before killing it.
EXIT_WAIT_S = 30.0
# The store's keys of ssd's group (a torchrun agent's store holds others).
_PREFIX = "ssd/tensor_parallel/"
# The variables "env" initialisation reads (torchrun sets them all).
ENV_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def all_gather_fn(group=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``part -> [size, *part.shape]``: every rank's part of ``group`` (default:
    the whole world of ``torch.distributed``, which must be initialised), stacked
    in rank order."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
    size = dist.get_world_size(group)

    def all_gather(part: torch.Tensor) -> torch.Tensor:
        part = part.contiguous()
        out = torch.empty((size, *part.shape), dtype=part.dtype, device=part.device)
        dist.all_gather(list(out.unbind(0)), part, group=group)
        return out

    return all_gather


def broadcast_fn(group=None) -> Callable[[torch.Tensor], None]:
    """``t -> None``: rank 0's ``t`` (of ``group``) copied into every other rank's, in place."""
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0) if group is not None else 0

    def broadcast(t: torch.Tensor) -> None:
        dist.broadcast(t, src=src, group=group)

    return broadcast


def tensor_parallel(group=None) -> tuple:
    """``(rank, size, all_gather, broadcast)`` of ``group`` for ``core_model(tensor_parallel=...)``."""
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group), all_gather_fn(group), broadcast_fn(group)


def rank_device(device: str, offset: int) -> str:
    """Where a rank runs: "cpu" for every rank; "cuda" / "cuda:i" -> "cuda:{i + offset}" (offset:
    the rank among this machine's ranks, so each GPU holds one)."""
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        first = int(device[5:]) if device.startswith("cuda:") else 0
        return f"cuda:{first + offset}"
    raise ValueError(f"tensor parallelism: runs on 'cpu' or 'cuda' devices, not {device!r}")


# ------------------------------------------------------------------ stores
def host_store(size: int, timeout_s: float, addr: str = "127.0.0.1", port: int = 0):
    """Rank 0's store (the others connect to it); port 0: a free one (the store's ``.port``). Rank 0
    connects to it at ``addr`` too: an address that is not this machine's is an error after about twice
    ``timeout_s``. Shared with a ``torch.distributed`` group of the same program (multi-tenant)."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(addr, port, size, True, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False, multi_tenant=True)
    except (RuntimeError, OSError) as e:
        raise RuntimeError(f"tensor parallelism: cannot host the ranks' store on {addr}:{port}: {e}") from e


def connect_store(addr: str, port: int, rank: int, size: int, timeout_s: float):
    """A follower's connection to rank 0's store; RuntimeError naming the address within ``timeout_s``."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(addr, port, size, False, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as e:
        raise RuntimeError(f"tensor parallelism: rank {rank} of {size} could not reach rank 0's store at "
                           f"{addr}:{port} within {timeout_s:g} s (is MASTER_ADDR/MASTER_PORT right, and rank 0 "
                           f"started?): {e}") from e


def env_ranks(environ=None) -> tuple[int, int, int]:
    """``(rank, size, local_rank)`` from RANK, WORLD_SIZE and LOCAL_RANK (default 0); ValueError naming what
    is missing or wrong."""
    environ = os.environ if environ is None else environ
    missing = [v for v in ENV_VARIABLES if not environ.get(v)]
    if missing:
        raise ValueError(f"tensor_parallel_init 'env': {', '.join(missing)} not set (torchrun sets "
                         f"{', '.join(ENV_VARIABLES)}; by hand, set them on every rank)")
    try:
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK") or 0)
        int(environ["MASTER_PORT"])
    except ValueError:
        raise ValueError("tensor_parallel_init 'env': RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be "
                         f"integers, got {', '.join(f'{v}={environ.get(v)!r}' for v in (*ENV_VARIABLES, 'LOCAL_RANK'))}")
    if not 0 <= rank < size:
        raise ValueError(f"tensor_parallel_init 'env': RANK {rank} is outside WORLD_SIZE {size}")
    return rank, size, local_rank


def env_store(rank: int, size: int, timeout_s: float, environ=None):
    """The store at MASTER_ADDR:MASTER_PORT: rank 0 hosts it, unless a torchrun agent does already."""
    environ = os.environ if environ is None else environ
    addr, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    if rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return host_store(size, timeout_s, addr, port)
    return connect_store(addr, port, rank, size, timeout_s)


def announce_ready(store, rank: int) -> None:
    """This rank's shard is built; it joins the group once every rank has said so (``wait_ready``)."""
    _prefixed(store).set(f"ready/{rank}", "1")


def wait_ready(store, rank: int, size: int, timeout_s: float = LOAD_TIMEOUT_S,
               check: Callable[[], None] | None = None) -> None:
    """Waits until every other rank has announced itself; ``check()`` (raising) is called while it waits
    (rank 0: a local worker that died). RuntimeError naming the ranks missing after ``timeout_s``."""
    store = _prefixed(store)
    waiting = [f"ready/{r}" for r in range(size) if r != rank]
    deadline = time.monotonic() + timeout_s
    while waiting:
        if check is not None:
            check()
        waiting = [k for k in waiting if not store.check([k])]
        if not waiting:
            return
        if time.monotonic() > deadline:
            ranks = ", ".join(k.split("/")[1] for k in waiting)
            raise RuntimeError(f"tensor parallelism: rank(s) {ranks} did not load the model within {timeout_s:g} s")
        time.sleep(0.05)


def _prefixed(store):
    import torch.distributed as dist

    return dist.PrefixStore(_PREFIX, store)


# ------------------------------------------------------------------- group
class RankGroup:
    """One rank's membership of a process group of ``size`` ranks: gloo when ``device`` is the CPU, NCCL on a
    GPU. ``spec()`` may be handed to ``core_model`` before ``join``; the collectives need the group joined.

    gloo: joining waits up to ``timeout_s`` for every rank to join, and so does every collective; a rank
    that is gone makes the others' collectives raise at once. NCCL connects at the first collective, and its
    watchdog aborts the process when one takes longer than ``timeout_s``.
    """

    def __init__(self, rank: int, size: int, device: str, timeout_s: float):
        self.rank, self.size, self.device, self.timeout_s = rank, size, torch.device(device), timeout_s
        self._pg = None

    def join(self, store) -> None:
        import torch.distributed as dist

        store, timeout = _prefixed(store), datetime.timedelta(seconds=self.timeout_s)
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self._pg = dist.ProcessGroupNCCL(store, self.rank, self.size, options)
            else:
                self._pg = dist.ProcessGroupGloo(store, self.rank, self.size, timeout)
        except (RuntimeError, OSError) as e:
            raise RuntimeError(f"tensor parallelism: rank {self.rank} of {self.size} could not join the group "
                               f"within {self.timeout_s:g} s: {e}") from e

    def _group(self):
        if self._pg is None:
            raise RuntimeError(f"tensor parallelism: rank {self.rank} has not joined its group")
        return self._pg

    def all_gather(self, part: torch.Tensor) -> torch.Tensor:
        part = part.contiguous()
        out = [torch.empty_like(part) for _ in range(self.size)]
        self._group().allgather([out], [part]).wait()
        return torch.stack(out)

    def broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        # NCCL moves device memory only: a host tensor (the forward's inputs) goes through the rank's GPU.
        staged = t.to(self.device) if t.device != self.device else t
        self._group().broadcast([staged], opts).wait()
        if staged is not t:
            t.copy_(staged)

    def spec(self) -> tuple:
        """``(rank, size, all_gather, broadcast)`` for ``core_model(tensor_parallel=...)``."""
        return self.rank, self.size, self.all_gather, self.broadcast


def follow(loaded, store, rank: int, size: int, *, device: str, backend: str, int8_activations: bool,
           threads: int, timeout_s: float) -> int:
    """Ranks 1..: builds this rank's shard of ``loaded`` (a ``LoadedModel``, or a callable returning one,
    so that a failed load is reported like the rest), announces it, joins the group and runs rank 0's forwards until rank 0
    stops it. Returns the process's exit status: 0 then, 1 when the group fails (rank 0 gone, or silent for
    ``timeout_s``), with the reason on stderr."""
    from ssd.models.core import release_freed_memory

    try:
        loaded = loaded() if callable(loaded) else loaded
        group = RankGroup(rank, size, device, timeout_s)
        core = loaded.core_model(device, backend, int8_activations=int8_activations, tensor_parallel=group.spec())
        loaded.weights.clear()
        release_freed_memory()
        announce_ready(store, rank)
        wait_ready(store, rank, size)
        group.join(store)
        core.follow(threads)
    except Exception as e:  # one line: rank 0 (or torchrun) reports the exit status
        print(f"ssd tensor-parallel rank {rank}: {e}", file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------- workers
def _exit_with_parent() -> None:
    """In a worker, before exec: SIGTERM when the process that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class WorkerProcesses:
    """Ranks 1 .. size - 1 of a target as fresh interpreters that follow rank 0 ("spawn").

    Each loads ``model`` (a path) with ``dtype`` on its device (``rank_device``), announces itself in the
    store at ``addr:port``, joins the group and follows rank 0 until rank 0 stops it (its engine's shutdown)
    or the group fails. ``close`` waits for them, then kills what is left; a worker also dies with this
    process (Linux).
    """

    def __init__(self, model: str, size: int, port: int, *, dtype: str, device: str, backend: str,
                 int8_activations: bool, threads: int, timeout_s: float, addr: str = "127.0.0.1"):
        self.procs: list[subprocess.Popen] = []
        for rank in range(1, size):
            cmd = [sys.executable, "-m", "ssd.distributed", "--model", str(model), "--rank", str(rank),
                   "--size", str(size), "--addr", addr, "--port", str(port), "--dtype", dtype,
                   "--device", rank_device(device, rank), "--backend", backend, "--threads", str(threads),
                   "--timeout", str(timeout_s)]
            if not int8_activations:
                cmd.append("--float-activations")
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_exit_with_parent))

    def failed(self) -> list[tuple[int, int]]:
        """(rank, exit status) of every worker that has exited."""
        return [(rank, p.returncode) for rank, p in enumerate(self.procs, start=1) if p.poll() is not None]

    def check(self) -> None:
        """RuntimeError naming the first worker that has exited."""
        for rank, status in self.failed():
            raise RuntimeError(f"tensor parallelism: rank {rank} exited with status {status} (its error, if any, "
                               "is on stderr above)")

    def close(self, wait_s: float = EXIT_WAIT_S) -> None:
        """Waits up to ``wait_s`` in all for the workers to exit, then kills the rest."""
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        self.close()


def worker_main(argv: list[str] | None = None) -> int:
    """One follower rank (WorkerProcesses starts it)."""
    ap = argparse.ArgumentParser(prog="python -m ssd.distributed", description=WorkerProcesses.__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--float-activations", action="store_true")
    args = ap.parse_args(argv)
    from ssd import models

    try:
        store = connect_store(args.addr, args.port, args.rank, args.size, args.timeout)
    except RuntimeError as e:
        print(f"ssd tensor-parallel rank {args.rank}: {e}", file=sys.stderr)
        return 1
    return follow(lambda: models.load(args.model, dtype=args.dtype), store, args.rank, args.size,
                  device=args.device, backend=args.backend, int8_activations=not args.float_activations,
                  threads=args.threads, timeout_s=args.timeout)


if __name__ == "__main__":
    sys.exit(worker_main())
