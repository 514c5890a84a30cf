"""The round on the target's device (runtime/target_round.h), exercised on the CPU.

backend="aten" keeps the target's logits in tensors and runs every round
through the device path, the same code a GPU runs (only the kernels differ,
and those are compared with their CPU twins under -m cuda). The laws, the
Gumbel identity, preemption and cancellation are checked here; logprobs
(tests/runtime/test_logprobs.py) and NaN logits (test_engine.py) on both
backends there. The cpu backend runs the same round code over host tensors.
"""
import random
import time

import pytest

from ssd import LLM, SamplingParams
from tests.reference import law
from tests.runtime import test_gumbel_coupling, test_sd, test_ssd

ATEN = {"backend": "aten"}


def two_gpus():
    import torch
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


# Engine settings of each placement. On the CPU the aten backend stands in for
# a device; with a GPU (-m cuda, scripts/gpu_check.sh): the draft on the
# target's GPU, on the CPU beside it, and on its own GPU.
PLACEMENTS = [
    pytest.param(ATEN, id="aten"),
    pytest.param({"target_device": "cuda", "draft_device": "cuda"}, id="cuda-same-gpu", marks=pytest.mark.cuda),
    pytest.param({"target_device": "cuda", "draft_device": "cpu"}, id="cuda-draft-cpu", marks=pytest.mark.cuda),
    pytest.param({"target_device": "cuda:0", "draft_device": "cuda:1"}, id="cuda-own-gpu",
                 marks=[pytest.mark.cuda, pytest.mark.skipif("not two_gpus()", reason="needs two GPUs")]),
]


def target_only(placement):
    """The ar oracle's settings: the target's placement without the draft's."""
    return {k: v for k, v in placement.items() if k != "draft_device"}


def prompts(n, seed=0, longest=30):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(1, longest))] for _ in range(n)]


def greedy(n, **kw):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def seeded(n, count, seed0=300, **kw):
    return [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_tokens=n, ignore_eos=True, seed=seed0 + i, **kw)
            for i in range(count)]


def run(model, params, batch, **engine):
    with LLM(model, max_model_len=128, **engine) as llm:
        outs = llm.generate(batch, params)
        return [o.token_ids for o in outs], llm.stats(), outs


MODES = {
    "ar": {},
    "sd": {"mode": "sd", "adaptive": False, "k": 3},
    "ssd": {"mode": "ssd", "adaptive": False, "k": 3, "fallback": "neural"},
}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_equals_ar(pair, mode, placement):
    target, draft = pair
    batch = prompts(12)
    want, _, _ = run(target, greedy(24), batch, **target_only(placement))
    got, stats, _ = run(target, greedy(24), batch, draft=draft, max_batch=4, **MODES[mode], **placement)
    assert got == want
    assert stats["rounds"] > 0 and stats["draft_tokens_accepted"] > 0


@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
def test_seeded_ar_equals_the_cpu_backend(pair, coupling):
    """Same kernels, same keyed draws: the device path draws the cpu backend's
    tokens. (ar only: the two backends' logits may differ in the last bits, and
    under the rejection coupling sd's and ssd's outputs follow the draft's
    numerics, so there the law tests below are the check.)"""
    target, _ = pair
    batch = prompts(8, seed=1)
    want, _, _ = run(target, seeded(20, 8), batch, coupling=coupling)
    got, _, _ = run(target, seeded(20, 8), batch, coupling=coupling, **ATEN)
    assert got == want


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_gumbel_seeded_sd_and_ssd_equal_ar(pair, placement):
    target, draft = pair
    batch = prompts(8, seed=2)
    want, _, _ = run(target, seeded(24, 8), batch, coupling="gumbel", **target_only(placement))
    for mode in ("sd", "ssd"):
        got, stats, _ = run(target, seeded(24, 8), batch, coupling="gumbel", draft=draft, **MODES[mode], **placement)
        assert got == want, mode
        assert 0 < stats["draft_tokens_accepted"] < stats["draft_tokens_proposed"]


@pytest.mark.parametrize("coupling,per_step", [("rejection", 2 * 8 + 1), ("gumbel", 8 + 1)])
def test_only_counts_and_tokens_cross_to_the_host(pair, coupling, per_step):
    """One sequence, ar: a step reads its outcome (rejection: the accepted count
    and the bonus; gumbel: the token its row draws, 8 bytes each) and the row's
    NaN flag (1 byte) -- never the row of 256 logits (1 KiB)."""
    target, _ = pair
    _, stats, _ = run(target, [greedy(20)], [[5, 6, 7]], coupling=coupling, **ATEN)
    assert stats["round_host_bytes"] == per_step * stats["steps"]
    assert stats["round_host_bytes_per_step"] == per_step


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculative_rounds_read_no_rows(pair, mode):
    target, draft = pair
    _, stats, _ = run(target, greedy(32), prompts(6, seed=3), draft=draft, max_batch=6, **MODES[mode], **ATEN)
    # At most a token (8 bytes) and a NaN flag for each of the k + 1 = 4 rows of 6 sequences.
    assert 0 < stats["round_host_bytes_per_step"] <= 6 * 4 * 9
    assert stats["round_host_bytes_per_step"] < 256 * 4  # one logit row


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_sd_draft_reads_back_only_its_tokens(pair, placement):
    """sd's draws run on the draft's device: each draft forward reads back one
    token (8 bytes) per drafting sequence; its q rows (256 floats each) stay
    there and go to the target's device from there."""
    target, draft = pair
    want, _, _ = run(target, greedy(32), prompts(6, seed=3), **target_only(placement))
    got, stats, _ = run(target, greedy(32), prompts(6, seed=3), draft=draft, max_batch=6, **MODES["sd"], **placement)
    assert got == want
    assert stats["draft_forwards"] > 0
    assert 0 < stats["draft_host_bytes"] <= 8 * 6 * stats["draft_forwards"]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
