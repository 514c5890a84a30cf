"""The model backend's steps (csrc/model/backend.h) one by one against the cpu
backend, the oracle: the aten reference on the CPU here, the cuda backend where
there is a GPU. Each step must agree with the oracle within fp32 rounding, and a
matrix product's row must be bitwise the same alone and inside any batch (the
property greedy sd = ar rests on)."""
from __future__ import annotations

import pytest
import torch

from ssd import _C

# (device, backend argument) of the backends under test
OTHERS = [pytest.param(("cpu", "aten"), id="aten"),
          pytest.param(("cuda", "auto"), id="cuda", marks=pytest.mark.cuda)]

# k: multiples of 8 take the cuda kernel's vector path, the others its scalar
# path; 264 = one full 256-wide sweep plus a tail.
# m picks the cuda kernel's rows per weight load (1, 2, 4, 8, 16, 32): 70 is two groups of 32
# and one of 6.
LINEAR_SHAPES = [(1, 7, 8), (3, 64, 72), (5, 300, 256), (17, 33, 264), (40, 96, 100), (70, 40, 264)]


@pytest.fixture(scope="module", params=OTHERS)
def other(request):
    return _C.testing.BackendSteps(*request.param)


@pytest.fixture(scope="module")
def oracle():
    steps = _C.testing.BackendSteps("cpu", "auto")
    assert steps.name == "cpu"
    return steps


def _data(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES)
def test_linear_matches_cpu(other, oracle, m, n, k, bf16):
    x, w, b = _data(m, k, seed=1), _data(n, k, seed=2) / k ** 0.5, _data(n, seed=3)
    want = oracle.linear(x, w, b, bf16=bf16)
    got = other.linear(x, w, b, bf16=bf16).cpu()
    assert got.shape == (m, n)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The oracle is not trivially close to anything: without the bias it is off.
    assert (oracle.linear(x, w, None, bf16=bf16) - want).abs().max() > 0.1


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES[1:])
def test_linear_rows_are_batch_invariant(other, m, n, k, bf16):
    x, w = _data(m, k, seed=4), _data(n, k, seed=5)
    batch = other.linear(x, w, None, bf16=bf16).cpu()
    for r in range(m):
        alone = other.linear(x[r:r + 1], w, None, bf16=bf16).cpu()
        assert torch.equal(alone[0], batch[r]), f"row {r} of {m} differs from the row alone"
    # A row inside a larger batch of other rows, at another index.
    shuffled = torch.cat([_data(7, k, seed=6), x[:1]])
    assert torch.equal(other.linear(shuffled, w, None, bf16=bf16).cpu()[-1], batch[0])


@pytest.mark.parametrize("shape", [(5, 72), (1, 2048), (3, 4, 64)], ids=["rows", "wide", "heads"])
def test_rms_norm_matches_cpu(other, oracle, shape):
    x, w = _data(*shape, seed=7) * 3, _data(shape[-1], seed=8)
    want = oracle.rms_norm(x, w, 1e-6)
    got = other.rms_norm(x, w, 1e-6).cpu()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    # rows are normalized independently: a changed row leaves the others alone
    x2 = x.clone()
    x2.view(-1, shape[-1])[0] *= 5
    assert torch.equal(other.rms_norm(x2, w, 1e-6).cpu().view(-1, shape[-1])[1:], got.view(-1, shape[-1])[1:])


def test_silu_mul_matches_cpu(other, oracle):
    gu = _data(6, 2 * 40, seed=9) * 4
    want = oracle.silu_mul(gu)
    torch.testing.assert_close(other.silu_mul(gu).cpu(), want, rtol=1e-6, atol=1e-6)
    ref = torch.nn.functional.silu(gu[:, :40]) * gu[:, 40:]
    torch.testing.assert_close(want, ref, rtol=1e-6, atol=1e-6)


