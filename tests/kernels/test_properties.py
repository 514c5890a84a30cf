"""Property tests (hypothesis): every CPU kernel against its reference in tests/reference/
over random shapes, edge sizes included -- vocabularies of 1-3 tokens, head dims
that are not a multiple of 16 (odd ones too), KV blocks of one slot, empty batches.

Shapes come from hypothesis (so a failure shrinks to the smallest shape); the
values inside a shape come from a torch generator seeded by hypothesis. Each
test draws few examples, so the file runs in well under a minute.
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssd._C  # noqa: F401  registers torch.ops.ssd
from ssd import _C
from tests.reference.fork_select_ref import fork_candidates
from tests.reference.gumbel_ref import gumbel_token, gumbel_top_ref
from tests.reference.kv_commit_ref import kv_commit_ref
from tests.reference.kv_truncate_ref import kv_truncate_ref
from tests.reference.paged_attention_ref import fork_attention_ref, paged_attention_ref, random_paged_cache
from tests.reference.saguaro_sample_ref import inverse_cdf, saguaro_probs
from tests.reference.sampling_ref import processed_probs
from tests.reference.verify_ref import verify_ref

F64 = torch.float64
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

seeds = st.integers(0, 2**31 - 1)
tiny_vocab = st.integers(1, 3)
vocabs = st.one_of(tiny_vocab, st.integers(4, 300))
# Head dims around the kernels' 16-float vectors: odd, below, between and past multiples of 16.
head_dims = st.one_of(st.sampled_from([1, 2, 3, 7, 8, 15, 17, 24, 40, 72]), st.integers(1, 80))
block_sizes = st.one_of(st.just(1), st.integers(2, 5), st.just(16))
temperatures = st.one_of(st.just(0.0), st.floats(0.05, 4.0))
top_ps = st.one_of(st.just(1.0), st.floats(0.01, 1.0))


def logits_of(gen: torch.Generator, shape: tuple[int, ...], ties: bool) -> torch.Tensor:
    """Random logits; with ``ties``, few distinct values (ties at every cut)."""
    if ties:
        return torch.randint(-2, 2, shape, generator=gen).to(torch.float32)
    return torch.randn(shape, generator=gen) * 3


# ------------------------------------------------------------------ sampling


@PROPERTY
@given(vocab=vocabs, temperature=temperatures, top_k=st.integers(0, 305), top_p=top_ps, ties=st.booleans(),
       seed=seeds)
def test_process_logits(vocab, temperature, top_k, top_p, ties, seed):
    logits = logits_of(torch.Generator().manual_seed(seed), (vocab,), ties)
    got = _C.testing.process_logits(logits, temperature, top_k, top_p).double()
    want = processed_probs(logits, temperature, top_k, top_p)
    # The kept set: nothing top-k / top-p cut is kept; everything with a mass float32 holds is. (A
    # mass below float32's range, e.g. exp(-180) at a low temperature, is 0 in the op's float32 row.)
    assert not got[want == 0].any(), "kept a token the reference cuts"
    assert (got[want > 1e-30] > 0).all(), "cut a token the reference keeps"
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


row_settings = st.tuples(temperatures, st.integers(0, 305), top_ps, st.integers(0, 8),
                         st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)))


@PROPERTY
@given(vocab=vocabs, rows=st.lists(row_settings, min_size=0, max_size=5), ties=st.booleans(), seed=seeds)
def test_saguaro_sample(vocab, rows, ties, seed):
    """rows: (temperature, top_k, top_p, fanout, downweight) per row; none is the empty batch."""
    gen = torch.Generator().manual_seed(seed)
    logits = logits_of(gen, (len(rows), vocab), ties)
    uniforms = torch.rand(len(rows), generator=gen, dtype=F64)
    cols = list(zip(*rows)) if rows else [()] * 5
    probs = torch.empty_like(logits)
    tokens = torch.ops.ssd.saguaro_sample(
        logits, torch.tensor(cols[0], dtype=F64), torch.tensor(cols[1], dtype=torch.int64),
        torch.tensor(cols[2], dtype=F64), torch.tensor(cols[3], dtype=torch.int64),
        torch.tensor(cols[4], dtype=F64), uniforms, probs)
    assert tokens.shape == (len(rows),)
    for r, setting in enumerate(rows):
        torch.testing.assert_close(probs[r].double(), saguaro_probs(logits[r], *setting), atol=1e-7, rtol=1e-5)
        assert int(tokens[r]) == inverse_cdf(probs[r], float(uniforms[r])), f"row {r}"


@PROPERTY
@given(vocab=vocabs, rows=st.lists(st.tuples(temperatures, st.integers(0, 305), top_ps), min_size=0, max_size=5),
       ties=st.booleans(), key=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**40)), seed=seeds)
def test_gumbel_sample(vocab, rows, ties, key, seed):
    """rows: (temperature, top_k, top_p) of each row's processed distribution; none is the empty batch.
    The same rows through gumbel_top (the tree's ranking) at a depth from 1 to 5."""
    gen = torch.Generator().manual_seed(seed)
    logits = logits_of(gen, (len(rows), vocab), ties)
    probs = torch.stack([processed_probs(logits[r], *s).float() for r, s in enumerate(rows)]) if rows \
        else torch.empty(0, vocab)
    seeds_ = [(key[0] + r) % 2**64 for r in range(len(rows))]
    positions = [key[1] + 3 * r for r in range(len(rows))]
    as_int64 = [s - 2**64 if s >= 2**63 else s for s in seeds_]
    tokens = torch.ops.ssd.gumbel_sample(probs, torch.tensor(as_int64, dtype=torch.int64),
                                         torch.tensor(positions, dtype=torch.int64))
    assert tokens.shape == (len(rows),)
    for r in range(len(rows)):
        assert int(tokens[r]) == gumbel_token(probs[r], seeds_[r], positions[r]), f"row {r}"
    depth = 1 + seed % 5
    ids, scores = torch.ops.ssd.gumbel_top(probs, torch.tensor(as_int64, dtype=torch.int64),
                                           torch.tensor(positions, dtype=torch.int64), depth)
    assert ids.shape == scores.shape == (len(rows), depth)
    for r in range(len(rows)):
        want_ids, want_scores = gumbel_top_ref(probs[r], seeds_[r], positions[r], depth)
        assert ids[r].tolist() == want_ids + [-1] * (depth - len(want_ids)), f"row {r}"
        torch.testing.assert_close(scores[r, :len(want_ids)], torch.tensor(want_scores, dtype=F64), rtol=1e-15,
                                   atol=0)


@PROPERTY
@given(batch=st.integers(0, 4), k=st.integers(0, 3), vocab=vocabs, ties=st.booleans(), data=st.data(), seed=seeds)
def test_fork_select(batch, k, vocab, ties, data, seed):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(logits_of(gen, (batch, k + 1, vocab), ties), -1)
    drafted = torch.randint(0, vocab, (batch, k), generator=gen)
    fanout = data.draw(st.lists(st.integers(0, vocab + 2), min_size=k + 1, max_size=k + 1))
    max_fanout = max(fanout) + data.draw(st.integers(0, 2))
    fanout = torch.tensor(fanout, dtype=torch.int64)
    candidates, counts = torch.ops.ssd.fork_select(probs, drafted, fanout, max_fanout)
    want_candidates, want_counts = fork_candidates(probs, drafted, fanout, max_fanout)
    assert torch.equal(counts, want_counts)
    assert torch.equal(candidates, want_candidates)


@PROPERTY
@given(batch=st.integers(0, 6), k=st.integers(0, 3), vocab=vocabs, ties=st.booleans(), seed=seeds)
def test_verify(batch, k, vocab, ties, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = logits_of(gen, (batch, k + 1, vocab), ties)
    q = torch.softmax(logits[:, :k] + torch.randn(batch, k, vocab, generator=gen), -1)
    greedy = torch.rand(batch, generator=gen) < 0.3
    proposals = torch.where(  # greedy rows mostly propose the argmax, so acceptance runs on
        greedy[:, None] & (torch.rand(batch, k, generator=gen) < 0.8), logits[:, :k].argmax(-1),
        torch.randint(0, vocab, (batch, k), generator=gen))
    temperature = torch.tensor([0.6, 1.0, 1.4], dtype=F64)[torch.randint(0, 3, (batch,), generator=gen)]
    temperature[greedy] = 0.0
    args = (logits, proposals, torch.randint(0, k + 1, (batch,), generator=gen), q,
            torch.rand(batch, generator=gen) < 0.3, temperature,
            torch.tensor([0, 1, 2, vocab + 1])[torch.randint(0, 4, (batch,), generator=gen)],
            torch.tensor([1.0, 0.9, 0.4], dtype=F64)[torch.randint(0, 3, (batch,), generator=gen)],
            torch.rand(batch, k, generator=gen, dtype=F64), torch.rand(batch, generator=gen, dtype=F64))
    accepted, bonus = torch.ops.ssd.verify(*args)
    want_accepted, want_bonus = verify_ref(*args)
    assert torch.equal(accepted, want_accepted)
    assert torch.equal(bonus, want_bonus)


# ----------------------------------------------------------------- attention


def _heads(data: st.DataObject) -> tuple[int, int]:
    kv_heads = data.draw(st.integers(1, 2), label="kv_heads")
    return kv_heads, kv_heads * data.draw(st.integers(1, 3), label="group")


@PROPERTY
@given(head_dim=head_dims, block_size=block_sizes, data=st.data(), seed=seeds)
def test_paged_attention(head_dim, block_size, data, seed):
    """Queries at random positions of 1-3 sequences; no query at all is the empty batch."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads, heads = _heads(data)
    seq_lens = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=3), label="seq_lens")
    k_cache, v_cache, tables = random_paged_cache(seq_lens, block_size, kv_heads, head_dim, gen)
    queries = data.draw(st.lists(st.tuples(st.integers(0, len(seq_lens) - 1), st.floats(0, 1)), max_size=8),
                        label="queries")
    seq_of_token = torch.tensor([s for s, _ in queries], dtype=torch.int32)
    positions = torch.tensor([int(f * (seq_lens[s] - 1)) for s, f in queries], dtype=torch.int32)
    q = torch.randn(len(queries), heads, head_dim, generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = head_dim ** -0.5
    torch.ops.ssd.paged_attention(q, k_cache, v_cache, tables, seq_of_token, positions, scale, out)
    if queries:
        want = paged_attention_ref(q, k_cache, v_cache, tables, seq_of_token, positions, scale)
        torch.testing.assert_close(out, want.float(), atol=2e-5, rtol=1e-5)


@PROPERTY
@given(head_dim=head_dims, block_size=block_sizes, path_slots=st.integers(1, 4), window=st.integers(0, 6),
       data=st.data(), seed=seeds)
def test_fork_attention(head_dim, block_size, path_slots, window, data, seed):
    """Branches of 1-2 sequences forking anywhere (0 too), each row reading its own table
    (random values below its fork too, which must not be read) past its fork; no branch
    is the empty batch."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads, heads = _heads(data)
    seq_lens = data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=2), label="seq_lens")
    branches = data.draw(st.lists(st.tuples(st.integers(0, len(seq_lens) - 1), st.floats(0, 1),
                                            st.integers(1, path_slots)), max_size=6), label="branches")
    forks = [int(f * seq_lens[s]) for s, f, _ in branches]
    own_lens = [fork + path for fork, (_, _, path) in zip(forks, branches)]
    k_cache, v_cache, tables = random_paged_cache(seq_lens + own_lens, block_size, kv_heads, head_dim, gen)
    n = len(branches)
    seq_of_token = torch.arange(len(seq_lens), len(seq_lens) + n, dtype=torch.int32)
    positions = torch.tensor([x - 1 for x in own_lens], dtype=torch.int32)
    prefix_seq = torch.tensor([s for s, _, _ in branches], dtype=torch.int32)
    prefix_len = torch.tensor(forks, dtype=torch.int32)
    q = torch.randn(n, heads, head_dim, generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = head_dim ** -0.5
    args = (q, k_cache, v_cache, tables, seq_of_token, positions, prefix_seq, prefix_len, scale)
    torch.ops.ssd.fork_attention(*args, out, window)
    if n:
        torch.testing.assert_close(out, fork_attention_ref(*args, window=window).float(), atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------- KV cache ops


@PROPERTY
@given(layers=st.integers(1, 2), kv_heads=st.integers(1, 3), head_dim=head_dims, block_size=block_sizes,
       num_blocks=st.integers(1, 4), data=st.data(), seed=seeds)
def test_kv_commit(layers, kv_heads, head_dim, block_size, num_blocks, data, seed):
    """Commits of 0 (the empty batch) up to every slot of the cache, into distinct slots."""
    gen = torch.Generator().manual_seed(seed)
    slots = num_blocks * block_size
    cache = torch.randn(layers, 2, slots, kv_heads, head_dim, generator=gen)
    tree_slots = data.draw(st.integers(1, 6), label="tree_slots")
    tree = torch.randn(layers, 2, tree_slots, kv_heads, head_dim, generator=gen)
    n = data.draw(st.integers(0, min(slots, 8)), label="n")
    src = torch.randint(0, tree_slots, (n,), generator=gen)
    dst = torch.randperm(slots, generator=gen)[:n]
    want = kv_commit_ref(cache, tree, src, dst)
    torch.ops.ssd.kv_commit(cache, tree, src, dst)
    assert torch.equal(cache, want)


@PROPERTY
@given(block_size=block_sizes, lens=st.lists(st.integers(0, 12), min_size=1, max_size=4), data=st.data(), seed=seeds)
def test_kv_truncate(block_size, lens, data, seed):
    """Sequences (the later ones may share the first blocks of sequence 0) truncated in any subset, none too."""
    gen = torch.Generator().manual_seed(seed)
    used = [-(-n // block_size) for n in lens]
    width = max(max(used), 1)
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    next_block = 0
    for s, u in enumerate(used):
        shared = min(u, used[0], data.draw(st.integers(0, 2), label="shared")) if s else 0
        tables[s, :shared] = tables[0, :shared]
        tables[s, shared:u] = torch.arange(next_block, next_block + u - shared, dtype=torch.int32)
        next_block += u - shared
    refcount = torch.randint(0, 2, (next_block + 1,), generator=gen, dtype=torch.int32)  # references held elsewhere
    for row in tables:
        refcount[row[row >= 0].long()] += 1
    seq_ids = torch.randperm(len(lens), generator=gen)[:data.draw(st.integers(0, len(lens)), label="count")]
    new_lens = torch.tensor([data.draw(st.integers(0, lens[s])) for s in seq_ids.tolist()], dtype=torch.int64)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = kv_truncate_ref(tables, seq_lens, refcount, seq_ids, new_lens, block_size)
    torch.ops.ssd.kv_truncate(tables, seq_lens, refcount, seq_ids, new_lens, block_size)
    for got, expected in zip((tables, seq_lens, refcount), want):
        assert torch.equal(got, expected)


# ------------------------------------------------------------ model kernels


@PROPERTY
@given(m=st.integers(0, 5), n=st.integers(1, 20), k=st.integers(1, 40), bf16=st.booleans(), seed=seeds)
def test_packed_linear(m, n, k, bf16, seed):
    """The model's exact-layout matrix kernel; no row is the empty batch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(torch.bfloat16 if bf16 else torch.float32)
    bias = torch.randn(n, generator=gen)
    got = _C.testing.packed_linear(x, w, bias)
    want = x.double() @ w.double().T + bias.double()
    assert got.shape == (m, n)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@PROPERTY
@given(rows=st.integers(0, 3), n=st.integers(1, 40), seed=seeds)
def test_silu_mul(rows, n, seed):
    gen = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(rows, n, generator=gen) * 6, torch.randn(rows, n, generator=gen)
    got = _C.testing.silu_mul(torch.cat([gate, up], dim=1))
    want = gate.double() * torch.sigmoid(gate.double()) * up.double()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)