def test_ssd_draft_reads_back_only_tokens_and_lists(pair, placement, coupling):
    """ssd's draws and its trees' rankings run on the draft's device: a row
    reads back its token (8 bytes) and its ranked list (depth 3 here: 3 ids, and
    under the Gumbel coupling their scores, 8 bytes each), never the row of
    256 logits (1 KiB). Every tree branch samples k rows, so a draft reading
    rows would pass 1 KiB per branch row; the lists stay far below."""
    target, draft = pair
    params = greedy(32) if coupling == "rejection" else seeded(32, 4)
    batch = prompts(4, seed=3)
    want, _, _ = run(target, params, batch, coupling=coupling, **target_only(placement))
    got, stats, _ = run(target, params, batch, coupling=coupling, draft=draft, max_batch=4, fanout=[1, 1, 1, 1],
                        **MODES["ssd"], **placement)
    assert got == want
    assert stats["tree_branches"] > 0
    assert 0 < stats["draft_host_bytes"] < 256 * MODES["ssd"]["k"] * stats["tree_branches"]


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_with_preemption_equals_ar(pair, mode):
    target, draft = pair
    batch = prompts(16, seed=5, longest=40)
    want, _, _ = run(target, greedy(40), batch)
    got, stats, _ = run(target, greedy(40), batch, draft=draft, max_batch=16, kv_block_size=8, kv_capacity_tokens=512,
                        **MODES[mode], **ATEN)
    assert stats["num_preemptions"] >= 1
    assert got == want


def test_cancel_mid_generation(pair):
    target, draft = pair
    with LLM(target, draft=draft, max_model_len=256, **MODES["ssd"], **ATEN) as llm:
        handles = llm._dispatcher.submit(llm._prepare([[1, 2, 3], [4, 5]], [greedy(200), greedy(40)]))
        deadline = time.time() + 120
        while len(handles[0].output.token_ids) < 5 and not handles[0].done.is_set() and time.time() < deadline:
            time.sleep(0.005)
        handles[0].cancel()
        outs = [h.wait() for h in handles]
        assert outs[0].finish_reason == "cancelled" and 5 <= len(outs[0].token_ids) < 200
        assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 40
        # The engine goes on: a fresh request after the cancel completes.
        assert len(llm.generate([[4, 5]], greedy(8))[0].token_ids) == 8


# --- the output laws on the device path (vocabulary 4, enumerated) --------------------------------


# On a GPU, with the draft on the target's GPU. On the CPU the law tests of
# test_sd.py, test_ssd.py and test_gumbel_coupling.py run this same round code
# (the cpu backend's logits are host tensors and its round steps are the CPU
# kernels); the aten backend's row-by-row forward would make them minutes long.
LAW_PLACEMENTS = [PLACEMENTS[1]]


@pytest.mark.parametrize("placement", LAW_PLACEMENTS)
def test_sd_rejection_law(small_pair, placement):
    test_sd.check_output_law(small_pair, *test_sd.LAW_CASES[1], **placement)


@pytest.mark.parametrize("placement", LAW_PLACEMENTS)
def test_ssd_rejection_law(small_pair, placement):
    temperature, top_k, top_p, max_batch, engine = test_ssd.LAW_CASES["C0.3-neural-topk-topp"]
    outs, stats, laws = test_ssd.run_law(small_pair, temperature, top_k, top_p, max_batch, **engine, **placement)
    counts = law.counts_of(outs, test_ssd.VOCAB, test_ssd.N_TOKENS)
    assert 0.05 < stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"] < 0.95
    assert stats["cache_hits"] > 0
    for expected, observed in zip(laws, law.views(counts)):
        assert test_ssd.g_test(observed, expected) > 0.001


@pytest.mark.parametrize("placement", LAW_PLACEMENTS)
@pytest.mark.parametrize("case", ["sd", "ssd-neural"])
def test_gumbel_law(small_pair, case, placement):
    p_values, stats = test_gumbel_coupling.law_run(small_pair, case, **placement)
    assert 0.05 < stats["draft_tokens_accepted"] / stats["draft_tokens_proposed"] < 0.95
    assert min(p_values) > test_gumbel_coupling.ALPHA


@pytest.mark.cuda
def test_short_ssd_run_on_cuda(pair):
    """What scripts/gpu_check.sh runs under compute-sanitizer: a few ssd rounds on one GPU."""
    target, draft = pair
    want, _, _ = run(target, greedy(8), prompts(2), target_device="cuda")
    got, stats, _ = run(target, greedy(8), prompts(2), draft=draft, target_device="cuda", draft_device="cuda",
                        **MODES["ssd"])
    assert got == want and stats["rounds"] > 0


def test_backend_must_match_the_models(pair):
    import ssd.models
    from ssd import _C, EngineConfig
    with pytest.raises(ValueError, match="backend: must be 'auto' or 'aten', got 'cuda'"):
        EngineConfig(backend="cuda")
    loaded = ssd.models.load(pair[0])
    core = loaded.core_model("cpu", "auto")
    with pytest.raises(ValueError, match="backend: 'aten', but the model of target_device was built for the 'cpu'"):
        _C.Engine(EngineConfig(backend="aten", max_model_len=64).to_dict(), core, [], None, {})
