"""Tensor parallelism's collectives over ``torch.distributed``, and its worker processes.

A tensor-parallel model (``LoadedModel.core_model(tensor_parallel=(rank, size,
all_gather, broadcast))``; csrc/model/tensor_parallel.h for the split) needs
two collectives: every rank's partial sum [T, hidden] after o_proj and
down_proj, gathered in rank order (the model adds them in that order on every
rank), and, when rank 0 leads (``Model.lead`` / ``Model.follow``), each
forward's input sent from rank 0.

* ``tensor_parallel(group)``: those from an initialised ``torch.distributed``
  group (gloo on CPUs, NCCL on GPUs: the same calls), for a program that
  manages its own processes (torchrun).
* ``GlooGroup``: a gloo group of its own over a TCP store, leaving
  ``torch.distributed``'s default group alone; ``WorkerProcesses`` starts
  ranks 1.. as fresh interpreters (``python -m ssd.distributed``) that load
  the model, join the group and follow rank 0. ``ssd.LLM`` uses these for
  ``tensor_parallel_size > 1``.
"""
from __future__ import annotations

import argparse
import datetime
import signal
import subprocess
import sys
from collections.abc import Callable

import torch

# How long a rank waits for the others: to join the group, and in each
# collective (the first forward's waits on the workers' loading the model).
DEFAULT_TIMEOUT_S = 300.0
# How long shutdown waits for a worker to exit before killing it.
EXIT_WAIT_S = 30.0


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


class GlooGroup:
    """A gloo process group of ``size`` ranks meeting at a TCP store on ``addr:port``
    (rank 0 hosts the store; port 0 there: a free one, see ``port``).

    Rank 0 creates its store first (``GlooGroup.host``), starts the others, then
    ``join``s; joining waits up to ``timeout_s`` for every rank, and so does
    every collective. A rank that is gone makes the others' collectives raise.
    """

    def __init__(self, store, rank: int, size: int, timeout_s: float):
        import torch.distributed as dist

        self.store, self.rank, self.size = store, rank, size
        self._pg = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=timeout_s))

    @staticmethod
    def host(size: int, timeout_s: float = DEFAULT_TIMEOUT_S, addr: str = "127.0.0.1", port: int = 0):
        """Rank 0's store (the others connect to it): returns it; ``.port`` is where."""
        import torch.distributed as dist

        try:
            return dist.TCPStore(addr, port, size, True, timeout=datetime.timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
        except (RuntimeError, OSError) as e:
            raise RuntimeError(f"tensor parallelism: cannot listen on {addr}:{port} for the other ranks: {e}") from e

    @classmethod
    def join(cls, addr: str, port: int, rank: int, size: int, timeout_s: float = DEFAULT_TIMEOUT_S,
             store=None) -> "GlooGroup":
        """This rank's membership (rank 0 passes its ``host`` store; the others connect to addr:port)."""
        import torch.distributed as dist

        try:
            if store is None:
                store = dist.TCPStore(addr, port, size, False, timeout=datetime.timedelta(seconds=timeout_s))
            return cls(store, rank, size, timeout_s)
        except (RuntimeError, OSError) as e:
            raise RuntimeError(f"tensor parallelism: rank {rank} of {size} could not join the group at "
                               f"{addr}:{port} within {timeout_s:g} s: {e}") from e

    def all_gather(self, part: torch.Tensor) -> torch.Tensor:
        part = part.contiguous()
        out = [torch.empty_like(part) for _ in range(self.size)]
        self._pg.allgather([out], [part]).wait()
        return torch.stack(out)

    def broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([t], opts).wait()

    def spec(self) -> tuple:
        """``(rank, size, all_gather, broadcast)`` for ``core_model(tensor_parallel=...)``."""
        return self.rank, self.size, self.all_gather, self.broadcast


def _exit_with_parent() -> None:
    """In a worker, before exec: SIGTERM when the process that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class WorkerProcesses:
    """Ranks 1 .. size - 1 of a target as fresh interpreters that follow rank 0.

    Each loads ``model`` (a path) with ``dtype``, joins the group at
    ``addr:port`` and runs ``Model.follow`` until rank 0 stops it (its engine's
    shutdown) or rank 0 is gone. ``close`` waits for them, then kills what is
    left; a worker also dies with this process (Linux).
    """

    def __init__(self, model: str, size: int, port: int, *, dtype: str, device: str, backend: str,
                 int8_activations: bool, threads: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                 addr: str = "127.0.0.1"):
        self.procs: list[subprocess.Popen] = []
        for rank in range(1, size):
            cmd = [sys.executable, "-m", "ssd.distributed", "--model", str(model), "--rank", str(rank),
                   "--size", str(size), "--addr", addr, "--port", str(port), "--dtype", dtype, "--device", device,
                   "--backend", backend, "--threads", str(threads), "--timeout", str(timeout_s)]
            if not int8_activations:
                cmd.append("--float-activations")
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_exit_with_parent))

    def failed(self) -> list[tuple[int, int]]:
        """(rank, exit status) of every worker that has exited."""
        return [(rank, p.returncode) for rank, p in enumerate(self.procs, start=1) if p.poll() is not None]

    def close(self, wait_s: float = EXIT_WAIT_S) -> None:
        for p in self.procs:
            try:
                p.wait(timeout=wait_s)
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
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    ap.add_argument("--float-activations", action="store_true")
    args = ap.parse_args(argv)
    from ssd import models
    from ssd.models.core import release_freed_memory

    group = GlooGroup.join(args.addr, args.port, args.rank, args.size, args.timeout)
    loaded = models.load(args.model, dtype=args.dtype)
    core = loaded.core_model(args.device, args.backend, int8_activations=not args.float_activations,
                             tensor_parallel=group.spec())
    loaded.weights.clear()
    release_freed_memory()
    core.follow(args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
