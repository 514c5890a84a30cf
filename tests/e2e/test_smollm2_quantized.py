"""SmolLM2-135M-Instruct (real Q4_1 GGUF) with its matrices kept in blocks.

The demo file's blocks (q4_1 layers, a q8_0 embedding) stay as they are with
dtype "auto": resident memory stays near the file's size, and a q8_0 model
quantized at load scores text within 1 % of the fp32 model's perplexity.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ssd import _C, models
from ssd.assets import humaneval_prompts, smollm2_gguf_path

TEXT_TOKENS = 2048
CHUNK = 256


@pytest.fixture(scope="module")
def gguf_path():
    return smollm2_gguf_path()


def test_resident_memory_after_loading_stays_near_the_file_size(gguf_path):
    # A fresh process: the tokenizer is built once first (its memory is the same
    # for every dtype), then an engine loads the model.
    script = textwrap.dedent("""
        import gc, sys
        import ssd
        from ssd import models

        def rss():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

        path = sys.argv[1]
        models.load_tokenizer(path)
        gc.collect()
        base = rss()
        llm = ssd.LLM(path, dtype="auto", max_model_len=256)
        gc.collect()
        grown = rss() - base
        weight_bytes = llm.model.core_model().weight_bytes
        llm.shutdown()
        print(grown, weight_bytes)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(gguf_path)], capture_output=True, text=True,
                         timeout=300, check=True)
    grown, weight_bytes = map(int, out.stdout.split())
    size = os.path.getsize(gguf_path)
    assert weight_bytes <= 1.2 * size, (weight_bytes, size)
    assert grown <= 1.3 * size, f"resident memory grew by {grown / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


def _text_ids(tokenizer) -> list[int]:
    """A fixed text of TEXT_TOKENS tokens: the HumanEval prompts in order."""
    ids: list[int] = []
    for prompt in humaneval_prompts():
        ids += tokenizer.encode(prompt)
        if len(ids) >= TEXT_TOKENS:
            return ids[:TEXT_TOKENS]
    raise AssertionError("the HumanEval prompts hold fewer tokens than the text needs")


def _perplexity(model: models.LoadedModel, ids: list[int]) -> float:
    """exp(mean NLL of ids[1:]), scored in CHUNK-token forwards of one sequence."""
    core = model.core_model()
    runner = _C.SequenceRunner(core, (len(ids) + 15) // 16, 16, 2)
    seq = runner.add_sequence()
    nll = 0.0
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = ids[start:start + CHUNK]
        logits = runner.extend([(seq, chunk)], True)
        targets = torch.tensor(ids[start + 1:start + 1 + len(chunk)])
        logp = torch.log_softmax(logits[:len(targets)], dim=-1)
        nll -= logp.gather(1, targets[:, None]).double().sum().item()
    return math.exp(nll / (len(ids) - 1))


def test_q8_0_perplexity_is_within_one_percent_of_fp32(gguf_path):
    fp32 = models.load(gguf_path, dtype="float32")
    ids = _text_ids(fp32.require_tokenizer())
    reference = _perplexity(fp32, ids)
    del fp32
    q8 = models.load(gguf_path, dtype="q8_0")
    assert len(q8.formats) == 30 * 7 + 1  # every projection and the (tied) embedding
    got = _perplexity(q8, ids)
    assert 1 < reference < 100, reference  # the text is scored as text, not noise
    assert abs(got / reference - 1) < 0.01, (got, reference)
