"""The backends' KV copy between cache slots (Backend::copy_kv_slots, the ssd
draft's tree branches and cache hits) against torch indexing of the storage,
and ssd with its draft on the aten backend against ar."""
from __future__ import annotations

import random

import pytest
import torch

from ssd import LLM, SamplingParams, _C
from ssd.models import LoadedModel, load

# (device, backend argument) of every backend under test
BACKENDS = [pytest.param(("cpu", "auto"), id="cpu"),
            pytest.param(("cpu", "aten"), id="aten"),
            pytest.param(("cuda", "auto"), id="cuda", marks=pytest.mark.cuda),
            pytest.param(("cuda", "aten"), id="cuda-aten", marks=pytest.mark.cuda)]

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 3, 5, 4, 2, 8
SLOTS = BLOCKS * BLOCK_SIZE


@pytest.fixture(scope="module", params=BACKENDS)
def steps(request):
    return _C.testing.BackendSteps(*request.param)


def _kv():
    """A storage whose every element is distinct (a misplaced row cannot look right)."""
    n = LAYERS * 2 * SLOTS * HEADS * HEAD_DIM
    return torch.arange(n, dtype=torch.float32).view(LAYERS, 2, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM)


def _oracle(kv, src, dst):
    """kv with every [layer, kind] plane's rows src (all read first) written to dst."""
    planes = kv.reshape(LAYERS * 2, SLOTS, HEADS * HEAD_DIM)
    out = planes.clone()
    out[:, torch.tensor(dst, dtype=torch.long)] = planes[:, torch.tensor(src, dtype=torch.long)]
    return out.view_as(kv)


COPIES = {
    # name: (src slots, dst slots)
    "one-row": ([1], [13]),
    "partial-block": ([8, 9, 10], [16, 17, 18]),  # a branch copying its fork's partial block
    "across-blocks": ([2, 3, 4, 5, 6], [14, 15, 0, 1, 11]),
    "shift-up": ([3, 4, 5, 6], [4, 5, 6, 7]),  # each source but the first is an earlier destination
    "shift-down": ([4, 5, 6, 7], [3, 4, 5, 6]),
    "swap": ([0, 19], [19, 0]),
    "onto-itself": ([7, 12], [7, 12]),
    "last-slot": ([SLOTS - 1], [0]),
    "empty": ([], []),
}


@pytest.mark.parametrize("case", sorted(COPIES))
def test_copy_matches_torch_indexing(steps, case):
    src, dst = COPIES[case]
    kv = _kv()
    got = steps.copy_kv_slots(kv, src, dst).cpu()
    assert torch.equal(got, _oracle(kv, src, dst))
    if src and src != dst:
        assert not torch.equal(got, kv)  # the case moved something


BAD = [
    # (src, dst, message)
    ([0, SLOTS], [1, 2], rf"src_slots\[1\] = {SLOTS} is outside the cache's slots \[0, {SLOTS}\)"),
    ([-1], [1], rf"src_slots\[0\] = -1 is outside the cache's slots \[0, {SLOTS}\)"),
    ([0, 1, 2], [3, 4, 99], rf"dst_slots\[2\] = 99 is outside the cache's slots \[0, {SLOTS}\)"),
    ([0], [-3], r"dst_slots\[0\] = -3 is outside"),
    ([0, 1, 2], [5, 6, 5], r"dst_slots\[2\] = 5 repeats dst_slots\[0\]"),
    ([0, 1], [5], r"2 src_slots but 1 dst_slots"),
]


@pytest.mark.parametrize("src,dst,message", BAD)
def test_bad_slots_are_a_value_error_naming_the_index(steps, src, dst, message):
    kv = _kv()
    with pytest.raises(ValueError, match=message):
        steps.copy_kv_slots(kv, src, dst)


def test_ssd_with_its_draft_on_aten_equals_ar(pair, monkeypatch):
    """The draft (the target itself, so most lookups hit) on the aten backend:
    branches and hits copy its KV with ATen ops."""
    target, _ = pair
    draft = load(target, dtype=torch.float32)
    built = []

    def aten_core(device="cpu", backend="auto", batch_invariant=True, int8_activations=True, **options):
        core = LoadedModel.core_model(draft, device, "aten", batch_invariant, int8_activations, **options)
        built.append(core.backend)
        return core

    monkeypatch.setattr(draft, "core_model", aten_core)
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(2, 20))] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(target, max_model_len=128) as ar:
        want = [o.token_ids for o in ar.generate(prompts, params)]
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=128, max_batch=4,
             draft_matmul_min_rows=0) as ssd:
        got = [o.token_ids for o in ssd.generate(prompts, params)]
        stats = ssd.stats()
    assert built == ["aten"]
    assert got == want
    assert stats["kv_commits"] == stats["cache_hits"] > 0
    # The draft computes the target's logits (in another order): a wrong KV
    # copy would show as rejected proposals long before it changed a token.
    assert stats["draft_tokens_accepted"] >= 0.9 * stats["draft_tokens_proposed"]
