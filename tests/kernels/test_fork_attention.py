"""torch.ops.ssd.fork_attention against dense tree attention with an explicit mask, and
against paged attention over a table holding the copied prefix (bitwise)."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.kernels.test_paged_attention import assert_same_on_one_thread
from tests.reference.paged_attention_ref import fork_attention_ref, random_paged_cache

NUM_KV_HEADS = 2
K = 4  # draft tokens per round: a branch's path holds up to K + 1 positions
SEQ_LENS = [300, 40, 130]


def branch_layout(block_size: int) -> list[tuple[int, int, int]]:
    """(sequence, fork position, path length) of each branch: per sequence, two branches
    forking at each of the last K + 1 positions (ragged forks), path lengths cycling
    through 1..K+1; then one branch of sequence 1 forking at 0 (no prefix)."""
    branches = []
    for s, n in enumerate(SEQ_LENS):
        for j in range(K + 1):
            for _ in range(2):
                branches.append((s, n - K + j, len(branches) % (K + 1) + 1))
    return branches + [(1, 0, 3)]


def make_inputs(group: int, head_dim: int, block_size: int, seed: int = 0, dtype=torch.float32):
    """The sequences' pages (random_paged_cache: NaN past their ends), and per branch a
    table of its own: the sequence's full blocks before the fork, then fresh blocks
    holding its path from the fork on. The fresh block at the fork holds NaN below it,
    so a key read through the wrong table shows. One query row per branch at its
    path's last position; the last branch of each sequence has a second row one
    position earlier. Returns the op's arguments (out filled with NaN) and the
    branches' (sequence, fork) pairs."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, seq_tables = random_paged_cache(SEQ_LENS, block_size, NUM_KV_HEADS, head_dim, g,
                                                      spare_blocks=0)
    kv = [k_cache, v_cache]
    tables, seq_of_token, positions, prefix_seq, prefix_len, forks = [], [], [], [], [], []
    branches = branch_layout(block_size)
    for b, (s, fork, path) in enumerate(branches):
        first, last = fork // block_size, (fork + path - 1) // block_size
        fresh = list(range(kv[0].shape[0], kv[0].shape[0] + last - first + 1))
        for i, cache in enumerate(kv):
            blocks = torch.full((len(fresh), block_size, NUM_KV_HEADS, head_dim), float("nan"))
            flat = blocks.view(-1, NUM_KV_HEADS, head_dim)
            flat[fork % block_size : fork % block_size + path] = torch.randn(path, NUM_KV_HEADS, head_dim, generator=g)
            kv[i] = torch.cat([cache, blocks])
        tables.append(seq_tables[s, :first].tolist() + fresh)
        forks.append((s, fork))
        last_of_seq = b + 1 == len(branches) or branches[b + 1][0] != s
        for pos in ([fork + path - 2] if last_of_seq and path >= 2 else []) + [fork + path - 1]:
            seq_of_token.append(len(SEQ_LENS) + b)
            positions.append(pos)
            prefix_seq.append(s)
            prefix_len.append(fork)
    width = max(seq_tables.shape[1], max(len(t) for t in tables))
    all_tables = torch.full((len(SEQ_LENS) + len(tables), width), -1, dtype=torch.int32)
    all_tables[: len(SEQ_LENS), : seq_tables.shape[1]] = seq_tables
    for b, t in enumerate(tables):
        all_tables[len(SEQ_LENS) + b, : len(t)] = torch.tensor(t, dtype=torch.int32)
    rows = len(positions)
    q = torch.randn(rows, NUM_KV_HEADS * group, head_dim, generator=g)
    ints = [torch.tensor(x, dtype=torch.int32) for x in (seq_of_token, positions, prefix_seq, prefix_len)]
    out = torch.full_like(q, float("nan"))
    args = [q, kv[0].to(dtype), kv[1].to(dtype), all_tables, *ints, head_dim**-0.5, out]
    return args, forks


def run(args, window: int = 0):
    torch.ops.ssd.fork_attention(*args, window=window)
    return args[-1]


def copied_prefix(args, forks, block_size: int):
    """The caches with each branch's fresh block at the fork holding the sequence's
    slots below the fork (what the tree did before fork attention: copy the partial block)."""
    k_cache, v_cache, tables = args[1].clone(), args[2].clone(), args[3]
    for b, (s, fork) in enumerate(forks):
        if fork % block_size == 0:
            continue
        src, dst = tables[s, fork // block_size], tables[len(SEQ_LENS) + b, fork // block_size]
        for cache in (k_cache, v_cache):
            cache[dst, : fork % block_size] = cache[src, : fork % block_size]
    return k_cache, v_cache


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_matches_tree_mask_reference(group, head_dim, block_size):
    args, _ = make_inputs(group, head_dim, block_size, seed=group * 1000 + head_dim + block_size)
    out = run(args)
    ref = fork_attention_ref(*args[:-1])
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [5, 64])
def test_sliding_window_matches_reference(window):
    args, _ = make_inputs(4, 64, 16, seed=window)
    out = run(args, window=window)
    torch.testing.assert_close(out, fork_attention_ref(*args[:-1], window=window).float(), atol=2e-5, rtol=1e-5)


