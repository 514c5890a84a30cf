"""Forwards padded to a bucket shape (csrc/model/forward_shape.h,
Model::forward_bucketed): what the cuda backend replays as one CUDA graph per
shape. Padding is inert: padded tokens sit in a table row of -1 entries (slot
-1: no K / V written or read), so the real rows' logits are bitwise the
unpadded forward's and the cache holds the same bytes afterwards.

The shape rule is checked against hand-written padded arrays; the forwards on
the cpu backend, the aten reference and, where there is a GPU, the cuda backend
with its graphs against the same backend without them.
"""
from __future__ import annotations

import pytest
import torch

from ssd import _C
from tests.model.conftest import PLACEMENTS, TINY_SPEC
from tests.reference.tiny_models import random_tokens

BS = 4
NUM_BLOCKS = 16
SPEC = TINY_SPEC


def test_padded_arrays_by_hand():
    got = _C.testing.padded_forward([5, 6, 7], [3, 4, 0], [0, 0, 1], [[2, 3], [4, -1]], [1, 2], key_bound=32)
    pad8 = [-1] * 8
    assert got == {
        "tokens": [5, 6, 7, 0],  # 3 -> bucket 4: one padding token (token 0, position 0) ...
        "positions": [3, 4, 0, 0],
        "seq_of_token": [0, 0, 1, 3],  # ... in the last table row
        # 2 rows + the padding row -> 4 rows; width 2 -> 8 (the least)
        "block_tables": [[2, 3] + [-1] * 6, [4] + [-1] * 7, pad8, pad8],
        "logit_rows": [1, 2],
        "prefix_seq": [],
        "prefix_len": [],
        "key_bound": 32,
    }


def test_padded_forks_and_larger_buckets_by_hand():
    n = 17  # -> 24 tokens; 5 logit rows -> 8; 3 table rows + padding -> 4; width 9 -> 16
    table = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    got = _C.testing.padded_forward([9] * n, list(range(20, 20 + n)), [1] * n, [table, table, table],
                                    [0, 1, 2, 3, 4], prefix_seq=[0] * n, prefix_len=[20] * n)
    assert got["tokens"] == [9] * n + [0] * 7
    assert got["positions"] == list(range(20, 20 + n)) + [0] * 7
    assert got["seq_of_token"] == [1] * n + [3] * 7
    assert got["block_tables"] == [table + [-1] * 7] * 3 + [[-1] * 16]
    assert got["logit_rows"] == [0, 1, 2, 3, 4, 0, 0, 0]
    assert got["prefix_seq"] == [0] * n + [3] * 7  # padding rows fork from their own row ...
    assert got["prefix_len"] == [20] * n + [0] * 7  # ... at 0: no fork
    assert got["key_bound"] == 0


@pytest.mark.parametrize("tokens, bucket", [(1, 1), (2, 2), (3, 4), (9, 16), (16, 16), (17, 24), (33, 48),
                                            (65, 96), (129, 192), (257, 384), (385, 512), (512, 512)])
def test_token_buckets(tokens, bucket):
    got = _C.testing.padded_forward([1] * tokens, [0] * tokens, [0] * tokens, [[0]], [0])
    assert len(got["tokens"]) == bucket


def test_past_the_largest_bucket_there_is_no_shape():
    assert _C.testing.padded_forward([1] * 513, [0] * 513, [0] * 513, [[0]], [0]) is None


def _batch(runs, key_bound):
    """Sequences extending by runs[i] tokens each, at positions just below key_bound, tables as wide as it."""
    toks, pos, seqs = [], [], []
    for s, n in enumerate(runs):
        toks += [1] * n
        pos += range(key_bound - n, key_bound)
        seqs += [s] * n
    width = key_bound // BS
    return toks, pos, seqs, [[0] * width] * len(runs), list(range(len(toks)))


def test_graph_worthy_takes_steps_and_leaves_prompt_chunks():
    # runs of up to 64 tokens of one sequence (decode, verify, tree, short prompts) are captured ...
    assert _C.testing.graph_worthy(*_batch([1, 1, 1, 1], 32), key_bound=32, num_heads=4, head_dim=64) is True
    assert _C.testing.graph_worthy(*_batch([64, 3], 512), key_bound=512, num_heads=4, head_dim=64) is True
    # ... a 65th token of one sequence makes it a prompt chunk, launched as it is
    assert _C.testing.graph_worthy(*_batch([65, 3], 512), key_bound=512, num_heads=4, head_dim=64) is False
    assert _C.testing.graph_worthy(*_batch([1] * 513, 512), key_bound=512, num_heads=4, head_dim=64) is None


def test_graph_worthy_bounds_the_split_workspace():
    # 256 tokens at key_bound 32768 (128 splits of 256 keys), head_dim 128, fp32 partials:
    # 256 * 128 * heads * 128 * 4 bytes = heads * 16 MiB, at most 256 MiB
    batch = _batch([64] * 4, 32768)
    assert _C.testing.graph_worthy(*batch, key_bound=32768, num_heads=16, head_dim=128) is True  # 256 MiB
    assert _C.testing.graph_worthy(*batch, key_bound=32768, num_heads=32, head_dim=128) is False  # 512 MiB
    # one split (key_bound 256) has no workspace at all
    assert _C.testing.graph_worthy(*_batch([64] * 4, 256), key_bound=256, num_heads=4096, head_dim=128) is True


