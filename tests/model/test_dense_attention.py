"""Prefill attention through stock dense kernels (csrc/model/dense_attention.h):
what the cuda backend's batch_invariant=False forwards use for prefills and
prefill chunks. Checked against the float64 paged-attention reference on the
CPU (and, where there is a GPU, on it in bf16), with the batches it must not
take refused.
"""
from __future__ import annotations

import pytest
import torch

from ssd import _C
from tests.reference.paged_attention_ref import paged_attention_ref

BS = 4
HQ, HKV, D = 4, 2, 16
SCALE = D ** -0.5


def cache(blocks=48, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(blocks, BS, HKV, D, generator=g).to(dtype)
    v = torch.randn(blocks, BS, HKV, D, generator=g).to(dtype)
    return k, v


def batch(runs, seed=1):
    """runs: (sequence, first position, tokens) each, rows in that order; tables: sequence s
    holds blocks s * 16 .. s * 16 + 15 in reverse (not the identity)."""
    seq_of_token, positions = [], []
    for s, first, n in runs:
        seq_of_token += [s] * n
        positions += range(first, first + n)
    tables = torch.tensor([[s * 16 + 15 - j for j in range(16)] for s in range(3)], dtype=torch.int32)
    q = torch.randn(len(positions), HQ, D, generator=torch.Generator().manual_seed(seed))
    return q, tables, torch.tensor(seq_of_token, dtype=torch.int32), torch.tensor(positions, dtype=torch.int32)


CASES = {
    "prefills from 0": [(0, 0, 37), (2, 0, 20)],
    "a chunk after 40 cached keys, beside a prefill": [(1, 40, 23), (0, 0, 9)],
}


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_reference(case, window):
    k, v = cache()
    q, tables, seqs, pos = batch(CASES[case])
    got = _C.testing.dense_attention(q, k, v, tables, seqs, pos, SCALE, window=window)
    want = paged_attention_ref(q, k, v, tables, seqs, pos, SCALE, window).reshape(q.shape[0], -1)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_window_reads_no_block_below_it():
    """A chunk at 40 with a window of 7 sees keys 34..: blocks wholly below that may be gone (-1)."""
    k, v = cache()
    q, tables, seqs, pos = batch([(1, 40, 23)])
    tables[1, :8] = -1  # positions 0..31
    got = _C.testing.dense_attention(q, k, v, tables, seqs, pos, SCALE, window=7)
    want = paged_attention_ref(q, k, v, tables, seqs, pos, SCALE, 7).reshape(q.shape[0], -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_bf16_compute_within_its_tolerance():
    k, v = cache(dtype=torch.bfloat16)
    q, tables, seqs, pos = batch(CASES["a chunk after 40 cached keys, beside a prefill"])
    got = _C.testing.dense_attention(q, k, v, tables, seqs, pos, SCALE, bf16=True)
    want = paged_attention_ref(q, k, v, tables, seqs, pos, SCALE).reshape(q.shape[0], -1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-2)


@pytest.mark.parametrize("runs, why", [
    ([(0, 0, 5), (1, 0, 5), (0, 5, 5)], "a sequence in two runs"),
    ([(0, 0, 5), (0, 6, 5)], "a gap in a run's positions"),
    ([(0, 0, 40), (1, 7, 1)], "a run shorter than min_run_tokens"),
])
def test_batches_it_does_not_take(runs, why):
    k, v = cache()
    q, tables, seqs, pos = batch(runs)
    assert _C.testing.dense_attention(q, k, v, tables, seqs, pos, SCALE, min_run_tokens=4) is None, why


def test_padding_is_not_taken():
    k, v = cache()
    q, tables, seqs, pos = batch([(0, 0, 8)])
    tables[0, 1] = -1
    assert _C.testing.dense_attention(q, k, v, tables, seqs, pos, SCALE) is None


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_flash_within_bf16_tolerance(case):
    k, v = cache(dtype=torch.bfloat16)
    q, tables, seqs, pos = batch(CASES[case])
    got = _C.testing.dense_attention(q.cuda(), k.cuda(), v.cuda(), tables, seqs, pos, SCALE,
                                     bf16=True).cpu()
    want = paged_attention_ref(q, k, v, tables, seqs, pos, SCALE).reshape(q.shape[0], -1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-2)


@pytest.mark.cuda
def test_cuda_forward_without_batch_invariance_is_near_the_cpu_forward(tiny_loaded):
    """A prefill of two 300-token sequences (past the graphs' largest bucket) takes the dense
    attention (bf16 flash) and cuBLAS products, then a decode step (graphed) the paged kernel:
    logits near the cpu backend's."""
    from tests.reference.tiny_models import random_tokens
    from tests.model.conftest import TINY_SPEC

    n, bs = 300, 16
    fast = _C.testing.RawForward(tiny_loaded.core_model("cuda", batch_invariant=False), 40, bs)
    exact = _C.testing.RawForward(tiny_loaded.core_model("cpu"), 40, bs)
    tables = [list(range(0, 20)), list(range(20, 40))]
    prompt = random_tokens(2 * n, TINY_SPEC.vocab_size, seed=9)
    steps = [(prompt, list(range(n)) * 2, [0] * n + [1] * n, [n - 1, 2 * n - 1]),
             (prompt[:2], [n, n], [0, 1], [0, 1])]
    for tokens, pos, seqs, rows in steps:
        got = fast.forward(tokens, pos, seqs, tables, rows).cpu()
        want = exact.forward(tokens, pos, seqs, tables, rows)
        torch.testing.assert_close(got, want, rtol=0, atol=0.05 * float(want.abs().max()))