def test_reference_detects_wrong_keys():
    """Negative control: a row seeing one prefix position less, or another sequence's
    prefix, is far outside the tolerance."""
    args, _ = make_inputs(4, 64, 16)
    out = run(args)
    q, k_cache, v_cache, tables, seq_of_token, positions, prefix_seq, prefix_len, scale, _ = args
    short = fork_attention_ref(q, k_cache, v_cache, tables, seq_of_token, positions, prefix_seq,
                               (prefix_len - 1).clamp(min=0), scale)
    other = fork_attention_ref(q, k_cache, v_cache, tables, seq_of_token, positions, (prefix_seq + 1) % 3,
                               torch.minimum(prefix_len, torch.tensor(40, dtype=torch.int32)), scale)
    for wrong in (short, other):
        assert not torch.allclose(out, wrong.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("block_size", [16, 256])
def test_equals_paged_attention_over_the_copied_prefix_bitwise(block_size, window, dtype):
    """A branch row gives exactly the bits paged attention gives through its own table
    once the partial block at the fork holds the sequence's slots (same keys, same
    order, same splits: the 300-key prefixes span two)."""
    args, forks = make_inputs(4, 128, block_size, seed=7, dtype=dtype)
    out = run(args, window=window).clone()
    k_copy, v_copy = copied_prefix(args, forks, block_size)
    q, _, _, tables, seq_of_token, positions, _, _, scale, _ = args
    paged = torch.full_like(q, float("nan"))
    torch.ops.ssd.paged_attention(q, k_copy, v_copy, tables, seq_of_token, positions, scale, paged, window)
    assert not out.isnan().any()
    assert torch.equal(out, paged)


def test_bf16_cache_equals_fp32_over_the_rounded_values():
    args, _ = make_inputs(4, 64, 16, seed=11, dtype=torch.bfloat16)
    bf16 = run(args).clone()
    args[1], args[2] = args[1].float(), args[2].float()
    assert torch.equal(run(args), bf16)


def assert_rows_alone_equal(args, batched):
    """Every row of args run alone gives its row of `batched` bitwise."""
    q, k_cache, v_cache, tables, seq_of_token, positions, prefix_seq, prefix_len, scale, _ = args
    for t in range(q.shape[0]):
        one = slice(t, t + 1)
        alone = torch.empty_like(q[one])
        torch.ops.ssd.fork_attention(q[one], k_cache, v_cache, tables, seq_of_token[one], positions[one],
                                     prefix_seq[one], prefix_len[one], scale, alone)
        assert torch.equal(alone[0], batched[t]), f"row {t}"


def test_row_independent_of_batch_and_threads():
    args, _ = make_inputs(8, 64, 16, seed=3)
    batched = run(args).clone()
    assert_same_on_one_thread(lambda: run(args), batched)
    assert_rows_alone_equal(args, batched)


def test_opcheck():
    args, _ = make_inputs(4, 64, 16)
    args[-1] = torch.empty_like(args[0])
    torch.library.opcheck(torch.ops.ssd.fork_attention.default, tuple(args))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.__setitem__(7, a[7].long()), "prefix_len must be int32"),
        (lambda a: a.__setitem__(6, a[6][:-1]), "prefix_seq must have"),
        (lambda a: a[6].__setitem__(0, 99), r"prefix_seq\[0\] = 99 is not a row"),
        (lambda a: a[7].__setitem__(0, 10**4), r"prefix_len\[0\] = 10000 is not in 0..positions\[0\]"),
        (lambda a: a[7].__setitem__(0, -1), r"prefix_len\[0\] = -1 is not in"),
        # forks from the 40-token sequence at 296
        (lambda a: a[6].__setitem__(0, 1), r"block_tables\[1, 3\] = -1 is not a cache block"),
        (lambda a: a[5].__setitem__(0, 10**5), "beyond its block table"),
        (lambda a: a.__setitem__(2, a[2][..., :32]), "same shape"),
    ],
)
def test_rejects_bad_arguments(change, message):
    args, _ = make_inputs(1, 64, 16)
    change(args)
    with pytest.raises(RuntimeError, match=message):
        run(args)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_cuda_matches_cpu(group, head_dim, block_size, dtype):
    args, _ = make_inputs(group, head_dim, block_size, seed=group + head_dim + block_size, dtype=dtype)
    expected = run(args, window=9).clone()
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    torch.testing.assert_close(run(cuda_args, window=9).cpu(), expected, atol=1e-5, rtol=1e-5)
    expected = run(args).clone()
    torch.testing.assert_close(run(cuda_args).cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_equals_paged_attention_over_the_copied_prefix_bitwise():
    args, forks = make_inputs(4, 128, 16, seed=5, dtype=torch.bfloat16)
    k_copy, v_copy = copied_prefix(args, forks, 16)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    out = run(args).clone()
    q, _, _, tables, seq_of_token, positions, _, _, scale, _ = args
    paged = torch.full_like(q, float("nan"))
    torch.ops.ssd.paged_attention(q, k_copy.cuda(), v_copy.cuda(), tables, seq_of_token, positions, scale, paged)
    assert torch.equal(out, paged)


@pytest.mark.cuda
def test_cuda_row_independent_of_batch():
    args, _ = make_inputs(8, 128, 16, seed=5)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    assert_rows_alone_equal(args, run(args).clone())
