"""torch.ops.ssd.paged_attention against the dense reference, on CPU and (marked cuda) on GPU."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  registers torch.ops.ssd
from tests.reference.paged_attention_ref import paged_attention_ref, random_paged_cache

NUM_KV_HEADS = 2


def make_inputs(group: int, head_dim: int, block_size: int, seed: int = 0, row_pad: int = 0):
    """A mixed batch over four sequences, tokens interleaved:
    a prefill (positions 0..259), a single decode at 199, a 5-token chunk at
    120..124 on a cached prefix, and a decode at position 0.
    row_pad > 0 gives q and out rows with a stride larger than Hq * D.
    """
    g = torch.Generator().manual_seed(seed)
    seq_lens = [260, 200, 125, 1]
    k_cache, v_cache, tables = random_paged_cache(seq_lens, block_size, NUM_KV_HEADS, head_dim, g)
    seqs = [torch.full((260,), 0), torch.tensor([1]), torch.full((5,), 2), torch.tensor([3])]
    poss = [torch.arange(260), torch.tensor([199]), torch.arange(120, 125), torch.tensor([0])]
    order = torch.randperm(267, generator=g)
    seq_of_token = torch.cat(seqs)[order].to(torch.int32)
    positions = torch.cat(poss)[order].to(torch.int32)
    heads = NUM_KV_HEADS * group
    width = heads * head_dim
    q = torch.randn(267, width + row_pad, generator=g)[:, :width].view(267, heads, head_dim)
    out = torch.full((267, width + row_pad), float("nan"))[:, :width].view(267, heads, head_dim)
    return q, k_cache, v_cache, tables, seq_of_token, positions, head_dim**-0.5, out


def run(args):
    torch.ops.ssd.paged_attention(*args)
    return args[-1]


def assert_rows_alone_equal(args, batched, step=1, window=0):
    """Every `step`-th token of args run alone gives its row of `batched` bitwise."""
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, _ = args
    for t in range(0, q.shape[0], step):
        alone = torch.empty_like(q[t : t + 1])
        torch.ops.ssd.paged_attention(q[t : t + 1], k_cache, v_cache, tables, seq_of_token[t : t + 1],
                                      positions[t : t + 1], scale, alone, window)
        assert torch.equal(alone[0], batched[t]), f"token {t} at position {int(positions[t])}"


def assert_same_on_one_thread(compute, batched):
    """compute() on one thread gives `batched` bitwise."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(compute(), batched)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_matches_reference(group, head_dim, block_size):
    args = make_inputs(group, head_dim, block_size, seed=group * 1000 + head_dim + block_size, row_pad=8)
    out = run(args)
    ref = paged_attention_ref(*args[:-1])
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [40, 80])
def test_head_dims_off_the_vector_width(head_dim):
    """CPU only: head_dim that is not a multiple of 64 exercises the tail loops."""
    args = make_inputs(4, head_dim, 16, seed=head_dim)
    torch.testing.assert_close(run(args), paged_attention_ref(*args[:-1]).float(), atol=2e-5, rtol=1e-5)


def test_reference_detects_wrong_keys():
    """Negative control: a mask one position short, or two swapped blocks, is far outside the tolerance."""
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, out = args = make_inputs(4, 64, 16)
    run(args)
    short = paged_attention_ref(q, k_cache, v_cache, tables, seq_of_token, (positions - 1).clamp(min=0), scale)
    swapped = tables.clone()
    swapped[0, [2, 5]] = swapped[0, [5, 2]]
    misplaced = paged_attention_ref(q, k_cache, v_cache, swapped, seq_of_token, positions, scale)
    for wrong in (short, misplaced):
        assert not torch.allclose(out, wrong.float(), atol=2e-5, rtol=1e-5)


def test_row_independent_of_batch_and_threads():
    """Each token alone, and the batch on 1 thread, give the batch's bits exactly."""
    args = make_inputs(4, 128, 16)
    batched = run(args).clone()
    assert_same_on_one_thread(lambda: run(args), batched)
    assert_rows_alone_equal(args, batched, step=7)


