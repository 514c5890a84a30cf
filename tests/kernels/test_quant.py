"""Quantized matrix products (GGUF q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k blocks, csrc/kernels/cpu/quant.h).

The product over the blocks is defined as the exact product (linear.h) over
the matrix gguf's own dequantiser gives: every output bitwise equal, on every
instruction set, for any rows, batch and thread count. The references here
are gguf-py's dequantisation and the fp32 exact kernel, never the code under
test.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

# Installed with ssd; the GPU machines of scripts/gpu_check.sh lack it.
gguf = pytest.importorskip("gguf", exc_type=ImportError)

from ssd import _C

FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
K_QUANTS = ("q4_k", "q5_k", "q6_k")  # blocks of 256; gguf-py has no quantiser for them
# n with partial 4-row tiles; k of one block, odd block counts, and the SmolLM2 width.
SHAPES = [(5, 32), (13, 96), (64, 160), (130, 576)]
K_SHAPES = [(5, 256), (13, 512), (130, 768)]
ROW_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 70]
# Byte offsets of each format's fp16 numbers in its GGUF block (d first).
HALVES = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2],
          "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}


def ggml_type(fmt):
    return getattr(gguf.GGMLQuantizationType, fmt.upper())


def shapes(fmt):
    return K_SHAPES if fmt in K_QUANTS else SHAPES


def format_shapes():
    return [(fmt, n, k) for fmt in FORMATS for n, k in shapes(fmt)]


def dequantized(blocks, fmt):
    return torch.from_numpy(gguf.quants.dequantize(blocks, ggml_type(fmt)).astype(np.float32))


def quantized(n, k, fmt, seed):
    """GGUF rows of a random [n, k] matrix (gguf's quantiser; for the k-quants,
    random quants under small scales) and their dequantisation."""
    if fmt in K_QUANTS:
        return random_blocks(n, k, fmt, seed, extreme=False)
    w = np.random.RandomState(seed).randn(n, k).astype(np.float32) / k ** 0.5
    blocks = np.ascontiguousarray(gguf.quants.quantize(w, ggml_type(fmt)))
    return torch.from_numpy(blocks), dequantized(blocks, fmt)


def random_blocks(n, k, fmt, seed, extreme=True):
    """GGUF rows of random bytes with finite fp16 scales: with `extreme`,
    subnormal, negative and large ones; else small positive ones, as a quantiser writes."""
    rng = np.random.RandomState(seed)
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[ggml_type(fmt)]
    raw = rng.randint(0, 256, size=(n * k // block_weights, block_bytes), dtype=np.uint8)
    count = len(HALVES[fmt])
    if extreme:
        halves = rng.randint(0, 0x7C00, size=(raw.shape[0], count)).astype(np.uint16)  # finite magnitudes
        halves |= (rng.randint(0, 2, size=halves.shape) << 15).astype(np.uint16)       # either sign
        halves[::7, 0] = rng.randint(1, 0x400, size=halves[::7, 0].shape)             # subnormal d
    else:
        size = 1.0 / (k ** 0.5 * {"q4_k": 60, "q5_k": 120, "q6_k": 1000}.get(fmt, 8))
        halves = (rng.uniform(0.5, 1.5, size=(raw.shape[0], count)) * size).astype(np.float16).view(np.uint16)
    for i, at in enumerate(HALVES[fmt]):
        raw[:, at:at + 2] = halves[:, i:i + 1].view(np.uint8).reshape(raw.shape[0], 2)
    blocks = np.ascontiguousarray(raw.reshape(n, -1))
    return torch.from_numpy(blocks), dequantized(blocks, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantisation_is_ggufs(fmt):
    k = 512 if fmt in K_QUANTS else 128
    blocks, dense = random_blocks(24, k, fmt, seed=3)
    assert torch.equal(_C.testing.quant_dequantize(blocks, fmt, k), dense)
    x = torch.randn(3, k)
    _, rows = _C.testing.quant_linear(x, blocks, fmt, k)
    assert torch.equal(rows, dense)  # the packed layout keeps every value


@pytest.mark.parametrize("fmt,n,k", format_shapes())
def test_product_is_the_exact_product_of_the_dequantised_matrix(fmt, n, k):
    blocks, dense = quantized(n, k, fmt, seed=n * 1000 + k)
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(max(ROW_COUNTS), k, generator=g)
    bias = torch.randn(n, generator=g)
    full, _ = _C.testing.quant_linear(x, blocks, fmt, k, bias)
    assert torch.equal(full, _C.testing.packed_linear(x, dense, bias))
    ref = x.double() @ dense.double().T + bias.double()
    scale = x.abs().double() @ dense.abs().double().T + bias.abs().double()
    assert ((full.double() - ref).abs() / scale).max().item() < 1e-5
    # Batch invariance: any subset of rows, in any order, on any thread count.
    for m in ROW_COUNTS:
        rows = torch.randperm(x.shape[0], generator=g)[:m]
        for threads in (1, 2, 3):
            part, _ = _C.testing.quant_linear(x[rows], blocks, fmt, k, bias, threads)
            assert torch.equal(part, full[rows]), (m, threads)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_blocks_multiply_as_their_dequantisation(fmt):
    # Extreme scales (subnormal to 65504, both signs) and every quant value.
    n, k = 13, 512 if fmt in K_QUANTS else 192
    blocks, dense = random_blocks(n, k, fmt, seed=11)
    x = torch.randn(7, k) * 1e-3
    y, _ = _C.testing.quant_linear(x, blocks, fmt, k, None, 2)
    assert torch.equal(y, _C.testing.packed_linear(x, dense))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_instruction_set_gives_the_same_bits(fmt):
    k = 512 if fmt in K_QUANTS else 320
    blocks, dense = quantized(37, k, fmt, seed=5)
    x = torch.randn(19, k)
    previous = _C.cpu_isa()
    try:
        _C.set_cpu_isa("portable")
        want, _ = _C.testing.quant_linear(x, blocks, fmt, k, None, 2)
        for isa in _C.cpu_isas():
            _C.set_cpu_isa(isa)
            got, _ = _C.testing.quant_linear(x, blocks, fmt, k, None, 2)
            assert torch.equal(got, want), isa
            # and batch invariant on each path (groups of 1 to 8 rows, and more)
            for rows in ([4], [8, 1, 2], [5, 6, 7, 0], list(range(8)), list(range(18, 1, -1))):
                part, _ = _C.testing.quant_linear(x[rows], blocks, fmt, k, None, 1)
                assert torch.equal(part, want[rows]), (isa, rows)
    finally:
        _C.set_cpu_isa(previous)
    assert torch.equal(want, _C.testing.packed_linear(x, dense))


def test_strided_activation_rows_read_only_k_columns():
    blocks, dense = quantized(8, 64, "q4_1", seed=9)
    x = torch.randn(3, 64)
    wide = torch.full((3, 96), float("nan"))
    wide[:, :64] = x
    got, _ = _C.testing.quant_linear(wide[:, :64], blocks, "q4_1", 64)
    assert torch.equal(got, _C.testing.quant_linear(x, blocks, "q4_1", 64)[0])


def test_bad_shapes_and_formats_are_refused():
    blocks, _ = quantized(4, 64, "q8_0", seed=1)
    with pytest.raises(ValueError, match="multiple of 32 weights, not 40"):
        _C.testing.quant_dequantize(torch.zeros(4, 45, dtype=torch.uint8), "q8_0", 40)
    with pytest.raises(ValueError, match="unknown quantized block format 'q3_k'.*q8_0, q4_0, q4_1, q5_0, q5_1, "
                                         "q4_k, q5_k, q6_k"):
        _C.testing.quant_dequantize(blocks, "q3_k", 64)
    with pytest.raises(ValueError, match="q6_k rows must hold a positive multiple of 256 weights, not 576"):
        _C.testing.quant_dequantize(torch.zeros(4, 473, dtype=torch.uint8), "q6_k", 576)
    with pytest.raises(RuntimeError, match="GGUF rows"):
        _C.testing.quant_dequantize(blocks, "q4_0", 64)  # q8_0 rows are longer than q4_0's


# ---- int8 activations (quant.h's definition, llama.cpp's way)


def numpy_quantize_rows(x):
    """quant.h's activation quantization in numpy float32: per 32-block dx = amax / 127, q = rint(x * (1 / dx))."""
    blocks = x.numpy().reshape(x.shape[0], -1, 32).astype(np.float32)
    dx = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(dx != 0, np.float32(1) / dx, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    sx = (dx * q.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float32)
    return q.reshape(x.shape), dx, sx


def int8_reference(x, dense):
    """The int8 product in float64: the quantized activations (q dx) times the
    dequantised weights. quant.h's sums rearranged: d_w (q - o) is the weight
    w, and d_w q dx + m sx over a block is w q dx summed."""
    q, dx, _ = numpy_quantize_rows(x)
    xq = q.reshape(q.shape[0], -1, 32).astype(np.float64) * dx.astype(np.float64)[..., None]
    return torch.from_numpy(xq.reshape(q.shape[0], -1) @ dense.double().numpy().T)


def test_activation_rows_quantize_as_defined():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 96, generator=g) * torch.logspace(-3, 3, 96)
    x[1, 32:64] = 0  # a zero block: dx = 0, q = 0
    q, dx, sx = _C.testing.quantize_rows(x)
    want_q, want_dx, want_sx = numpy_quantize_rows(x)
    assert np.array_equal(q.numpy(), want_q) and np.array_equal(dx.numpy(), want_dx)
    assert np.array_equal(sx.numpy(), want_sx)
    assert dx[1, 1] == 0 and not q[1, 32:64].any()
    x[2, 5] = float("inf")
    _, dx, _ = _C.testing.quantize_rows(x)
    assert dx[2, 0].isnan() and dx[2, 1:].isfinite().all()  # a non-finite block's outputs are NaN


