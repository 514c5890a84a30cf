"""kv_cache_dtype="bfloat16": KV caches holding each K / V value rounded to
bf16 (half the bytes), attention computing in fp32 over the widened values.

What must hold: the logits stay within a stated distance of the fp32 cache's
(and do move: the rounding happens), every row stays bitwise independent of
the batch and of chunking, and greedy sd and ssd stay token-identical to ar
with the same cache type, on the cpu backend and on the aten one (the device
path)."""
from __future__ import annotations

import pytest
import torch

import ssd
from ssd import LLM, SamplingParams, _C
from tests.reference.tiny_models import random_tokens
from tests.runtime.test_device_round import MODES, prompts

BACKENDS = ["auto", "aten"]  # on the CPU: the cpu backend and the device path

# The largest logit difference bf16 caches may make on the test target over a
# 300-token sequence (3 layers, logits up to 3.4 in magnitude; measured
# 1.57e-2 on both backends).
LOGIT_TOLERANCE = 3e-2


def runner(core, kv_dtype, tokens=600, block_size=16):
    return _C.SequenceRunner(core, -(-tokens // block_size), block_size, 1, kv_dtype=kv_dtype)


@pytest.fixture(scope="module")
def target(pair):
    return ssd.models.load(pair[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_within_tolerance_of_fp32_caches(target, backend):
    core = target.core_model("cpu", backend)
    tokens = random_tokens(300, 256, seed=5)
    rows = {}
    for dtype in ("float32", "bfloat16"):
        r = runner(core, dtype)
        rows[dtype] = r.extend([(r.add_sequence(), tokens)], True)
        assert r.cache_storage().dtype == getattr(torch, dtype)
    diff = (rows["bfloat16"] - rows["float32"]).abs().max().item()
    assert 0 < diff < LOGIT_TOLERANCE, diff
    # The first row attends only to itself: one key, softmax 1, the value's
    # rounding alone moves it.
    assert not torch.equal(rows["bfloat16"][1:], rows["float32"][1:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_rows_are_batch_and_chunk_invariant(target, backend):
    """Decoding token by token after a prefill, and in verify-sized chunks
    beside another sequence, gives the one-pass prefill's rows bitwise."""
    core = target.core_model("cpu", backend)
    tokens, other = random_tokens(280, 256, seed=6), random_tokens(40, 256, seed=7)
    r = runner(core, "bfloat16")
    want = r.extend([(r.add_sequence(), tokens)], True)
    r = runner(core, "bfloat16", tokens=400)
    seq, side = r.add_sequence(), r.add_sequence()
    got = [r.extend([(seq, tokens[:200])], True)]
    pos = 200
    for size in [1, 5, 3, 16, 1, 7] * 20:
        if pos >= len(tokens):
            break
        chunk = tokens[pos:pos + size]
        batch = [(seq, chunk)] + ([(side, other[:size])] if len(other) >= size else [])
        other = other[size:]
        got.append(r.extend(batch, True)[:len(chunk)])
        pos += len(chunk)
    assert torch.equal(torch.cat(got), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_sd_and_ssd_equal_ar_with_bf16_caches(pair, mode, backend):
    target, draft = pair
    batch = prompts(8)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    with LLM(target, max_model_len=128, kv_cache_dtype="bfloat16", backend=backend) as llm:
        want = [o.token_ids for o in llm.generate(batch, params)]
    with LLM(target, draft=draft, max_model_len=128, max_batch=4, kv_cache_dtype="bfloat16", backend=backend,
             **MODES[mode]) as llm:
        got = [o.token_ids for o in llm.generate(batch, params)]
        stats = llm.stats()
    assert got == want
    assert stats["rounds"] > 0 and stats["draft_tokens_accepted"] > 0, stats


def test_kv_cache_dtype_is_checked_and_offered_on_the_command_line():
    with pytest.raises(ValueError, match="kv_cache_dtype: must be 'auto', 'float32' or 'bfloat16', got 'half'"):
        ssd.EngineConfig(kv_cache_dtype="half")
    from ssd.cli import serve_parser
    args = serve_parser().parse_args(["some/model", "--kv-cache-dtype", "bfloat16"])
    assert args.kv_cache_dtype == "bfloat16"
