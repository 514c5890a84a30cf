"""Forwards whose rows fork (csrc/model/backend.h, ForwardInput::prefix_seq /
prefix_len; Backend::fork_attention): a speculation-tree branch reads its
sequence's keys below its fork through the sequence's table and writes its own
positions into blocks of its own, the partial block at the fork never copied.
Its logits are bitwise those of the same tokens decoded as the sequence's own
continuation, and it writes no slot of the sequence.

Each test runs on the cpu backend, the aten reference on the CPU and, where
there is a GPU, the cuda backend.
"""
from __future__ import annotations

import pytest
import torch

from ssd import _C
from tests.model.conftest import TINY_SPEC
from tests.reference.tiny_models import random_tokens

PAD = -1
BS = 4
NUM_BLOCKS = 8
SPEC = TINY_SPEC  # tiny_core's (conftest.py)

SEQ_TABLE = [3, 0, 5]  # the sequence's positions 0..11
# Branch A forks at 6 (positions 6..8): the sequence's block 3, then blocks 1 and 2 of its
# own (block 1 holds nothing of the sequence's positions 4 and 5). B forks at 9: blocks 3
# and 0 shared, block 4 its own from position 8 on.
BRANCHES = {"A": (6, [3, 1, 2], 3), "B": (9, [3, 0, 4], 1)}


def prefilled(core, seq):
    raw = _C.testing.RawForward(core, NUM_BLOCKS, BS)
    raw.forward(seq, list(range(len(seq))), [0] * len(seq), [SEQ_TABLE], [len(seq) - 1])
    return raw


def branch_forward(raw, feeds, logit_rows=None, **overrides):
    """One forward of every branch's feed: rows of table row 1 + b forking from row 0."""
    args = dict(tokens=[], positions=[], seq_of_token=[], prefix_seq=[], prefix_len=[])
    for b, (name, (fork, _, count)) in enumerate(BRANCHES.items()):
        args["tokens"] += feeds[name]
        args["positions"] += range(fork, fork + count)
        args["seq_of_token"] += [1 + b] * count
        args["prefix_seq"] += [0] * count
        args["prefix_len"] += [fork] * count
    args.update(overrides)
    rows = list(range(len(args["tokens"]))) if logit_rows is None else logit_rows
    tables = [SEQ_TABLE] + [table for _, table, _ in BRANCHES.values()]
    return raw.forward(args["tokens"], args["positions"], args["seq_of_token"], tables, rows,
                       prefix_seq=args["prefix_seq"], prefix_len=args["prefix_len"])


def test_branch_logits_equal_the_sequence_continuation_and_write_only_own_slots(tiny_core):
    core = tiny_core
    seq = random_tokens(10, SPEC.vocab_size, seed=1)
    feeds = {name: random_tokens(count, SPEC.vocab_size, seed=2 + i)
             for i, (name, (_, _, count)) in enumerate(BRANCHES.items())}
    raw = prefilled(core, seq)
    before = raw.cache_storage().cpu().clone()  # [layers, 2, blocks, BS, kv_heads, d]
    logits = branch_forward(raw, feeds).cpu()
    after = raw.cache_storage().cpu()
    written = torch.zeros(NUM_BLOCKS, BS, dtype=torch.bool)
    first = 0
    for name, (fork, table, count) in BRANCHES.items():
        for pos in range(fork, fork + count):
            written[table[pos // BS], pos % BS] = True
        # The branch decoded as the sequence itself, on a cache of its own.
        alone = _C.testing.RawForward(core, NUM_BLOCKS, BS)
        tokens = seq[:fork] + feeds[name]
        n = len(tokens)
        want = alone.forward(tokens, list(range(n)), [0] * n, [[0, 1, 2]], list(range(fork, n))).cpu()
        assert torch.equal(logits[first:first + count], want), f"branch {name}"
        first += count
    changed = (after != before).flatten(4).any(-1).any(0).any(0)  # [blocks, BS]
    assert torch.equal(changed, written)


def test_unforked_rows_read_their_own_partial_block(tiny_core):
    core = tiny_core
    """Negative control: the same forward without the forks reads branch A's positions 4
    and 5 through its own block 1, which holds nothing of the sequence."""
    seq = random_tokens(10, SPEC.vocab_size, seed=1)
    feeds = {"A": random_tokens(3, SPEC.vocab_size, seed=2), "B": random_tokens(1, SPEC.vocab_size, seed=3)}
    forked = branch_forward(prefilled(core, seq), feeds).cpu()
    unforked = branch_forward(prefilled(core, seq), feeds, prefix_len=[0] * 4).cpu()
    assert not torch.equal(forked[:3], unforked[:3])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(prefix_seq=[0, 0, 0]), "prefix_seq and prefix_len must have one entry per token"),
        (dict(prefix_seq=[]), "prefix_seq and prefix_len must have one entry per token"),
        (dict(prefix_seq=[0, 0, 7, 0]), r"token 2 .* forks from block-table row 7 at position 6"),
        (dict(prefix_len=[6, 6, 9, 9]), r"token 2 .* forks from block-table row 0 at position 9: .* not in 0..8"),
        (dict(prefix_len=[6, 6, 6, -1]), r"forks from block-table row 0 at position -1"),
    ],
)
def test_bad_forks_are_refused(tiny_loaded, overrides, message):
    core = tiny_loaded.core_model("cpu", "auto")
    feeds = {"A": [1, 2, 3], "B": [4]}
    raw = prefilled(core, random_tokens(10, SPEC.vocab_size, seed=1))
    with pytest.raises(ValueError, match=message):
        branch_forward(raw, feeds, **overrides)


def test_a_prefix_table_without_the_blocks_is_refused(tiny_loaded):
    core = tiny_loaded.core_model("cpu", "auto")
    raw = prefilled(core, random_tokens(10, SPEC.vocab_size, seed=1))
    tables = [[3, PAD, 5], [3, 1, 2]]
    with pytest.raises(ValueError, match=r"token 0 .* block-table row 0 entry 1, which holds -1"):
        raw.forward([1], [6], [1], tables, [0], prefix_seq=[0], prefix_len=[6])
