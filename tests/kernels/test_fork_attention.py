"""torch.ops.ssd.fork_attention against dense tree attention with an explicit mask."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.reference.paged_attention_ref import fork_attention_ref, gather_positions, random_paged_cache

NUM_KV_HEADS = 2
K = 4  # draft tokens per round: paths hold up to K + 1 slots


def make_inputs(group: int, head_dim: int, block_size: int, seed: int = 0):
    """Branches of three sequences (lengths 300, 40, 130), interleaved: per sequence,
    branches forking after each of the last K + 1 positions (ragged prefix_len),
    with path lengths cycling through 1..K+1, plus one branch with an empty prefix.
    Path slots past path_len hold NaN, so reading them would show.
    """
    g = torch.Generator().manual_seed(seed)
    seq_lens = [300, 40, 130]
    k_cache, v_cache, tables = random_paged_cache(seq_lens, block_size, NUM_KV_HEADS, head_dim, g)
    branch_seq, prefix_len = [1], [0]
    for s, n in enumerate(seq_lens):
        for j in range(K + 1):
            branch_seq += [s, s]
            prefix_len += [n - K + j, n - K + j]
    branches = len(branch_seq)
    order = torch.randperm(branches, generator=g)
    branch_seq = torch.tensor(branch_seq, dtype=torch.int32)[order]
    prefix_len = torch.tensor(prefix_len, dtype=torch.int32)[order]
    path_len = (torch.arange(branches, dtype=torch.int32) % (K + 1)) + 1
    path_k = torch.randn(branches, K + 1, NUM_KV_HEADS, head_dim, generator=g)
    path_v = torch.randn(branches, K + 1, NUM_KV_HEADS, head_dim, generator=g)
    unused = torch.arange(K + 1)[None, :] >= path_len[:, None]
    path_k[unused] = float("nan")
    path_v[unused] = float("nan")
    q = torch.randn(branches, NUM_KV_HEADS * group, head_dim, generator=g)
    out = torch.full_like(q, float("nan"))
    return q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k, path_v, path_len, head_dim**-0.5, out


def run(args):
    torch.ops.ssd.fork_attention(*args)
    return args[-1]


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_matches_tree_mask_reference(group, head_dim, block_size):
    args = make_inputs(group, head_dim, block_size, seed=group * 1000 + head_dim + block_size)
    out = run(args)
    ref = fork_attention_ref(*args[:-1])
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=1e-5)


def test_reference_detects_wrong_keys():
    """Negative control: seeing one prefix position less, or another branch's path, is far outside the tolerance."""
    q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k, path_v, path_len, scale, out = args = make_inputs(
        4, 64, 16)
    run(args)
    short = fork_attention_ref(q, k_cache, v_cache, tables, branch_seq, (prefix_len - 1).clamp(min=0), path_k,
                               path_v, path_len, scale)
    rolled = fork_attention_ref(q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k.roll(1, 0),
                                path_v.roll(1, 0), path_len.roll(1, 0), scale)
    for wrong in (short, rolled):
        assert not torch.allclose(out, wrong.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 256])
def test_equals_paged_attention_bitwise(block_size):
    """A branch gives exactly the bits paged attention gives when its path is
    written into the cache right after its prefix (same keys, same order)."""
    q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k, path_v, path_len, scale, out = args = make_inputs(
        4, 128, block_size, seed=7)
    run(args)
    for b in range(q.shape[0]):
        s, prefix, path = int(branch_seq[b]), int(prefix_len[b]), int(path_len[b])
        caches = []
        for cache, p in ((k_cache, path_k), (v_cache, path_v)):
            keys = torch.cat([gather_positions(cache, tables[s], prefix), p[b, :path]])
            blocks = -(-keys.shape[0] // block_size)
            padded = torch.zeros(blocks * block_size, *keys.shape[1:])
            padded[: keys.shape[0]] = keys
            caches.append(padded.view(blocks, block_size, *keys.shape[1:]))
        table = torch.arange(caches[0].shape[0], dtype=torch.int32)[None]
        alone = torch.empty_like(q[b : b + 1])
        torch.ops.ssd.paged_attention(q[b : b + 1], caches[0], caches[1], table, torch.zeros(1, dtype=torch.int32),
                                      torch.tensor([prefix + path - 1], dtype=torch.int32), scale, alone)
        assert torch.equal(alone[0], out[b]), f"branch {b}"


def test_branch_independent_of_batch_and_threads():
    q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k, path_v, path_len, scale, out = args = make_inputs(
        8, 64, 16, seed=3)
    batched = run(args).clone()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run(args), batched)
    finally:
        torch.set_num_threads(threads)
    for b in range(q.shape[0]):
        one = slice(b, b + 1)
        alone = torch.empty_like(q[one])
        torch.ops.ssd.fork_attention(q[one], k_cache, v_cache, tables, branch_seq[one], prefix_len[one],
                                     path_k[one], path_v[one], path_len[one], scale, alone)
        assert torch.equal(alone[0], batched[b]), f"branch {b}"


def test_opcheck():
    args = list(make_inputs(4, 64, 16))
    args[-1] = torch.empty_like(args[0])
    torch.library.opcheck(torch.ops.ssd.fork_attention.default, tuple(args))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.__setitem__(6, a[6].double()), "path_k must be float32"),
        (lambda a: a.__setitem__(7, a[7][:, :-1].contiguous()), "same shape"),
        (lambda a: a.__setitem__(slice(6, 8), [a[6][:-1], a[7][:-1]]), r"path_k must be \[branches="),
        (lambda a: a.__setitem__(4, a[4][:-1]), "branch_seq must have"),
        (lambda a: a[4].__setitem__(0, 3), r"branch_seq\[0\] = 3"),
        (lambda a: a[8].__setitem__(0, 0), r"path_len\[0\] = 0"),
        (lambda a: a[8].__setitem__(0, K + 2), r"path_len\[0\] = 6"),
        (lambda a: a[5].__setitem__(0, -2), "is negative"),
        (lambda a: a[5].__setitem__(0, 10**5), "beyond its block table"),
        (lambda a: a.__setitem__(2, a[2][..., :32]), "same shape"),
    ],
)
def test_rejects_bad_arguments(change, message):
    args = list(make_inputs(1, 64, 16))
    change(args)
    with pytest.raises(RuntimeError, match=message):
        run(args)


@pytest.mark.cuda
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_cuda_matches_cpu(group, head_dim, block_size):
    args = make_inputs(group, head_dim, block_size, seed=group + head_dim + block_size)
    expected = run(args).clone()
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    torch.testing.assert_close(run(cuda_args).cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_branch_independent_of_batch():
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in make_inputs(8, 128, 16, seed=5)]
    q, k_cache, v_cache, tables, branch_seq, prefix_len, path_k, path_v, path_len, scale, out = args
    batched = run(args).clone()
    for b in range(q.shape[0]):
        one = slice(b, b + 1)
        alone = torch.empty_like(q[one])
        torch.ops.ssd.fork_attention(q[one], k_cache, v_cache, tables, branch_seq[one], prefix_len[one],
                                     path_k[one], path_v[one], path_len[one], scale, alone)
        assert torch.equal(alone[0], batched[b]), f"branch {b}"
