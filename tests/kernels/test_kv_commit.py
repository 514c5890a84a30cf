"""kv_commit: the CPU op against the pure-torch reference, its errors, opcheck,
the CUDA op against the CPU op, and the commit of a real model's branch KV."""
from __future__ import annotations

import itertools

import pytest
import torch

import ssd._C  # noqa: F401  (registers torch.ops.ssd)
from tests.reference.kv_commit_ref import kv_commit_ref, sequence_kv, sequence_slots, slot_view
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_tokens

kv_commit = torch.ops.ssd.kv_commit


def random_case(layers, kv_heads, head_dim, block_size, n, seed, dtype=torch.float32, num_blocks=2):
    """A paged cache (as its slot view), separate tree pages and n commits (dst distinct)."""
    gen = torch.Generator().manual_seed(seed)
    storage = torch.randn(layers, 2, num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    tree_slots = max(n, 3)
    tree = torch.randn(layers, 2, tree_slots, kv_heads, head_dim, generator=gen).to(dtype)
    src = torch.randint(0, tree_slots, (n,), generator=gen)
    dst = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    return slot_view(storage), tree, src, dst


SHAPES = [  # (layers, kv_heads, head_dim, block_size)
    *itertools.product([1, 4], [1, 8], [64, 128], [16, 256]),
    (2, 3, 64, 16), (3, 2, 128, 256), (4, 3, 64, 256),
]


@pytest.mark.parametrize("layers,kv_heads,head_dim,block_size", SHAPES)
@pytest.mark.parametrize("n", [1, 7, 32])
def test_matches_reference(layers, kv_heads, head_dim, block_size, n):
    cache, tree, src, dst = random_case(layers, kv_heads, head_dim, block_size, n, seed=layers * 1000 + n)
    expected = kv_commit_ref(cache, tree, src, dst)
    tree_before = tree.clone()
    kv_commit(cache, tree, src, dst)
    assert torch.equal(cache, expected)
    assert torch.equal(tree, tree_before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rows_are_copied_bitwise(dtype):
    cache, tree, src, dst = random_case(2, 3, 64, 16, 9, seed=3, dtype=dtype)
    expected = kv_commit_ref(cache, tree, src, dst)
    kv_commit(cache, tree, src, dst)
    assert torch.equal(cache.view(torch.int16), expected.view(torch.int16))


def test_strided_views():
    """The cache as a layer- and slot-sliced view of a bigger pool; tree rows that are not dense."""
    gen = torch.Generator().manual_seed(5)
    pool = torch.randn(3, 2, 4, 16, 2, 64, generator=gen)
    cache = slot_view(pool[1:3])[:, :, 8:40]
    wide = torch.randn(2, 2, 10, 2, 96, generator=gen)
    tree = wide[..., :64]  # head_dim sliced: rows are not contiguous
    src, dst = torch.tensor([9, 0, 4]), torch.tensor([31, 0, 17])
    expected_pool = pool.clone()
    slot_view(expected_pool[1:3])[:, :, 8:40] = kv_commit_ref(cache, tree, src, dst)
    kv_commit(cache, tree, src, dst)
    assert torch.equal(pool, expected_pool)


def test_tree_pages_inside_the_cache():
    """Source and destination slots of one storage overlap: every row is read before any is written."""
    gen = torch.Generator().manual_seed(11)
    cache = torch.randn(2, 2, 12, 2, 64, generator=gen)
    src, dst = torch.tensor([3, 4, 5, 6]), torch.tensor([4, 5, 6, 7])  # each dst is the next src
    expected = kv_commit_ref(cache, cache, src, dst)
    in_order = cache.clone()
    for s, d in zip(src.tolist(), dst.tolist()):
        in_order[:, :, d] = in_order[:, :, s]
    assert not torch.equal(in_order, expected), "negative control: an in-order copy must differ"
    kv_commit(cache, cache, src, dst)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("seed", range(20))
def test_random_commits_within_one_cache(seed):
    """Sources drawn from the destination slots themselves: swaps, chains, self-copies."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, 2, 16, 1, 64, generator=gen)
    n = int(torch.randint(1, 12, (1,), generator=gen))
    dst = torch.randperm(12, generator=gen)[:n]
    src = torch.randint(0, 12, (n,), generator=gen)
    expected = kv_commit_ref(cache, cache, src, dst)
    kv_commit(cache, cache, src, dst)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("view,src,dst", [
    (lambda c: c[:, :, 4:], [0, 1, 2, 3], [5, 6, 7, 8]),        # tree slot s is cache slot s + 4
    (lambda c: c[:, :, ::2], [1, 2, 3], [4, 6, 8]),             # tree slot s is cache slot 2s
    (lambda c: c.transpose(0, 1), [3, 4, 0], [3, 4, 1]),        # tree plane (l, k) is cache plane (k, l)
], ids=["slot_offset", "every_other_slot", "planes_swapped"])
def test_tree_as_another_view_of_the_cache(view, src, dst):
    cache = torch.randn(2, 2, 12, 2, 64, generator=torch.Generator().manual_seed(12))
    expected = kv_commit_ref(cache, view(cache), torch.tensor(src), torch.tensor(dst))
    kv_commit(cache, view(cache), torch.tensor(src), torch.tensor(dst))
    assert torch.equal(cache, expected)


def test_empty_commit_changes_nothing():
    cache, tree, _, _ = random_case(2, 2, 64, 16, 0, seed=1)
    before = cache.clone()
    kv_commit(cache, tree, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
    assert torch.equal(cache, before)


@pytest.mark.parametrize("src,dst,message", [
    ([0, 40], [1, 2], r"src_slots\[1\] = 40 is outside the tree's slots \[0, 32\)"),
    ([-1, 0], [1, 2], r"src_slots\[0\] = -1 is outside"),
    ([0, 1, 2], [5, 32, 7], r"dst_slots\[1\] = 32 is outside the cache's slots \[0, 32\)"),
    ([0, 1, 2], [5, 6, -3], r"dst_slots\[2\] = -3 is outside"),
    ([0, 1, 2, 3], [5, 6, 7, 6], r"dst_slots\[3\] = 6 repeats dst_slots\[1\]"),
    ([0, 1, 99], [5, 5, 7], r"dst_slots\[1\] = 5 repeats dst_slots\[0\]"),  # first bad index wins
])
def test_bad_indices_raise_and_change_nothing(src, dst, message):
    cache, tree, _, _ = random_case(2, 2, 64, 16, 32, seed=2, num_blocks=2)
    before = cache.clone()
    src_t, dst_t = torch.tensor(src), torch.tensor(dst)
    with pytest.raises(ValueError, match=message):
        kv_commit_ref(cache, tree, src_t, dst_t)
    with pytest.raises(ValueError, match=message):
        kv_commit(cache, tree, src_t, dst_t)
    assert torch.equal(cache, before)


def test_bad_arguments_are_named():
    cache, tree, src, dst = random_case(2, 2, 64, 16, 4, seed=4)
    with pytest.raises(RuntimeError, match="tree must be"):
        kv_commit(cache, tree[0], src, dst)
    with pytest.raises(RuntimeError, match="tree is BFloat16 but cache is Float"):
        kv_commit(cache, tree.bfloat16(), src, dst)
    with pytest.raises(RuntimeError, match="must agree in layers, kv_heads and head_dim"):
        kv_commit(cache, tree[:1], src, dst)
    with pytest.raises(RuntimeError, match="src_slots must be a 1-D int64"):
        kv_commit(cache, tree, src.int(), dst)
    with pytest.raises(RuntimeError, match="src_slots has 3 entries but dst_slots has 4"):
        kv_commit(cache, tree, src[:3], dst)
    with pytest.raises(RuntimeError, match="cache is written in place"):
        kv_commit(cache.transpose(3, 4), tree.transpose(3, 4), src, dst)


def test_opcheck():
    cache, tree, src, dst = random_case(2, 3, 64, 16, 5, seed=6)
    torch.library.opcheck(kv_commit.default, (cache, tree, src, dst))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("aliased", [False, True])
def test_cuda_matches_cpu(dtype, aliased):
    cache, tree, src, dst = random_case(4, 8, 128, 16, 32, seed=7, dtype=dtype)
    if aliased:
        tree, src = cache, torch.roll(dst, 1)
    cache_gpu = cache.cuda()
    tree_gpu = cache_gpu if aliased else tree.cuda()
    kv_commit(cache, tree, src, dst)
    kv_commit(cache_gpu, tree_gpu, src.cuda(), dst.cuda())
    assert torch.equal(cache_gpu.cpu(), cache)


@pytest.mark.cuda
def test_cuda_unaligned_rows_and_errors():
    cache, tree, src, dst = random_case(2, 3, 64, 16, 6, seed=8, dtype=torch.float16)
    cache, tree = cache[..., 1:].contiguous(), tree[..., 1:].contiguous()  # rows of 189 halves: 2-byte units
    cache_gpu, tree_gpu = cache.cuda(), tree.cuda()
    kv_commit(cache, tree, src, dst)
    kv_commit(cache_gpu, tree_gpu, src.cuda(), dst.cuda())
    assert torch.equal(cache_gpu.cpu(), cache)
    bad_dst = torch.tensor([1, 2, 3, 4, 2, 6])
    with pytest.raises(ValueError) as cpu_error:
        kv_commit(cache, tree, src, bad_dst)
    before = cache_gpu.clone()
    with pytest.raises(ValueError) as gpu_error:
        kv_commit(cache_gpu, tree_gpu, src.cuda(), bad_dst.cuda())
    assert str(gpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]
    assert torch.equal(cache_gpu, before)


# --- the commit of a real model's branch ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    import ssd.models

    spec = TinySpec(num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=64, vocab_size=128)
    model_dir, _ = build_tiny_model(spec, tmp_path_factory.mktemp("kv_commit_model"))
    return ssd.models.load(model_dir).core_model()


@pytest.mark.parametrize("tree_pages", ["same_cache", "own_cache"])
@pytest.mark.parametrize("block_size,prefix_len", [(4, 6), (16, 13)])
def test_committed_branch_equals_a_plain_forward(tiny_model, tree_pages, block_size, prefix_len):
    """Branch (c, y1, y2) after prefix + x1, decoded in tree pages, is committed
    into the main sequence's slots: its KV and the logits that follow equal a
    plain forward over prefix + x1 + c + y1 + y2, bitwise."""
    runner = ssd._C.SequenceRunner(tiny_model, 32, block_size, 1)
    tree_runner = (runner if tree_pages == "same_cache"
                   else ssd._C.SequenceRunner(tiny_model, 32, block_size, 1))
    prefix = random_tokens(prefix_len, 128, seed=block_size)
    x1, *branch = random_tokens(4, 128, seed=100 + block_size)  # branch: c, y1, y2
    placeholders, more = random_tokens(3, 128, seed=200), random_tokens(2, 128, seed=300)
    final = prefix + [x1] + branch

    main = runner.add_sequence()
    runner.extend([(main, prefix + [x1])])
    runner.extend([(main, placeholders)])  # reserves the slots the branch is committed into
    tree_seq = tree_runner.add_sequence()
    tree_runner.extend([(tree_seq, prefix + [x1])])
    for token in branch:  # decoded one step at a time, as a tree decode does
        tree_runner.extend([(tree_seq, [token])])

    plain_runner = ssd._C.SequenceRunner(tiny_model, 32, block_size, 1)
    plain = plain_runner.add_sequence()
    plain_runner.extend([(plain, final)])
    expected_kv = sequence_kv(plain_runner.cache_storage(), plain_runner.block_table(plain), len(final))

    def main_kv():
        return sequence_kv(runner.cache_storage(), runner.block_table(main), len(final))

    assert not torch.equal(main_kv(), expected_kv), "negative control: placeholders' KV must differ"
    positions = range(prefix_len + 1, len(final))
    src = sequence_slots(tree_runner.block_table(tree_seq), positions, block_size)
    dst = sequence_slots(runner.block_table(main), positions, block_size)
    kv_commit(slot_view(runner.cache_storage()), slot_view(tree_runner.cache_storage()),
              torch.tensor(src), torch.tensor(dst))

    assert torch.equal(main_kv(), expected_kv)
    assert torch.equal(runner.extend([(main, more)]), plain_runner.extend([(plain, more)]))
