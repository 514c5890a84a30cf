"""Batch invariance: a row's logits are bitwise the same however they are computed.

The reference for every sequence is ONE prefill of the whole sequence, alone, in
a fresh runner (block size 16, one thread). Every other way of reaching the same
rows — decode one token at a time, score chunks on top of a cached prefix, share
a forward with other sequences at other stages, other block sizes and thread
counts, truncate and re-extend — must give torch.equal rows. This is what makes
greedy speculative decoding equal autoregressive decoding token for token.

Every test runs on both CPU implementations of the model backend (the cpu
kernels and the aten reference, csrc/model/backend.h) and, where there is a
GPU, on the cuda backend.
"""
from __future__ import annotations

import random

import pytest
import torch

import ssd.models
from ssd import _C
from ssd.assets import smollm2_gguf_path
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_tokens

REFERENCE_BLOCK_SIZE = 16

# Shapes chosen for kernel tails: hidden 72 and head_dim 12 are not multiples of
# any SIMD width; vocab 300 is not a multiple of 16.
TINY_SPECS = {
    "qwen3-gqa3": TinySpec(arch="qwen3", hidden_size=72, intermediate_size=136, num_heads=6,
                           num_kv_heads=2, head_dim=12, vocab_size=300, num_layers=2, seed=31),
    "llama-gqa4-tied": TinySpec(arch="llama", hidden_size=80, intermediate_size=112, num_heads=8,
                                num_kv_heads=2, vocab_size=260, tie_word_embeddings=True,
                                llama3_rope=True, attention_bias=True, num_layers=2, seed=32),
    # head_dim 64: the cuda backend's own attention kernel (the others take its fallback)
    "qwen3-hd64": TinySpec(arch="qwen3", hidden_size=128, intermediate_size=160, num_heads=2,
                           num_kv_heads=1, head_dim=64, vocab_size=300, num_layers=2, seed=33),
    # sliding window 7, shorter than most sequences; head_dim 64 for the cuda kernel's window
    "mistral-sw7": TinySpec(arch="mistral", hidden_size=128, intermediate_size=160, num_heads=2,
                            num_kv_heads=1, vocab_size=300, num_layers=2, sliding_window=7, seed=34),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SEQ_LENGTHS = [2, 5, 9, 16, 17, 23, 33, 41]  # 8 sequences, around block edges


class Harness:
    """A core model and the reference rows of the sequences tests score with it."""

    def __init__(self, loaded: ssd.models.LoadedModel, sequences: list[list[int]], placement: str = "cpu"):
        device, backend = PLACEMENTS[placement]
        self.core = loaded.core_model(device, backend)
        assert self.core.backend == placement
        self.vocab = loaded.config.vocab_size
        self.sequences = sequences
        self._reference: dict[tuple[int, ...], torch.Tensor] = {}

    def runner(self, block_size: int, num_threads: int, capacity_tokens: int = 512):
        num_blocks = -(-capacity_tokens // block_size)
        return _C.SequenceRunner(self.core, num_blocks, block_size, num_threads)

    def reference(self, tokens: list[int]) -> torch.Tensor:
        """[len, vocab]: the whole sequence prefilled alone in one extend."""
        key = tuple(tokens)
        if key not in self._reference:
            runner = self.runner(REFERENCE_BLOCK_SIZE, 1, capacity_tokens=len(tokens))
            seq = runner.add_sequence()
            self._reference[key] = runner.extend([(seq, list(tokens))], True)
        return self._reference[key]


# backend name -> (device, backend argument)
PLACEMENTS = {"cpu": ("cpu", "auto"), "aten": ("cpu", "aten"), "cuda": ("cuda", "auto")}
BACKENDS = ["cpu", "aten", pytest.param("cuda", marks=pytest.mark.cuda)]


def _tiny_harness(name: str, dtype_name: str, backend: str, tmp_path_factory) -> Harness:
    spec = TINY_SPECS[name]
    model_dir, _ = build_tiny_model(spec, tmp_path_factory.mktemp(name))
    loaded = ssd.models.load(model_dir, dtype=DTYPES[dtype_name])
    sequences = [random_tokens(n, spec.vocab_size, seed=100 + i) for i, n in enumerate(SEQ_LENGTHS)]
    return Harness(loaded, sequences, backend)


TINY_CASES = [pytest.param((n, d, b), marks=[pytest.mark.cuda] if b == "cuda" else [], id=f"{n}-{d}-{b}")
              for b in ["cpu", "aten", "cuda"] for n in TINY_SPECS for d in DTYPES]


@pytest.fixture(scope="module", params=TINY_CASES)
def tiny(request, tmp_path_factory) -> Harness:
    return _tiny_harness(*request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=BACKENDS)
def tiny_fp32(request, tmp_path_factory) -> Harness:
    return _tiny_harness("qwen3-gqa3", "fp32", request.param, tmp_path_factory)


# ------------------------------------------------------------------ helpers


def _chunks(tokens: list[int], sizes: list[int]) -> list[list[int]]:
    """tokens split into consecutive pieces of the given sizes (cycled)."""
    out, pos, i = [], 0, 0
    while pos < len(tokens):
        size = sizes[i % len(sizes)]
        out.append(tokens[pos:pos + size])
        pos += size
        i += 1
    return out


def _score_in_chunks(runner, seq: int, chunks: list[list[int]]) -> torch.Tensor:
    return torch.cat([runner.extend([(seq, chunk)], True) for chunk in chunks])


def _mixed_schedule(lengths: list[int], seed: int) -> list[list[tuple[int, int]]]:
    """Steps of (sequence index, chunk size): half the sequences start one step
    late, each starts with one token (so step 1 holds all of them), then a mix
    of prefill chunks and single-token decodes in every step."""
    rng = random.Random(seed)
    done = [0] * len(lengths)
    start = [i % 2 for i in range(len(lengths))]
    steps, step = [], 0
    while any(d < n for d, n in zip(done, lengths)):
        batch = []
        for i, n in enumerate(lengths):
            if step < start[i] or done[i] >= n:
                continue
            size = 1 if done[i] == 0 else rng.choice([1, 1, 1, 2, 3, 5, 7, 16])
            size = min(size, n - done[i])
            batch.append((i, size))
            done[i] += size
        steps.append(batch)
        step += 1
    return steps


def _run_schedule(harness: Harness, schedule, batched: bool, block_size: int, num_threads: int,
                  all_logits: bool = True) -> dict[int, list[tuple[int, torch.Tensor]]]:
    """Runs the schedule; returns, per sequence, (first position, rows) pieces.

    batched=False issues one extend per (sequence, chunk) in the same order.
    Finished sequences are freed at once, so later ones reuse their blocks.
    """
    runner = harness.runner(block_size, num_threads)
    sids: dict[int, int] = {}
    pos = [0] * len(harness.sequences)
    got: dict[int, list[tuple[int, torch.Tensor]]] = {i: [] for i in range(len(harness.sequences))}
    for step in schedule:
        work = []
        for i, size in step:
            if i not in sids:
                sids[i] = runner.add_sequence()
            work.append((i, harness.sequences[i][pos[i]:pos[i] + size]))
        calls = [work] if batched else [[w] for w in work]
        for call in calls:
            rows = runner.extend([(sids[i], chunk) for i, chunk in call], all_logits)
            offset = 0
            for i, chunk in call:
                n = len(chunk) if all_logits else 1
                first = pos[i] if all_logits else pos[i] + len(chunk) - 1
                got[i].append((first, rows[offset:offset + n]))
                offset += n
                pos[i] += len(chunk)
                assert runner.length(sids[i]) == pos[i]
            assert offset == rows.shape[0]
        for i, _ in step:
            if pos[i] == len(harness.sequences[i]):
                runner.free(sids[i])
    return got


def _assert_rows_equal(harness: Harness, got: dict[int, list[tuple[int, torch.Tensor]]]) -> None:
    for i, pieces in got.items():
        ref = harness.reference(harness.sequences[i])
        for first, rows in pieces:
            expected = ref[first:first + rows.shape[0]]
            if not torch.equal(rows, expected):
                diff = (rows - expected).abs().max().item()
                pytest.fail(f"sequence {i} rows {first}..{first + rows.shape[0] - 1}: "
                            f"not bitwise equal to the lone prefill (max |diff| {diff:.3g})")


# ------------------------------------------------------------------- tests


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", [1, 16])
def test_decode_matches_prefill(tiny, block_size, num_threads):
    tokens = tiny.sequences[-1]
    runner = tiny.runner(block_size, num_threads)
    got = _score_in_chunks(runner, runner.add_sequence(), [[t] for t in tokens])
    assert torch.equal(got, tiny.reference(tokens))


@pytest.mark.parametrize("num_threads", [1, 2])
def test_long_sequence_decode_and_chunks_match_prefill(tiny_fp32, num_threads):
    """Past one split of the key range (256 keys, kernels/cpu/attention_splits.h):
    a 600-token sequence decoded token by token after a 250-token prefill, and
    in verify-sized chunks, gives the rows of its one-pass prefill bitwise."""
    tokens = random_tokens(600, tiny_fp32.vocab, seed=77)
    want = tiny_fp32.reference(tokens)
    for sizes in ([1], [5, 1, 16, 3]):
        runner = tiny_fp32.runner(16, num_threads, capacity_tokens=600)
        seq = runner.add_sequence()
        head = runner.extend([(seq, tokens[:250])], True)
        tail = _score_in_chunks(runner, seq, _chunks(tokens[250:], sizes))
        assert torch.equal(torch.cat([head, tail]), want), f"chunks {sizes}"


@pytest.mark.parametrize("chunk", [3, 5, 7])
@pytest.mark.parametrize("block_size,num_threads", [(1, 2), (16, 1)])
def test_chunks_on_cached_prefix_match_prefill(tiny, chunk, block_size, num_threads):
    tokens = tiny.sequences[-1]
    prefix = 9
    runner = tiny.runner(block_size, num_threads)
    seq = runner.add_sequence()
    head = runner.extend([(seq, tokens[:prefix])], True)
    tail = _score_in_chunks(runner, seq, _chunks(tokens[prefix:], [chunk]))
    assert torch.equal(torch.cat([head, tail]), tiny.reference(tokens))


MIXED_CASES = [(True, b, t) for b in (1, 16) for t in (1, 2)] + [(False, 16, 1), (False, 1, 2)]


@pytest.mark.parametrize("batched,block_size,num_threads", MIXED_CASES,
                         ids=[f"batch{8 if b else 1}-block{bs}-threads{t}" for b, bs, t in MIXED_CASES])
def test_mixed_batches_match_prefill(tiny, batched, block_size, num_threads):
    schedule = _mixed_schedule(SEQ_LENGTHS, seed=block_size + num_threads)
    assert max(len(step) for step in schedule) == len(SEQ_LENGTHS)
    got = _run_schedule(tiny, schedule, batched, block_size, num_threads)
    _assert_rows_equal(tiny, got)


@pytest.mark.parametrize("block_size", [1, 16])
def test_last_row_only_matches_prefill(tiny_fp32, block_size):
    """all_logits=False returns each sequence's last row, bitwise the same."""
    schedule = _mixed_schedule(SEQ_LENGTHS, seed=7)
    got = _run_schedule(tiny_fp32, schedule, True, block_size, 2, all_logits=False)
    _assert_rows_equal(tiny_fp32, got)


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("cut", [1, 15, 16, 17, 31, 40])
def test_truncate_and_reextend(tiny_fp32, block_size, cut):
    """Truncate, write other tokens past the cut, truncate again and re-extend the
    original tokens: the rows are those of the lone prefill (stale KV is not read)."""
    tokens = tiny_fp32.sequences[-1]
    other = random_tokens(len(tokens), tiny_fp32.vocab, seed=999)
    runner = tiny_fp32.runner(block_size, 2)
    seq = runner.add_sequence()
    runner.extend([(seq, tokens)], True)
    runner.truncate(seq, cut)
    assert runner.length(seq) == cut
    runner.extend([(seq, other[cut:cut + 6])], True)
    runner.truncate(seq, cut)
    again = _score_in_chunks(runner, seq, _chunks(tokens[cut:], [4, 1, 6]))
    assert torch.equal(again, tiny_fp32.reference(tokens)[cut:])


def test_different_prefix_gives_different_rows(tiny_fp32):
    """Negative control: the comparison can fail. Changing token 4 leaves rows 0..3
    bitwise equal (causality) and changes every later row."""
    tokens = tiny_fp32.sequences[-1]
    changed = list(tokens)
    changed[4] = (changed[4] + 1) % tiny_fp32.vocab
    ref, other = tiny_fp32.reference(tokens), tiny_fp32.reference(changed)
    assert torch.equal(other[:4], ref[:4])
    for row in range(4, len(tokens)):
        assert not torch.equal(other[row], ref[row]), f"row {row} did not change"


# --------------------------------------------------- SmolLM2-135M (real GGUF)

SMOLLM2_TEXTS = [
    "Hi there",
    "What is 2 + 2?",
    "def add(a, b):",
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain recursion to a child in one sentence.",
    "import numpy as np\nx = np.arange(10)",
]


@pytest.fixture(scope="module", params=BACKENDS)
def smollm2(request) -> Harness:
    loaded = ssd.models.load(smollm2_gguf_path(), dtype=torch.float32)
    tok = loaded.require_tokenizer()
    sequences = [tok.encode(text) for text in SMOLLM2_TEXTS]
    assert min(len(s) for s in sequences) >= 2
    return Harness(loaded, sequences, request.param)


@pytest.mark.parametrize("block_size,num_threads", [(16, 2), (1, 1)])
def test_smollm2_batch8_matches_prefill(smollm2, block_size, num_threads):
    lengths = [len(s) for s in smollm2.sequences]
    schedule = _mixed_schedule(lengths, seed=3)
    assert max(len(step) for step in schedule) == 8
    got = _run_schedule(smollm2, schedule, True, block_size, num_threads)
    _assert_rows_equal(smollm2, got)


def test_smollm2_truncate_and_decode(smollm2):
    tokens = smollm2.sequences[6]
    runner = smollm2.runner(16, 1)
    seq = runner.add_sequence()
    runner.extend([(seq, tokens[:-3])], True)
    runner.truncate(seq, 2)
    again = _score_in_chunks(runner, seq, [[t] for t in tokens[2:]])
    assert torch.equal(again, smollm2.reference(tokens)[2:])
    changed = [tokens[0], (tokens[1] + 1) % smollm2.vocab] + tokens[2:]
    assert not torch.equal(smollm2.reference(changed)[2:], again)


# ------------------------------------------------------------ draft pair path


def test_pair_path_rows_are_batch_invariant_and_near_exact(tiny):
    """matmul_min_rows=1 sends every product through the bf16 pair kernels (the
    draft's tree path): a row is still the same bits however it is reached, and
    it stays near the exact row (bf16 rounding only)."""
    if tiny.core.backend != "cpu":
        pytest.skip(f"the {tiny.core.backend} backend has no pair path (it ignores matmul_min_rows)")
    seqs = tiny.sequences[:4]
    # Reference: each sequence prefilled alone, pair path.
    ref = []
    for tokens in seqs:
        r = tiny.runner(REFERENCE_BLOCK_SIZE, 1)
        ref.append(r.extend([(r.add_sequence(), list(tokens))], True, 1))
    # Decode all four together one token at a time, on 2 threads.
    runner = tiny.runner(8, 2)
    sids = [runner.add_sequence() for _ in seqs]
    rows = {i: [] for i in range(len(seqs))}
    for pos in range(max(len(s) for s in seqs)):
        batch = [(i, [s[pos]]) for i, s in enumerate(seqs) if pos < len(s)]
        out = runner.extend([(sids[i], t) for i, t in batch], True, 1)
        for j, (i, _) in enumerate(batch):
            rows[i].append(out[j])
    for i in range(len(seqs)):
        assert torch.equal(torch.stack(rows[i]), ref[i]), f"sequence {i}"
    # Near the exact path. With fp32 weights on a CPU whose pair kernels are native
    # (AVX512-BF16) the rows differ from it (the path really changed); elsewhere the
    # backend keeps the fp32 linear (it never runs the emulated pair kernels), so the
    # rows are the exact rows.
    exact = tiny.reference(seqs[0])
    scale = exact.abs().max().item()
    assert (ref[0] - exact).abs().max().item() < 0.05 * scale
    if not tiny.core.bf16:
        assert torch.equal(ref[0], exact) != _C.testing.pairs_native()