def test_unknown_device_and_backend_are_refused():
    with pytest.raises(ValueError, match="device 'tpu': expected 'cpu', 'cuda' or 'cuda:N'"):
        _C.testing.BackendSteps("tpu")
    with pytest.raises(ValueError, match="backend 'cuda': expected 'auto', 'aten' or 'cpu' for device 'cpu'"):
        _C.testing.BackendSteps("cpu", "cuda")


def test_thread_scope_runs_its_function_and_refuses_unknown_roles(oracle):
    assert oracle.in_thread_scope("target", lambda: 7) == 7
    with pytest.raises(ValueError, match="role must be 'target' or 'draft', got 'verifier'"):
        oracle.in_thread_scope("verifier", lambda: 7)


@pytest.mark.cuda
def test_target_role_streams_outrank_the_draft_roles(oracle):
    """A model's target role runs on a stream of higher priority (a lower
    number) than its draft role, neither of them the caller's stream, which is
    current again afterwards; a step inside either role still computes the
    oracle's product."""
    steps = _C.testing.BackendSteps("cuda")
    outer = torch.cuda.current_stream()
    target = steps.in_thread_scope("target", torch.cuda.current_stream)
    draft = steps.in_thread_scope("draft", torch.cuda.current_stream)
    assert torch.cuda.current_stream() == outer
    assert outer not in (target, draft) and target != draft
    least, greatest = torch.cuda.Stream.priority_range()
    assert greatest < least, f"this device has one stream priority ({least})"
    assert target.priority < draft.priority, (target.priority, draft.priority)
    # The same stream every time a thread takes the role.
    assert steps.in_thread_scope("target", torch.cuda.current_stream) == target
    x, w = _data(9, 64, seed=31), _data(24, 64, seed=32)
    for role in ("target", "draft"):
        got = steps.in_thread_scope(role, lambda: steps.linear(x, w).cpu())
        torch.testing.assert_close(got, oracle.linear(x, w), rtol=1e-5, atol=1e-5)


ATTENTION_HEAD_DIMS = [16, 64]  # 64: the cuda backend's own kernel; 16: its fallback


