"""A plain quantiser to GGUF's k-quant blocks (Q4_K, Q5_K, Q6_K), for test files.

gguf-py dequantises these formats but has no quantiser. This one writes
ggml's block layouts with simple min/max scales (llama.cpp's searches for
better ones); what it writes is read back by gguf-py's dequantiser, the
tests' reference, so only the layout has to be right, and
test_kquant_writer_round_trips checks that.
"""
from __future__ import annotations

import numpy as np

SUPER = 256  # weights per k-quant block
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def _half(values: np.ndarray) -> np.ndarray:
    """float -> fp16 bytes [.., 2], and the fp16 values back as float32."""
    h = values.astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8), h.astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def _q45_k(x: np.ndarray, bits: int) -> np.ndarray:
    """Blocks [nb, 256] -> Q4_K (bits 4) or Q5_K (bits 5) bytes [nb, 144 or 176]."""
    nb = x.shape[0]
    qmax = (1 << bits) - 1
    sub = x.reshape(nb, 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale, mins = (sub.max(-1) - lo) / qmax, -lo
    d_bytes, d = _half(scale.max(-1) / 63)
    m_bytes, dmin = _half(mins.max(-1) / 63)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(mins, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc.astype(np.float32)
    offset = dmin[:, None] * mn.astype(np.float32)
    q = np.clip(np.rint(_safe_div(sub + offset[..., None], step[..., None])), 0, qmax).astype(np.uint8)
    # 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4 read backwards)
    scales = np.zeros((nb, 12), np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    # sub-blocks 2c and 2c + 1 share 32 bytes: low and high nibbles
    low = q & 0x0F
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(nb, 128)
    parts = [d_bytes, m_bytes, scales]
    if bits == 5:  # bit s of qh[l]: the 5th bit of weight l of sub-block s
        high = (q >> 4) & 1
        parts.append((high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8))
    parts.append(qs)
    return np.concatenate(parts, axis=-1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Blocks [nb, 256] -> Q6_K bytes [nb, 210]."""
    nb = x.shape[0]
    sub = x.reshape(nb, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d_bytes, d = _half(scale.max(-1) / 127)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), -128, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = (np.clip(np.rint(_safe_div(sub, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(nb, 8, 32)
    # per half of 128: sub-blocks c = 0..3 in ql's low nibbles at 0, 32, high
    # nibbles at 0, 32; their bits 4-5 in qh's bit pairs c
    ql = np.zeros((nb, 2, 64), np.uint8)
    qh = np.zeros((nb, 2, 32), np.uint8)
    for s in range(8):
        half, c = divmod(s, 4)
        at = slice(32 * (c % 2), 32 * (c % 2) + 32)
        ql[:, half, at] |= (q[:, s] & 0x0F) << (4 * (c // 2))
        qh[:, half] |= ((q[:, s] >> 4) & 3) << (2 * c)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), d_bytes], axis=-1)


def quantize_k(array: np.ndarray, kind: str) -> np.ndarray:
    """A float matrix [n, k] (k a multiple of 256) -> its GGUF rows in `kind`, uint8 [n, row bytes]."""
    n, k = array.shape
    if k % SUPER:
        raise ValueError(f"{kind} rows hold multiples of {SUPER} weights, not {k}")
    blocks = array.astype(np.float32).reshape(-1, SUPER)
    out = _q6_k(blocks) if kind == "Q6_K" else _q45_k(blocks, 4 if kind == "Q4_K" else 5)
    return np.ascontiguousarray(out.reshape(n, -1))
