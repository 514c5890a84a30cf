"""One rank of a tensor-parallel model over torch.distributed's gloo, for
tests/model/test_tensor_parallel.py:

    python -m tests.reference.tp_rank MODEL_DIR RANK SIZE PORT OUT TOKEN...

Joins the group at 127.0.0.1:PORT (60 s timeout) and builds its shard of the
model. Rank 0 leads: it prefills the first 20 tokens, decodes the rest one by
one and saves every row's logits to OUT; the other ranks follow its forwards.
"""
from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

import ssd.models
from ssd import _C
from ssd.distributed import tensor_parallel


def main(argv: list[str]) -> None:
    model_dir, rank, size, port, out = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    tokens = [int(t) for t in argv[5:]]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        core = ssd.models.load(model_dir).core_model("cpu", "cpu", tensor_parallel=tensor_parallel())
        if rank > 0:
            core.follow(1)
            return
        core.lead()
        try:
            runner = _C.SequenceRunner(core, 8, 16, 1)
            seq = runner.add_sequence()
            rows = [runner.extend([(seq, tokens[:20])], True)]
            rows += [runner.extend([(seq, [t])], True) for t in tokens[20:]]
        finally:
            core.stop_followers()
        torch.save(torch.cat(rows), out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
