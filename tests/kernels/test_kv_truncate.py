"""kv_truncate: the CPU op against the pure-torch reference on states with
shared prefix pages, its errors, opcheck, the CUDA op against the CPU op, and
the rollback of a real model's speculation."""
from __future__ import annotations

import pytest
import torch

import ssd._C  # noqa: F401  (registers torch.ops.ssd)
from tests.reference.kv_commit_ref import sequence_kv
from tests.reference.kv_truncate_ref import freed_blocks, kv_truncate_ref
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_tokens

kv_truncate = torch.ops.ssd.kv_truncate


def as_state(tables: list[list[int]], lens: list[int], refcount: list[int]):
    """(block_tables [S, max_blocks] int32, seq_lens [S] int32, block_refcount [blocks] int32)."""
    width = max(len(t) for t in tables)
    padded = [t + [-1] * (width - len(t)) for t in tables]
    return (torch.tensor(padded, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
            torch.tensor(refcount, dtype=torch.int32))


def random_state(gen: torch.Generator, num_seqs: int, max_blocks: int, block_size: int):
    """Sequences that may fork a prefix of an earlier one (sharing its first
    blocks, refcount + 1 each); some blocks carry extra references held elsewhere."""
    num_blocks = num_seqs * max_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32)
    lens = torch.zeros(num_seqs, dtype=torch.int32)
    refcount = torch.randint(0, 2, (num_blocks,), generator=gen, dtype=torch.int32) * (
        torch.rand(num_blocks, generator=gen) < 0.1)
    for s in range(num_seqs):
        length = int(torch.randint(0, max_blocks * block_size + 1, (1,), generator=gen))
        used = -(-length // block_size)
        shared = 0
        if s > 0 and torch.rand(1, generator=gen) < 0.6:
            parent = int(torch.randint(0, s, (1,), generator=gen))
            parent_blocks = int((tables[parent] != -1).sum())
            shared = int(torch.randint(0, min(used, parent_blocks) + 1, (1,), generator=gen))
            tables[s, :shared] = tables[parent, :shared]
        for j in range(shared, used):
            tables[s, j] = free.pop()
        refcount[tables[s, :used].long()] += 1
        lens[s] = length
    return tables, lens, refcount


def random_request(gen: torch.Generator, lens: torch.Tensor):
    count = int(torch.randint(0, lens.numel() + 1, (1,), generator=gen))
    seq_ids = torch.randperm(lens.numel(), generator=gen)[:count]
    new_lens = [int(torch.randint(0, int(lens[s]) + 1, (1,), generator=gen)) for s in seq_ids.tolist()]
    return seq_ids, torch.tensor(new_lens, dtype=torch.long)


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("seed", range(40))
def test_matches_reference(block_size, seed):
    gen = torch.Generator().manual_seed(seed)
    tables, lens, refcount = random_state(gen, num_seqs=6, max_blocks=5, block_size=block_size)
    seq_ids, new_lens = random_request(gen, lens)
    expected = kv_truncate_ref(tables, lens, refcount, seq_ids, new_lens, block_size)
    kv_truncate(tables, lens, refcount, seq_ids, new_lens, block_size)
    for got, want in zip((tables, lens, refcount), expected):
        assert torch.equal(got, want)


def test_shared_prefix_pages_are_released_by_their_last_holder():
    # Sequence 1 forked sequence 0 after two full blocks: blocks 0 and 1 are shared.
    tables, lens, refcount = as_state([[0, 1, 2], [0, 1, 3, 4]], [10, 15], [2, 2, 1, 1, 1])
    steps = [  # (seq_ids, new_lens, freed blocks, refcount after)
        ([1], [5], [3, 4], [2, 2, 1, 0, 0]),
        ([1], [3], [], [2, 1, 1, 0, 0]),          # shared block 1: 2 -> 1, not freed
        ([0], [0], [1, 2], [1, 0, 0, 0, 0]),      # block 0 is still held by sequence 1
        ([1], [0], [0], [0, 0, 0, 0, 0]),
    ]
    for seq_ids, new_lens, freed, after in steps:
        before = refcount.clone()
        kv_truncate(tables, lens, refcount, torch.tensor(seq_ids), torch.tensor(new_lens), 4)
        assert freed_blocks(before, refcount) == freed
        assert refcount.tolist() == after
    assert tables.eq(-1).all() and lens.eq(0).all()


def test_both_forks_release_a_shared_page_in_one_call():
    tables, lens, refcount = as_state([[0, 1, 2], [0, 1, 3]], [12, 12], [2, 2, 1, 1])
    kv_truncate(tables, lens, refcount, torch.tensor([1, 0]), torch.tensor([4, 3]), 4)
    assert refcount.tolist() == [2, 0, 0, 0]
    assert tables.tolist() == [[0, -1, -1], [0, -1, -1]] and lens.tolist() == [3, 4]


def test_length_on_a_block_boundary_keeps_exactly_its_blocks():
    tables, lens, refcount = as_state([[5, 6, 7]], [12], [0, 0, 0, 0, 0, 1, 1, 1])
    kv_truncate(tables, lens, refcount, torch.tensor([0]), torch.tensor([8]), 4)
    assert tables.tolist() == [[5, 6, -1]] and refcount[7] == 0
    kv_truncate(tables, lens, refcount, torch.tensor([0]), torch.tensor([8]), 4)  # same length: no-op
    assert tables.tolist() == [[5, 6, -1]] and refcount.tolist() == [0, 0, 0, 0, 0, 1, 1, 0]


ERROR_CASES = [  # (tables, lens, refcount, seq_ids, new_lens, message)
    ([[0, 1]], [8], [1, 1], [1], [2], r"seq_ids\[0\] = 1 is outside the block tables' rows \[0, 1\)"),
    ([[0, 1], [2, 3]], [8, 8], [1, 1, 1, 1], [1, 1], [2, 2], r"seq_ids\[1\] = 1 repeats seq_ids\[0\]"),
    ([[0, 1]], [8], [1, 1], [0], [9], r"new_lens\[0\] = 9 is outside \[0, 8\]"),
    ([[0, 1]], [8], [1, 1], [0], [-1], r"new_lens\[0\] = -1 is outside \[0, 8\]"),
    ([[0, 1], [2, 7]], [8, 8], [1, 1, 1, 1], [0, 1], [0, 3],
     r"the block table of seq_ids\[1\] holds block 7 outside \[0, 4\)"),
    ([[0, -2]], [8], [1, 1], [0], [0], r"holds block -2 outside"),
    ([[0, 1], [2, 3]], [8, 8], [1, 1, 1, 0], [0, 1], [0, 0],
     r"releasing the blocks of seq_ids\[1\] would drive the refcount of block 3 below 0"),
    # A shared page with one reference, released by both forks: the call as a whole underflows it,
    # and the first item releasing it is named.
    ([[0, 1], [0, 2]], [8, 8], [1, 1, 1], [0, 1], [0, 0],
     r"releasing the blocks of seq_ids\[0\] would drive the refcount of block 0 below 0"),
]


@pytest.mark.parametrize("tables,lens,refcount,seq_ids,new_lens,message", ERROR_CASES)
def test_invalid_requests_raise_and_change_nothing(tables, lens, refcount, seq_ids, new_lens, message):
    state = as_state(tables, lens, refcount)
    before = [t.clone() for t in state]
    request = (torch.tensor(seq_ids), torch.tensor(new_lens), 4)
    with pytest.raises(ValueError, match=message):
        kv_truncate_ref(*state, *request)
    with pytest.raises(ValueError, match=message):
        kv_truncate(*state, *request)
    for got, want in zip(state, before):
        assert torch.equal(got, want)


def test_bad_arguments_are_named():
    tables, lens, refcount = as_state([[0, 1]], [8], [1, 1])
    ids, new = torch.tensor([0]), torch.tensor([1])
    with pytest.raises(RuntimeError, match="block_tables must be a 2-D Int"):
        kv_truncate(tables.long(), lens, refcount, ids, new, 4)
    with pytest.raises(RuntimeError, match="seq_ids must be a 1-D Long"):
        kv_truncate(tables, lens, refcount, ids.int(), new, 4)
    with pytest.raises(RuntimeError, match="seq_lens has 2 entries but block_tables has 1 rows"):
        kv_truncate(tables, torch.zeros(2, dtype=torch.int32), refcount, ids, new, 4)
    with pytest.raises(RuntimeError, match="updated in place and must be contiguous"):
        kv_truncate(torch.zeros(3, 2, dtype=torch.int32).t(), lens, refcount, ids, new, 4)
    with pytest.raises(ValueError, match="block_size must be > 0, got 0"):
        kv_truncate(tables, lens, refcount, ids, new, 0)


def test_opcheck():
    gen = torch.Generator().manual_seed(1)
    tables, lens, refcount = random_state(gen, num_seqs=4, max_blocks=3, block_size=16)
    seq_ids = torch.tensor([2, 0])
    new_lens = lens[seq_ids].long() // 2
    torch.library.opcheck(kv_truncate.default, (tables, lens, refcount, seq_ids, new_lens, 16))


@pytest.mark.cuda
@pytest.mark.parametrize("seed", range(8))
def test_cuda_matches_cpu(seed):
    gen = torch.Generator().manual_seed(seed)
    state = random_state(gen, num_seqs=64, max_blocks=40, block_size=16)
    request = random_request(gen, state[1])
    state_gpu = [t.cuda() for t in state]
    kv_truncate(*state, *request, 16)
    kv_truncate(*state_gpu, *(t.cuda() for t in request), 16)
    for got, want in zip(state_gpu, state):
        assert torch.equal(got.cpu(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("case", ERROR_CASES)
def test_cuda_errors_match_cpu(case):
    *state_lists, seq_ids, new_lens, message = case
    state = [t.cuda() for t in as_state(*state_lists)]
    before = [t.clone() for t in state]
    with pytest.raises(ValueError, match=message):
        kv_truncate(*state, torch.tensor(seq_ids).cuda(), torch.tensor(new_lens).cuda(), 4)
    for got, want in zip(state, before):
        assert torch.equal(got, want)


# --- the rollback of a real model's speculation ------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    import ssd.models

    spec = TinySpec(num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=64, vocab_size=128, seed=1)
    model_dir, _ = build_tiny_model(spec, tmp_path_factory.mktemp("kv_truncate_model"))
    return ssd.models.load(model_dir).core_model()


def runner_state(runner, seqs: list[int], num_blocks: int):
    """The op's view of a runner's sequences: (block_tables, seq_lens, block_refcount)."""
    tables = [runner.block_table(s) for s in seqs]
    refcount = [0] * num_blocks
    for table in tables:
        for block in table:
            refcount[block] += 1
    lens = [runner.length(s) for s in seqs]
    return as_state([t + [-1] * (num_blocks - len(t)) for t in tables], lens, refcount)


def plain_forward(model, tokens: list[int], block_size: int):
    """A fresh runner holding one sequence prefilled with ``tokens`` in one forward."""
    runner = ssd._C.SequenceRunner(model, 32, block_size, 1)
    seq = runner.add_sequence()
    runner.extend([(seq, tokens)])
    return runner, seq


@pytest.mark.parametrize("block_size,prefix_len", [(4, 6), (4, 8), (16, 14)])
def test_rollback_equals_a_plain_forward(tiny_model, block_size, prefix_len):
    """Two sequences verify 3 drafted tokens each and accept 1 and 0: after
    kv_truncate their valid KV equals a plain forward over what they kept, and
    re-extending gives the plain forward's logits, bitwise."""
    num_blocks = 32
    runner = ssd._C.SequenceRunner(tiny_model, num_blocks, block_size, 1)
    prompts = [random_tokens(prefix_len, 128, seed=s) for s in (1, 2)]
    drafts = [random_tokens(3, 128, seed=s) for s in (3, 4)]
    accepted = [1, 0]
    seqs = [runner.add_sequence() for _ in prompts]
    runner.extend([(s, p) for s, p in zip(seqs, prompts)])
    runner.extend([(s, d) for s, d in zip(seqs, drafts)])  # the verify forward

    tables, lens, refcount = runner_state(runner, seqs, num_blocks)
    refcount_before = refcount.clone()
    new_lens = [prefix_len + a for a in accepted]
    kv_truncate(tables, lens, refcount, torch.tensor([0, 1]), torch.tensor(new_lens), block_size)
    free_before = runner.num_free_blocks
    for s, n in zip(seqs, new_lens):
        runner.truncate(s, n)
    assert runner_state(runner, seqs, num_blocks)[0].tolist() == tables.tolist()
    assert lens.tolist() == new_lens
    assert len(freed_blocks(refcount_before, refcount)) == runner.num_free_blocks - free_before

    more = random_tokens(2, 128, seed=5)
    for i, s in enumerate(seqs):
        kept = prompts[i] + drafts[i][:accepted[i]]
        plain_runner, plain = plain_forward(tiny_model, kept, block_size)
        blocks = [b for b in tables[i].tolist() if b != -1]
        expected = sequence_kv(plain_runner.cache_storage(), plain_runner.block_table(plain), len(kept))
        assert torch.equal(sequence_kv(runner.cache_storage(), blocks, len(kept)), expected)
        assert torch.equal(runner.extend([(s, more)]), plain_runner.extend([(plain, more)]))

    unrolled, seq = plain_forward(tiny_model, prompts[0] + drafts[0], block_size)
    plain_runner, plain = plain_forward(tiny_model, prompts[0] + drafts[0][:1], block_size)
    assert not torch.equal(unrolled.extend([(seq, more)]), plain_runner.extend([(plain, more)])), \
        "negative control: without the rollback the logits differ"
