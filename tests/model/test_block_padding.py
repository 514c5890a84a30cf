"""Block-table padding (csrc/model/backend.h, ForwardInput): an entry of -1 is no
block. A token whose own entry is -1 (slot -1) is padding: it writes no K / V,
attends to nothing (attention output 0), and no other row sees it. Every cache
slot a live token does not write stays bitwise the same (block 0 above all: it
is a live block of some sequence, the slot a padding value of 0 would hit),
and every live row's logits equal the same sequence run alone.

Each test runs on the cpu backend, the aten reference on the CPU and, where
there is a GPU, the cuda backend.
"""
from __future__ import annotations

import pytest
import torch

import ssd.models
from ssd import _C
from tests.model.conftest import BACKENDS, PLACEMENTS, TINY_SPEC
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_tokens

PAD = -1  # the block-table entry of no block
BS = 4
NUM_BLOCKS = 6

SPEC = TINY_SPEC  # tiny_core's (conftest.py)


def _raw(core) -> _C.testing.RawForward:
    return _C.testing.RawForward(core, NUM_BLOCKS, BS)


def test_padding_tokens_write_nothing_and_change_no_row(tiny_core):
    core = tiny_core
    """Sequence A owns blocks 0 and 1 and decodes one token; sequence C
    prefills 3 tokens in block 3 and has a padding token at position 5 (entry
    1 of its row is -1); a row of -1 only holds two dummy tokens. Only the
    live tokens' 4 slots change, and A's and C's logits equal them alone."""
    a = random_tokens(7, SPEC.vocab_size, seed=1)
    c = random_tokens(3, SPEC.vocab_size, seed=2)
    batched = _raw(core)
    batched.forward(a[:6], list(range(6)), [0] * 6, [[0, 1]], [5])
    before = batched.cache_storage().cpu().clone()  # [layers, 2, blocks, BS, kv_heads, d]
    tokens = [a[6]] + c + [c[0], 1, 2]
    positions = [6, 0, 1, 2, 5, 0, 9]
    seqs = [0, 1, 1, 1, 1, 2, 2]
    tables = [[0, 1, PAD], [3, PAD, PAD], [PAD, PAD, PAD]]
    logits = batched.forward(tokens, positions, seqs, tables, list(range(len(tokens)))).cpu()
    after = batched.cache_storage().cpu()

    assert torch.equal(after[:, :, 0], before[:, :, 0]), "block 0 (sequence A's) was written"
    untouched = torch.ones(NUM_BLOCKS, BS, dtype=torch.bool)
    for block, offset in [(1, 2), (3, 0), (3, 1), (3, 2)]:  # the live tokens' slots
        untouched[block, offset] = False
        assert not torch.equal(after[:, :, block, offset], before[:, :, block, offset])
    assert torch.equal(after[:, :, untouched], before[:, :, untouched]), "a slot no live token owns was written"

    alone_a = _raw(core)
    alone_a.forward(a[:6], list(range(6)), [0] * 6, [[0, 1]], [5])
    want_a = alone_a.forward([a[6]], [6], [0], [[0, 1]], [0]).cpu()
    want_c = _raw(core).forward(c, [0, 1, 2], [0, 0, 0], [[3]], [0, 1, 2]).cpu()
    assert torch.equal(logits[0], want_a[0]), "sequence A's decode row differs from A alone"
    assert torch.equal(logits[1:4], want_c), "sequence C's rows differ from C alone"


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_queries_attend_to_nothing(backend):
    """One layer's rope_kv_write + paged_attention (rows padded with -1 by the
    binding): padding rows' output is 0; the live rows' output and the cache
    are bitwise those of the same call without the padding rows. A padding
    row shares a run with live rows of its sequence."""
    steps = _C.testing.BackendSteps(*PLACEMENTS[backend])
    hq, hkv, d = 4, 2, 64
    tables = [[0, 1], [2], []]  # padded to [[0, 1], [2, -1], [-1, -1]]
    live_pos, live_seq = list(range(7)) + [0, 1, 2], [0] * 7 + [1] * 3
    pad_pos, pad_seq = [5, 1], [1, 2]
    qkv = torch.randn(len(live_pos) + len(pad_pos), (hq + 2 * hkv) * d, generator=torch.Generator().manual_seed(5))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    n = len(live_pos)
    rest = (hq, hkv, inv_freq)
    out, _, cache = (t.cpu() for t in steps.attention(qkv, *rest, live_pos + pad_pos, live_seq + pad_seq,
                                                      tables, NUM_BLOCKS, BS))
    want_out, _, want_cache = (t.cpu() for t in steps.attention(qkv[:n], *rest, live_pos, live_seq, tables,
                                                                NUM_BLOCKS, BS))
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), f"{backend}: a padding query attended"
    assert torch.equal(out[:n], want_out), f"{backend}: padding rows changed live rows' attention"
    assert torch.equal(cache, want_cache), f"{backend}: a padding row wrote the cache"


def test_forward_refuses_live_tokens_reading_missing_blocks(tiny_core):
    core = tiny_core
    """A live token whose attention would read a -1 entry (or any non-block) is
    refused before anything runs; an own entry other than -1 that is not a
    cache block is refused as before."""
    raw = _raw(core)
    with pytest.raises(ValueError, match=r"token 0 \(sequence 0, position 5\) attends to block-table row 0 entry 0, "
                                         r"which holds -1"):
        raw.forward([1], [5], [0], [[PAD, 1]], [0])
    with pytest.raises(ValueError, match="block id -2 is outside the KV cache"):
        raw.forward([1], [5], [0], [[0, -2]], [0])
    with pytest.raises(ValueError, match="attends to block-table row 0 entry 0, which holds 6"):
        raw.forward([1], [5], [0], [[NUM_BLOCKS, 1]], [0])
    with pytest.raises(ValueError, match="block_tables: rows differ in length"):
        raw.forward([1], [0], [0], [[0], [1, 2]], [0])
    assert torch.count_nonzero(raw.cache_storage().cpu()) == 0  # nothing was written


WINDOW_SPEC = TinySpec(arch="mistral", hidden_size=128, intermediate_size=160, num_heads=2, num_kv_heads=1,
                       vocab_size=300, num_layers=2, sliding_window=BS, seed=42)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_needs_only_the_entries_it_reads(backend, tmp_path):
    """Window 4 = one block: a token at position 9 reads positions 6..9,
    entries 1 and 2, so entry 0 may be -1 (its logits are those with entry 0
    live); a token at position 6 reads entry 0 too and is refused when it is -1."""
    model_dir, _ = build_tiny_model(WINDOW_SPEC, tmp_path)
    core = ssd.models.load(model_dir, dtype=torch.float32).core_model(*PLACEMENTS[backend])
    tokens = random_tokens(10, WINDOW_SPEC.vocab_size, seed=3)
    rows = []
    for entry0 in [0, PAD]:
        raw = _raw(core)
        raw.forward(tokens[:9], list(range(9)), [0] * 9, [[0, 1, 2]], [8])
        rows.append(raw.forward(tokens[9:], [9], [0], [[entry0, 1, 2]], [0]).cpu())
        with pytest.raises(ValueError, match="position 6\\) attends to block-table row 0 entry 0, which holds -1"):
            raw.forward([tokens[6]], [6], [0], [[PAD, 1, 2]], [0])
    assert torch.equal(rows[0], rows[1])
