"""Sliding-window attention in the paged attention step: the op
(torch.ops.ssd.paged_attention's ``window``) against the dense reference,
bitwise batch invariance under a window, and every model backend's step
against the cpu backend. Query at position i attends keys i - window < j <= i.
"""
from __future__ import annotations

import pytest
import torch

from ssd import _C
from tests.reference.paged_attention_ref import paged_attention_ref, random_paged_cache

NUM_KV_HEADS = 2


def make_inputs(group: int, head_dim: int, block_size: int, seed: int, device: str = "cpu"):
    """A mixed batch over three sequences, rows interleaved: a prefill (positions
    0..39), a 6-token chunk at 30..35 on a cached prefix and a decode at 3."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = random_paged_cache([40, 36, 4], block_size, NUM_KV_HEADS, head_dim, g)
    seqs = [torch.full((40,), 0), torch.full((6,), 1), torch.tensor([2])]
    poss = [torch.arange(40), torch.arange(30, 36), torch.tensor([3])]
    order = torch.randperm(47, generator=g)
    seq_of_token = torch.cat(seqs)[order].to(torch.int32)
    positions = torch.cat(poss)[order].to(torch.int32)
    heads = NUM_KV_HEADS * group
    q = torch.randn(47, heads, head_dim, generator=g)
    to = lambda t: t.to(device)  # noqa: E731
    return (to(q), to(k_cache), to(v_cache), to(tables), to(seq_of_token), to(positions), head_dim**-0.5)


def run(args, window: int | None) -> torch.Tensor:
    out = torch.full_like(args[0], float("nan"))
    if window is None:
        torch.ops.ssd.paged_attention(*args, out)
    else:
        torch.ops.ssd.paged_attention(*args, out, window)
    return out


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 5, 16, 17, 37])
@pytest.mark.parametrize("group,head_dim,block_size", [(1, 64, 16), (4, 128, 8), (3, 40, 16)])
def test_window_matches_reference(device, window, group, head_dim, block_size):
    if device == "cuda" and head_dim not in (64, 128):
        pytest.skip("the CUDA op takes head_dim 64 and 128")
    args = make_inputs(group, head_dim, block_size, seed=window * 100 + group, device=device)
    got = run(args, window).cpu()
    cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    want = paged_attention_ref(*cpu_args, window=window).float()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # Negative control: the window changes the answer (positions reach 39).
    assert (got - paged_attention_ref(*cpu_args).float()).abs().max() > 1e-2


def test_window_zero_or_wider_than_the_sequence_is_full_attention():
    args = make_inputs(2, 64, 16, seed=7)
    full = run(args, None)
    assert torch.equal(run(args, 0), full)
    assert torch.equal(run(args, 40), full)  # every query sees all its 1..40 keys


def test_window_rows_are_batch_invariant():
    """Each row alone gives bitwise the row it gives inside the mixed batch."""
    q, k, v, tables, seqs, positions, scale = make_inputs(4, 64, 16, seed=3)
    together = run((q, k, v, tables, seqs, positions, scale), 5)
    for t in range(q.shape[0]):
        alone = run((q[t:t + 1], k, v, tables, seqs[t:t + 1], positions[t:t + 1], scale), 5)
        assert torch.equal(alone[0], together[t]), f"row {t} (position {int(positions[t])})"


def test_negative_window_is_refused():
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        run(make_inputs(1, 64, 16, seed=1), -1)


# ------------------------------------------------------------ backend steps

OTHERS = [pytest.param(("cpu", "aten"), id="aten"),
          pytest.param(("cuda", "auto"), id="cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("other_placement", OTHERS)
def test_backend_steps_window_match_cpu(other_placement, head_dim):
    """rope_kv_write + paged_attention with window 3 over two sequences: every
    backend agrees with the cpu backend, and the window changes the output."""
    oracle, other = _C.testing.BackendSteps("cpu", "auto"), _C.testing.BackendSteps(*other_placement)
    hq, hkv, bs = 4, 2, 4
    positions = list(range(9)) + list(range(7))
    seqs = [0] * 9 + [1] * 7
    tables = [[3, 0, 5], [1, 4]]
    qkv = torch.randn(len(positions), (hq + 2 * hkv) * head_dim, generator=torch.Generator().manual_seed(4))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    args = (hq, hkv, inv_freq, positions, seqs, tables, 6, bs)
    want, _, _ = oracle.attention(qkv, *args, window=3)
    got, rotated, _ = (t.cpu() for t in other.attention(qkv, *args, window=3))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    full, _, _ = oracle.attention(qkv, *args)
    assert torch.equal(want[:3], full[:3])  # positions 0..2: the window holds every key
    assert (want[3:9] - full[3:9]).abs().max() > 1e-3
    # Position 8 with window 3 attends positions 6..8 alone: the reference on
    # the rotated rows of those three tokens.
    q8 = rotated[8, :hq * head_dim].view(1, hq, head_dim).double()
    k = rotated[6:9, hq * head_dim:(hq + hkv) * head_dim].view(3, hkv, head_dim).double()
    v = rotated[6:9, (hq + hkv) * head_dim:].view(3, hkv, head_dim).double()
    k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    probs = torch.softmax(torch.einsum("thd,nhd->htn", q8, k) * head_dim**-0.5, -1)
    torch.testing.assert_close(want[8].double(), torch.einsum("htn,nhd->thd", probs, v).reshape(-1),
                               rtol=1e-5, atol=1e-5)