@pytest.mark.parametrize("head_dim", ATTENTION_HEAD_DIMS)
def test_bf16_cache_holds_rounded_keys_and_matches_cpu(other, oracle, head_dim):
    """With a bf16 cache every backend writes each rotated K / V value rounded
    to nearest even (torch's rounding: the same bits on every backend), and
    attends over those values as the cpu backend does."""
    hq, hkv, bs = 4, 2, 4
    positions = list(range(6)) + list(range(3))
    seqs = [0] * 6 + [1] * 3
    tables = [[2, 0], [3]]
    qkv = _data(len(positions), (hq + 2 * hkv) * head_dim, seed=12) * 3
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    args = (hq, hkv, inv_freq, positions, seqs, tables, 4, bs)
    want_out, want_qkv, want_cache = oracle.attention(qkv, *args, kv_dtype="bfloat16")
    out, rotated, cache = (t.cpu() for t in other.attention(qkv, *args, kv_dtype="bfloat16"))
    assert want_cache.dtype == cache.dtype == torch.bfloat16
    torch.testing.assert_close(rotated, want_qkv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    k_rows = want_qkv[:, hq * head_dim:(hq + hkv) * head_dim].reshape(-1, hkv, head_dim)
    keys = want_cache[0].reshape(-1, hkv, head_dim)
    for t, (pos, s) in enumerate(zip(positions, seqs)):
        slot = tables[s][pos // bs] * bs + pos % bs
        assert torch.equal(keys[slot], k_rows[t].bfloat16()), f"token {t}: k in slot {slot} is not k rounded"
    # The fp32 cache of the same call differs: the rounding happened.
    assert not torch.equal(oracle.attention(qkv, *args)[0], want_out)


@pytest.mark.parametrize("head_dim", ATTENTION_HEAD_DIMS)
def test_rope_kv_write_and_paged_attention_match_cpu(other, oracle, head_dim):
    """Two sequences prefilled in one call over scattered blocks: the rotated q/k,
    the cache slots and the attention output agree with the cpu backend, and
    every token's k row sits in the slot its block table names."""
    hq, hkv, bs = 4, 2, 4
    positions = list(range(5)) + list(range(7))
    seqs = [0] * 5 + [1] * 7
    tables = [[3, 0], [1, 4]]
    qkv = _data(len(positions), (hq + 2 * hkv) * head_dim, seed=10)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    args = (hq, hkv, inv_freq, positions, seqs, tables, 5, bs)
    want_out, want_qkv, want_cache = oracle.attention(qkv, *args)
    out, rotated, cache = (t.cpu() for t in other.attention(qkv, *args))
    torch.testing.assert_close(rotated, want_qkv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache, want_cache, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    keys = cache[0].reshape(-1, hkv, head_dim)
    k_rows = rotated[:, hq * head_dim:(hq + hkv) * head_dim].reshape(-1, hkv, head_dim)
    for t, (pos, s) in enumerate(zip(positions, seqs)):
        slot = tables[s][pos // bs] * bs + pos % bs
        assert torch.equal(keys[slot], k_rows[t]), f"token {t}: k not in slot {slot}"
    # Position 0 attends only to itself: its output is its own v.
    v0 = rotated[0, (hq + hkv) * head_dim:].reshape(hkv, head_dim)
    torch.testing.assert_close(out[0].reshape(hkv, hq // hkv, head_dim), v0[:, None].expand(-1, hq // hkv, -1))


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("head_dim", ATTENTION_HEAD_DIMS)
def test_fork_attention_equals_the_branch_decoded_as_its_sequence(other, oracle, head_dim, kv_dtype):
    """A sequence of 10 positions and, in the same call, branches forking from it in
    blocks of their own: A at 6 (positions 6..8), B at 9 (position 9), C at 0 (two
    positions, no prefix). A branch's rows give bitwise what paged attention gives
    them as the continuation of the sequence's first positions (its partial block at
    the fork is never copied: block 1 of A's table and block 4 of B's hold nothing of
    the sequence); every backend agrees with the cpu one."""
    hq, hkv, bs = 4, 2, 4
    g = torch.Generator().manual_seed(31)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    width = (hq + 2 * hkv) * head_dim
    seq = torch.randn(10, width, generator=g)
    branch = {"A": (6, torch.randn(3, width, generator=g)), "B": (9, torch.randn(1, width, generator=g)),
              "C": (0, torch.randn(2, width, generator=g))}
    tables = [[3, 0, 5], [3, 1, 2], [3, 0, 4], [6]]
    rows, positions, seqs, prefix_len = [seq], list(range(10)), [0] * 10, [0] * 10
    for b, (name, (fork, x)) in enumerate(branch.items()):
        rows.append(x)
        positions += range(fork, fork + len(x))
        seqs += [b + 1] * len(x)
        prefix_len += [fork] * len(x)
    qkv = torch.cat(rows)
    fork_args = (hq, hkv, inv_freq, positions, seqs, tables, 7, bs)
    fork_kwargs = dict(kv_dtype=kv_dtype, prefix_seq=[0] * len(positions), prefix_len=prefix_len)
    want = oracle.attention(qkv, *fork_args, **fork_kwargs)[0]
    got = other.attention(qkv, *fork_args, **fork_kwargs)[0].cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    first = 10
    for name, (fork, x) in branch.items():
        # The branch as the sequence itself: its first `fork` rows, then the branch's.
        alone = torch.cat([seq[:fork], x])
        args = (hq, hkv, inv_freq, list(range(fork + len(x))), [0] * (fork + len(x)), [[3, 0, 5]], 7, bs)
        for steps, out in ((oracle, want), (other, got)):
            paged = steps.attention(alone, *args, kv_dtype=kv_dtype)[0].cpu()
            assert torch.equal(out[first:first + len(x)], paged[fork:]), f"branch {name} on {steps.name}"
        first += len(x)
    # Reading the branch's own table below the fork instead gives other values.
    unforked = oracle.attention(qkv, *fork_args, kv_dtype=kv_dtype)[0]
    assert not torch.equal(unforked[10:13], want[10:13])