def steps(seed):
    """A prefill of three sequences, two decode steps, a verify step and a forked tree step:
    (tokens, positions, seq_of_token, tables, logit_rows, forks) each, forks (prefix_seq, prefix_len) or None."""
    prompts = [random_tokens(n, SPEC.vocab_size, seed=seed + i) for i, n in enumerate([5, 7, 3])]
    tables = [[0, 1, 2, -1], [3, 4, 5, -1], [6, 7, -1, -1]]
    out = []
    toks, pos, seqs = [], [], []
    for s, p in enumerate(prompts):
        toks += p
        pos += range(len(p))
        seqs += [s] * len(p)
    out.append((toks, pos, seqs, tables, [4, 11, 14], None))  # 15 tokens -> 16
    lens = [5, 7, 3]
    for step in range(2):  # 3 tokens -> 4
        feed = random_tokens(3, SPEC.vocab_size, seed=seed + 10 + step)
        out.append((feed, list(lens), [0, 1, 2], tables, [0, 1, 2], None))
        lens = [n + 1 for n in lens]
    # verify: 3 new tokens on sequences 0 and 1 (6 tokens -> 8), every row's logits
    feed = random_tokens(6, SPEC.vocab_size, seed=seed + 20)
    pos = list(range(lens[0], lens[0] + 3)) + list(range(lens[1], lens[1] + 3))
    out.append((feed, pos, [0] * 3 + [1] * 3, tables, list(range(6)), None))
    # a tree step: two branches of sequence 2 (positions 4.. in blocks 8 and 9 of their own)
    fork = lens[2]  # 5: position 4, in sequence 2's block 7, is the partial block at the fork
    branch_tables = [[6, 8, -1, -1], [6, 9, -1, -1]]
    feed = random_tokens(4, SPEC.vocab_size, seed=seed + 30)
    out.append((feed, [fork, fork + 1, fork, fork + 1], [3, 3, 4, 4], tables + branch_tables, [0, 1, 2, 3],
                ([2] * 4, [fork] * 4)))
    return out


def run(raw, step, bucketed):
    toks, pos, seqs, tables, rows, forks = step
    kw = {} if forks is None else dict(prefix_seq=forks[0], prefix_len=forks[1])
    return raw.forward(toks, pos, seqs, tables, rows, bucketed=bucketed, **kw).cpu()


def test_bucketed_forwards_equal_the_forwards_as_they_are(tiny_core):
    plain = _C.testing.RawForward(tiny_core, NUM_BLOCKS, BS)
    padded = _C.testing.RawForward(tiny_core, NUM_BLOCKS, BS)
    for i, step in enumerate(steps(seed=3)):
        want = run(plain, step, bucketed=False)
        got = run(padded, step, bucketed=True)
        assert torch.equal(got, want), f"step {i}: logits"
        # the padding wrote nothing: every block (block 0 included) holds the same bytes
        assert torch.equal(padded.cache_storage().cpu(), plain.cache_storage().cpu()), f"step {i}: cache"


def test_a_position_past_key_bound_is_refused(tiny_core):
    raw = _C.testing.RawForward(tiny_core, NUM_BLOCKS, BS)
    with pytest.raises(ValueError, match="past the forward's key_bound 4"):
        raw.forward([1, 2], [3, 4], [0, 0], [[0, 1]], [1], key_bound=4)


@pytest.mark.cuda
def test_cuda_graph_replays_equal_kernel_launches(tiny_loaded):
    """The cuda backend's graphs (one per shape, captured on a shape's second forward and
    replayed from then on) against the same kernels launched one by one, over steps whose
    positions and tables change between replays of one graph."""
    device, backend = PLACEMENTS["cuda"]
    graphed = tiny_loaded.core_model(device, backend, cuda_graphs=True)
    launched = tiny_loaded.core_model(device, backend, cuda_graphs=False)
    a = _C.testing.RawForward(graphed, NUM_BLOCKS, BS)
    b = _C.testing.RawForward(launched, NUM_BLOCKS, BS)
    before = graphed.graph_counts()
    all_steps = steps(seed=5)
    # the decode shape four times (captured on its second forward, then replayed)
    decode = all_steps[1]
    decodes = [(random_tokens(3, SPEC.vocab_size, seed=40 + j), [p + j for p in decode[1]], *decode[2:])
               for j in range(4)]
    for i, step in enumerate([all_steps[0]] + decodes + all_steps[3:] + all_steps[3:]):
        assert torch.equal(run(a, step, bucketed=True), run(b, step, bucketed=False)), f"step {i}"
        assert torch.equal(a.cache_storage().cpu(), b.cache_storage().cpu()), f"step {i}: cache"
    after = graphed.graph_counts()
    # decode: 1 capture, 3 replays; the verify and tree shapes: 1 capture and 1 replay each
    assert after["captured"] - before["captured"] == 3
    assert after["replayed"] - before["replayed"] == 5
    assert after["failed"] == before["failed"]  # no capture fell back to launches
    assert launched.graph_counts() == {"captured": 0, "replayed": 0, "evicted": 0, "failed": 0}