def make_long_inputs(seed: int = 5):
    """Queries whose keys span many splits of 256 (kernels/cpu/attention_splits.h):
    a 5-token verify chunk at 1095..1099 and single queries at the split
    edges 255, 256, 511, 512 of a 1100-token sequence, a decode at 699 of a
    700-token one and at 0, tokens interleaved."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = random_paged_cache([1100, 700], 16, NUM_KV_HEADS, 64, g)
    positions = torch.tensor([1095, 1096, 1097, 1098, 1099, 255, 256, 511, 512, 699, 0], dtype=torch.int32)
    seq_of_token = torch.tensor([0] * 9 + [1, 1], dtype=torch.int32)
    order = torch.randperm(len(positions), generator=g)
    q = torch.randn(len(positions), NUM_KV_HEADS * 4, 64, generator=g)
    out = torch.full_like(q, float("nan"))
    return q, k_cache, v_cache, tables, seq_of_token[order], positions[order], 64**-0.5, out


@pytest.mark.parametrize("window", [0, 300, 256])
def test_keys_over_many_splits_match_reference(window):
    """Queries over up to five splits of the key range (combined partial
    results), with and without a sliding window whose first key falls
    inside a split, agree with the dense float64 reference."""
    args = make_long_inputs()
    torch.ops.ssd.paged_attention(*args, window)
    ref = paged_attention_ref(*args[:-1], window=window)
    torch.testing.assert_close(args[-1], ref.float(), atol=2e-5, rtol=1e-5)


def test_split_rows_independent_of_batch_chunk_and_threads():
    """A query whose keys span several splits has the same bits alone, inside
    its verify chunk, inside the batch, and on one thread: the splits sit at
    fixed key positions and are combined in a fixed order."""
    args = make_long_inputs(seed=6)
    batched = run(args).clone()
    assert_same_on_one_thread(lambda: run(args), batched)
    assert_rows_alone_equal(args, batched)


@pytest.mark.parametrize("head_dim", [64, 80])
def test_bf16_cache_is_the_fp32_kernel_on_rounded_values(head_dim):
    """A bf16 cache is read by widening each value exactly: the output is
    bitwise the fp32 kernel's on the same values held in fp32, splits and
    chunks included, and close to the float64 reference."""
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, out = make_long_inputs(seed=9)
    if head_dim != 64:  # head_dim 80 takes the kernels' tail loops
        g = torch.Generator().manual_seed(10)
        q = torch.randn(q.shape[0], q.shape[1], head_dim, generator=g)
        k_cache, v_cache = (torch.randn(*k_cache.shape[:3], head_dim, generator=g) for _ in range(2))
        out = torch.empty_like(q)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    got = torch.empty_like(out)
    torch.ops.ssd.paged_attention(q, k16, v16, tables, seq_of_token, positions, scale, got)
    want = torch.empty_like(out)
    torch.ops.ssd.paged_attention(q, k16.float(), v16.float(), tables, seq_of_token, positions, scale, want)
    assert torch.equal(got, want)
    ref = paged_attention_ref(q, k16.float(), v16.float(), tables, seq_of_token, positions, scale)
    torch.testing.assert_close(got, ref.float(), atol=2e-5, rtol=1e-5)


def test_bf16_cache_must_be_bf16_on_both_sides():
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, out = make_inputs(1, 64, 16)
    with pytest.raises(RuntimeError, match="v_cache must be bfloat16 like k_cache"):
        torch.ops.ssd.paged_attention(q, k_cache.bfloat16(), v_cache, tables, seq_of_token, positions, scale, out)


def test_opcheck():
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, out = make_inputs(4, 64, 16)
    keep = slice(0, 24)
    args = (q[keep].contiguous(), k_cache, v_cache, tables, seq_of_token[keep], positions[keep], scale,
            torch.empty_like(q[keep]))
    torch.library.opcheck(torch.ops.ssd.paged_attention.default, args)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.__setitem__(0, a[0].double()), "q must be float32"),
        (lambda a: a.__setitem__(2, a[2][:-1]), "same shape"),
        (lambda a: a.__setitem__(3, a[3].long()), "block_tables must be int32"),
        (lambda a: a.__setitem__(5, a[5][:-1]), "positions must have"),
        (lambda a: a[4].__setitem__(0, 9), r"seq_of_token\[0\] = 9"),
        (lambda a: a[5].__setitem__(0, 100000), "beyond its block table"),
        (lambda a: a[5].__setitem__(0, -1), "is negative"),
        (lambda a: a[3].__setitem__((0, 0), 10**6), "is not a cache block"),
        (lambda a: a.__setitem__(7, a[7][:, :1]), "out must have"),
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
    args = make_inputs(group, head_dim, block_size, seed=group + head_dim + block_size, row_pad=8)
    expected = run(args).clone()
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    torch.testing.assert_close(run(cuda_args).cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_row_independent_of_batch():
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in make_inputs(8, 128, 16)]
    batched = run(args).clone()
    assert_rows_alone_equal(args, batched, step=5)


@pytest.mark.cuda
@pytest.mark.parametrize("window", [0, 300])
def test_cuda_splits_match_cpu_and_are_batch_invariant(window):
    """Queries over up to five splits: the CUDA kernel's partial results and
    their combine agree with the CPU's, and each query has the same bits alone
    as in the batch."""
    args = make_long_inputs(seed=8)
    torch.ops.ssd.paged_attention(*args, window)
    expected = args[-1].clone()
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    torch.ops.ssd.paged_attention(*cuda_args, window)
    out = cuda_args[-1]
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert_rows_alone_equal(cuda_args, out, window=window)


@pytest.mark.cuda
def test_cuda_bf16_cache_matches_cpu():
    """The CUDA kernel reads a bf16 cache as the CPU one does: close to the
    CPU's output over the same bf16 values, and batch-invariant."""
    q, k_cache, v_cache, tables, seq_of_token, positions, scale, out = make_long_inputs(seed=11)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    want = torch.empty_like(out)
    torch.ops.ssd.paged_attention(q, k16, v16, tables, seq_of_token, positions, scale, want)
    args = [a.cuda() for a in (q, k16, v16, tables, seq_of_token, positions)] + [scale, torch.empty_like(q).cuda()]
    got = run(args)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    assert_rows_alone_equal(args, got)
