"""Weight matrices kept in GGUF block formats (``q8_0``, ``q4_0``, ``q4_1``,
``q5_0``, ``q5_1``, ``q4_k``, ``q5_k``, ``q6_k``).

Such a matrix ``[n, k]`` is held as its GGUF rows, a uint8 tensor
``[n, row_bytes]``, and ``LoadedModel.formats`` names its format. The CPU
backend multiplies the blocks without dequantising the matrix
(``csrc/kernels/cpu/quant.h``): with int8 activations (the default, as
llama.cpp does), or with fp32 ones, whose products equal those of the fp32
matrix dequantised from the blocks bit for bit. Other backends dequantise at
load. See docs/models.md.

The load dtypes (``ssd.models.load(..., dtype=)``, ``EngineConfig.dtype``):

* ``"float32"``, ``"bfloat16"``: every weight dequantised / converted.
* ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``: every matrix
  (the embedding and the projections; norms stay fp32) quantized at load from
  its fp32 values (gguf's quantizers), whatever the file held. gguf has no
  quantizer for the k-quants, so they come only from files.
* ``"auto"``: a GGUF file's matrices stay in the file's format where ssd has
  kernels for it (F16 and BF16 ones as float16 / bfloat16 tensors); any other
  type is dequantised to fp32 with a one-line warning naming it. An HF
  checkpoint loads as fp32.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

import numpy as np
import torch

FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
LOAD_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # those gguf-py can quantize to
DTYPES = ("float32", "bfloat16", *LOAD_FORMATS, "auto")
BLOCK = 32  # weights per block of the load formats (the k-quants' blocks hold 256)



def gguf_package():
    """The gguf package, imported on first use: ``ssd.models`` loads HF
    checkpoints without it (the GPU machines lack it)."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError("GGUF files and block formats need the gguf package: pip install gguf") from e
    return gguf


@functools.cache
def ggml_types() -> dict:
    """Format name -> ggml tensor type, for FORMATS."""
    return {fmt: getattr(gguf_package().GGMLQuantizationType, fmt.upper()) for fmt in FORMATS}


@functools.cache
def _sixteen_bit() -> dict:
    # 16-bit float types an "auto" load keeps as torch tensors of their own dtype
    # (the CPU backend multiplies fp16 matrices as they are; bf16 is a model dtype).
    types = gguf_package().GGMLQuantizationType
    return {types.F16: torch.float16, types.BF16: torch.bfloat16}


log = logging.getLogger("ssd")


def is_matrix(name: str) -> bool:
    """Whether a HF weight name is a matrix a block format may hold (embedding, lm_head, projections)."""
    return name in ("model.embed_tokens.weight", "lm_head.weight") or name.endswith("_proj.weight")


def native_format(tensor_type) -> str | None:
    """The format name of a ggml tensor type ssd multiplies in its blocks, else None."""
    return next((fmt for fmt, t in ggml_types().items() if t == tensor_type), None)


def block_weights(fmt: str) -> int:
    """Weights per GGUF block of ``fmt`` (32, or 256 for the k-quants)."""
    return gguf_package().GGML_QUANT_SIZES[ggml_types()[fmt]][0]


def row_bytes(fmt: str, k: int) -> int:
    """Bytes of one GGUF row of ``k`` weights (a multiple of the block) in ``fmt``."""
    weights, size = gguf_package().GGML_QUANT_SIZES[ggml_types()[fmt]]
    return k // weights * size


def quantize(tensor: torch.Tensor, fmt: str) -> torch.Tensor:
    """A float matrix [n, k] (k a multiple of 32) -> its GGUF rows in ``fmt``, uint8 [n, row_bytes]."""
    array = tensor.detach().to("cpu", torch.float32).contiguous().numpy()
    return torch.from_numpy(np.ascontiguousarray(gguf_package().quants.quantize(array, ggml_types()[fmt])))


def quantize_matrices(weights: dict[str, torch.Tensor], fmt: str, source: str) -> dict[str, str]:
    """Replaces every float matrix of ``weights`` by its ``fmt`` rows; returns name -> format.

    A matrix whose row length is not a multiple of 32 stays as it is, with one
    warning naming the first such matrix.
    """
    formats: dict[str, str] = {}
    skipped: list[str] = []
    for name in [n for n in weights if is_matrix(n)]:
        tensor = weights[name]
        if tensor.dim() != 2 or tensor.shape[1] % BLOCK:
            skipped.append(name)
            continue
        weights[name] = quantize(tensor, fmt)
        formats[name] = fmt
    if skipped:
        log.warning("%s: %d matrices (first %s, rows of %d) are not in blocks of %d and stay float32, not %s",
                    source, len(skipped), skipped[0], weights[skipped[0]].shape[-1], BLOCK, fmt)
    return formats


def warn_dequantized(types: Iterable[str], source: str) -> None:
    """One warning naming the ggml types an ``auto`` load dequantised."""
    names = sorted(set(types))
    if names:
        log.warning("%s: tensors of type %s have no ssd kernel and are dequantised to float32",
                    source, ", ".join(names))


def sixteen_bit_dtype(tensor_type) -> torch.dtype | None:
    """torch.float16 / torch.bfloat16 for a ggml F16 / BF16 tensor type, else None."""
    return _sixteen_bit().get(tensor_type)


def is_float_type(tensor_type) -> bool:
    """Whether a ggml type is stored as fp32 (read as is, no warning)."""
    # ggml types read as plain floats (no warning when they are dequantised).
    return tensor_type == gguf_package().GGMLQuantizationType.F32