@pytest.mark.parametrize("fmt,n,k", format_shapes())
def test_int8_product_is_its_definition_and_batch_invariant(fmt, n, k):
    blocks, dense = quantized(n, k, fmt, seed=n * 1000 + k + 1)
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(max(ROW_COUNTS), k, generator=g)
    full, _ = _C.testing.quant_linear(x, blocks, fmt, k, None, 1, True)
    ref = int8_reference(x, dense)
    assert ((full.double() - ref).abs() / ref.abs().max()).max().item() < 1e-5
    for m in ROW_COUNTS:
        rows = torch.randperm(x.shape[0], generator=g)[:m]
        for threads in (1, 2, 3):
            part, _ = _C.testing.quant_linear(x[rows], blocks, fmt, k, None, threads, True)
            assert torch.equal(part, full[rows]), (m, threads)


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_product_gives_the_same_bits_on_every_instruction_set(fmt):
    k = 512 if fmt in K_QUANTS else 320
    blocks, _ = random_blocks(37, k, fmt, seed=6)  # every quant value, extreme scales
    x = torch.randn(19, k)
    x[3] = torch.where(torch.arange(k) % 3 == 0, -1.0, 1.0)  # every activation at q = +-127
    bias = torch.randn(37)
    previous = _C.cpu_isa()
    try:
        _C.set_cpu_isa("portable")
        want, _ = _C.testing.quant_linear(x, blocks, fmt, k, bias, 2, True)
        for isa in _C.cpu_isas():
            _C.set_cpu_isa(isa)
            got, _ = _C.testing.quant_linear(x, blocks, fmt, k, bias, 2, True)
            assert torch.equal(got, want), isa
            # and batch invariant on each path (groups of 1 to 8 rows, and more)
            for rows in ([4], [8, 1, 2], [5, 6, 7, 0], list(range(8)), list(range(18, 1, -1))):
                part, _ = _C.testing.quant_linear(x[rows], blocks, fmt, k, bias, 1, True)
                assert torch.equal(part, want[rows]), (isa, rows)
    finally:
        _C.set_cpu_isa(previous)
    # int8 activations are a different product from the fp32-activation one
    exact, _ = _C.testing.quant_linear(x, blocks, fmt, k, bias, 2, False)
    assert not torch.equal(exact, want)
