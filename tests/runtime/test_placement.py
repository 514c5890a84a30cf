"""Device placement and the KV budget against each device's memory.

Placements (docs/gpu.md): both models on the CPU; the target on a GPU with
the draft on the CPU, on the same GPU or on another GPU. A device this build
or machine cannot use, or a placement outside those, is a ValueError naming
the field, raised before any weight is loaded. The CUDA placements are
checked here through ssd.testing.FakeDevices (the config's own validation and
KV resolution against a stated machine); the tests marked cuda run them.
"""
from __future__ import annotations

import gc
import random

import pytest
import torch

from ssd import LLM, EngineConfig, SamplingParams, _C
from ssd.cli import serve_parser
from ssd.models import ModelConfig
from ssd.testing import FakeDevices, TestingConfig, resolve_engine_config

HAS_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0
GIB = 2**30

# KV bytes per token = layers * 2 (K, V) * kv heads * head_dim * 4 (fp32):
# target 4 * 2 * 2 * 64 * 4 = 4096, draft 2 * 2 * 2 * 64 * 4 = 2048.
TARGET = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=128, intermediate_size=256,
                     num_layers=4, num_heads=2, num_kv_heads=2, head_dim=64, max_position_embeddings=2048)
DRAFT = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=128, intermediate_size=256,
                    num_layers=2, num_heads=2, num_kv_heads=2, head_dim=64, max_position_embeddings=2048)


def machine(*cuda, host_bytes=64 * GIB):
    """TestingConfig whose fake machine has these GPUs, each (free GiB, total GiB)."""
    return TestingConfig(fake_devices=FakeDevices(cuda=tuple((int(f * GIB), int(t * GIB)) for f, t in cuda),
                                                  host_bytes=host_bytes))


def resolve(mode="ssd", testing=None, **fields):
    # fp32 caches on every device unless a test says otherwise (the byte counts above).
    fields.setdefault("kv_cache_dtype", "float32")
    return resolve_engine_config(TARGET, None if mode == "ar" else DRAFT, mode=mode, adaptive=False,
                                 testing=testing, **fields)


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


# ---- device strings and placements (the config's validation)

def test_bad_device_strings_are_refused():
    for device in ["tpu", "cuda:", "cuda:x", "CUDA", "cuda:0:1", ""]:
        with pytest.raises(ValueError, match=f"target_device: device '{device}': expected 'cpu', 'cuda' or 'cuda:N'"):
            EngineConfig(target_device=device)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
@pytest.mark.parametrize("target_device,draft_device", [("cuda:0", "cuda:0"), ("cuda", "cuda:1"),
                                                        ("cuda:1", "cpu"), ("cpu", "cpu")])
def test_supported_placements_resolve(mode, target_device, draft_device):
    got = resolve(mode, machine((20, 40), (20, 40)), target_device=target_device, draft_device=draft_device)
    assert got["max_model_len"] == 2048


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_device_past_the_last_gpu_names_the_count(mode):
    with pytest.raises(ValueError, match=r"target_device: device 'cuda:2': this machine has 2 CUDA devices "
                                         r"\(cuda:0..cuda:1\)"):
        resolve(mode, machine((20, 40), (20, 40)), target_device="cuda:2")
    if mode != "ar":
        with pytest.raises(ValueError, match=r"draft_device: device 'cuda:1': this machine has 1 CUDA device "
                                             r"\(cuda:0..cuda:0\)"):
            resolve(mode, machine((20, 40)), target_device="cuda:0", draft_device="cuda:1")


def test_gpu_on_a_machine_without_one_is_named():
    with pytest.raises(ValueError, match="target_device: device 'cuda': no CUDA device is available"):
        resolve("ssd", machine(), target_device="cuda")


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_gpu_draft_beside_a_cpu_target_is_refused(mode):
    with pytest.raises(ValueError, match="draft_device: 'cuda:0' with target_device 'cpu' is not a supported "
                                         "placement"):
        resolve(mode, machine((20, 40)), target_device="cpu", draft_device="cuda:0")


def test_ar_refuses_a_draft_device():
    with pytest.raises(ValueError, match="draft_device: mode 'ar' runs no draft model, so draft_device must "
                                         "stay 'cpu', got 'cuda:0'"):
        resolve("ar", machine((20, 40)), target_device="cuda:0", draft_device="cuda:0")
    with pytest.raises(ValueError, match="draft_device: mode 'ar' runs no draft model"):
        EngineConfig(mode="ar", draft_device="cuda:7")


@pytest.mark.skipif(HAS_GPU, reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_a_value_error(pair, device):
    # This machine, no fake: the refusal comes before any weight is loaded.
    target, draft = pair
    with pytest.raises(ValueError, match=f"target_device: device '{device}': no CUDA device is available"):
        LLM(target, target_device=device, max_model_len=64)
    with pytest.raises(ValueError, match=f"draft_device: device '{device}': no CUDA device is available"):
        LLM(target, draft=draft, mode="ssd", adaptive=False, draft_device=device, max_model_len=64)
    with pytest.raises(ValueError, match=f"device '{device}': no CUDA device is available"):
        _C.testing.BackendSteps(device)
    assert "cuda" in _C.device_problem(device)
    assert _C.device_problem("cpu") == ""


def test_batch_invariant_must_be_a_bool():
    with pytest.raises(ValueError, match="batch_invariant: must be True or False"):
        EngineConfig(batch_invariant="yes")


@pytest.mark.parametrize("share", [-0.1, 1.0, float("nan")])
def test_draft_sm_share_must_be_a_share(share):
    with pytest.raises(ValueError, match=r"draft_sm_share: must be"):
        EngineConfig(mode="ssd", draft_sm_share=share)


@pytest.mark.parametrize("placement", [dict(mode="ar"), dict(mode="ssd"), dict(mode="sd", draft_device="cpu")])
def test_draft_sm_share_needs_the_draft_on_the_targets_gpu(placement):
    with pytest.raises(ValueError, match="draft_sm_share: confines a draft on the target's GPU"):
        EngineConfig(draft_sm_share=0.25, **placement)


def test_cuda_graphs_must_be_a_bool():
    with pytest.raises(ValueError, match="cuda_graphs: must be True or False"):
        EngineConfig(cuda_graphs=1)


# ---- the KV budget: "auto" and explicit, against each device's memory

def test_auto_on_one_gpu_is_its_free_memory_less_the_margin_shared_by_both_caches():
    # 20 GiB free of 40: margin max(1 GiB, 4 GiB) = 4 GiB; 16 GiB / (4096 + 2048) bytes.
    got = resolve("ssd", machine((20, 40)), kv_cache_gib="auto", target_device="cuda:0", draft_device="cuda:0")
    assert got["kv_capacity_tokens"] == 2796202
    # "cuda" is cuda:0: the same device, so the same split.
    got = resolve("sd", machine((20, 40)), kv_cache_gib="auto", target_device="cuda", draft_device="cuda:0")
    assert got["kv_capacity_tokens"] == 2796202


def test_bf16_caches_hold_twice_the_tokens():
    # "auto": bf16 on a GPU, 2 bytes a value: 16 GiB / (2048 + 1024) bytes.
    got = resolve("ssd", machine((20, 40)), kv_cache_gib="auto", target_device="cuda:0", draft_device="cuda:0",
                  kv_cache_dtype="auto")
    assert got["kv_capacity_tokens"] == 5592405
    # The target's bf16 cache on cuda:0 holds 16 GiB / 2048 = 8388608 tokens, the
    # draft's fp32 one on the CPU 4 GiB / 2048 = 2097152: the CPU stays fp32 under "auto".
    got = resolve("ssd", machine((20, 40)), kv_cache_gib="auto", target_device="cuda:0", draft_device="cpu",
                  kv_cache_dtype="auto")
    assert got["kv_capacity_tokens"] == 2097152
    # bfloat16 asked for on the CPU: 4 GiB / (2048 + 1024).
    assert resolve("ssd", machine(), kv_cache_dtype="bfloat16")["kv_capacity_tokens"] == 1398101
    with pytest.raises(ValueError, match="kv_cache_dtype: must be 'auto', 'float32' or 'bfloat16', got 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8")


def test_auto_margin_is_at_least_one_gib():
    # 5 GiB free of 8: 10 % is 0.8 GiB, so the margin is 1 GiB; 4 GiB / 4096 bytes.
    got = resolve("ar", machine((5, 8)), kv_cache_gib="auto", target_device="cuda:0")
    assert got["kv_capacity_tokens"] == 1048576


def test_auto_on_two_gpus_is_what_the_tightest_device_holds():
    # cuda:0: 16 GiB / 4096 = 4194304 tokens; cuda:1: (3 - 1.6) GiB / 2048 = 734003.2.
    got = resolve("ssd", machine((20, 40), (3, 16)), kv_cache_gib="auto", target_device="cuda:0",
                  draft_device="cuda:1")
    assert got["kv_capacity_tokens"] == 734003


def test_auto_with_the_draft_on_the_cpu():
    # cuda:0: 16 GiB / 4096 = 4194304 tokens; the CPU's 4 GiB / 2048 = 2097152.
    got = resolve("ssd", machine((20, 40)), kv_cache_gib="auto", target_device="cuda:0", draft_device="cpu")
    assert got["kv_capacity_tokens"] == 2097152


def test_auto_on_the_cpu_is_four_gib():
    # 4 GiB / (4096 + 2048) bytes, as the default kv_cache_gib=4.0.
    assert resolve("ssd", machine(), kv_cache_gib="auto")["kv_capacity_tokens"] == 699050
    assert resolve("ssd", machine())["kv_capacity_tokens"] == 699050
    with pytest.raises(ValueError, match=r"kv_cache_gib: 'auto' \(4 GiB for the target and draft on cpu\) exceeds "
                                         r"this machine's memory \(2 GiB\)"):
        resolve("ssd", machine(host_bytes=2 * GIB), kv_cache_gib="auto")


def test_auto_without_room_beyond_the_margin_names_the_numbers():
    with pytest.raises(ValueError, match=r"kv_cache_gib: 'auto' leaves nothing for the target and draft KV cache on "
                                         r"cuda:0: 2 GiB free of 40 GiB, within the margin of 4 GiB"):
        resolve("ssd", machine((2, 40)), kv_cache_gib="auto", target_device="cuda:0", draft_device="cuda:0")


def test_explicit_budget_over_a_gpus_free_memory_names_the_numbers():
    with pytest.raises(ValueError, match=r"kv_cache_gib: 30 GiB exceeds the free memory of cuda:0 "
                                         r"\(20 GiB free of 40 GiB\)"):
        resolve("ssd", machine((20, 40)), kv_cache_gib=30, target_device="cuda:0", draft_device="cuda:0")
    got = resolve("ssd", machine((20, 40)), kv_cache_gib=12, target_device="cuda:0", draft_device="cuda:0")
    assert got["kv_capacity_tokens"] == 12 * GIB // 6144


def test_explicit_budget_is_checked_on_each_device_for_its_own_cache():
    # 6 GiB in all: the target's 4 GiB on cuda:0, the draft's 2 GiB on cuda:1.
    with pytest.raises(ValueError, match=r"kv_cache_gib: 6 GiB \(2 GiB of it for the draft on cuda:1\) exceeds the "
                                         r"free memory of cuda:1 \(1 GiB free of 16 GiB\)"):
        resolve("ssd", machine((20, 40), (1, 16)), kv_cache_gib=6, target_device="cuda:0", draft_device="cuda:1")
    # 5 GiB free on each: neither cache alone exceeds it, though the 6 GiB do.
    got = resolve("ssd", machine((5, 40), (5, 16)), kv_cache_gib=6, target_device="cuda:0", draft_device="cuda:1")
    assert got["kv_capacity_tokens"] == 1048576
    with pytest.raises(ValueError, match=r"kv_cache_gib: 6 GiB exceeds the free memory of cuda:0"):
        resolve("ssd", machine((5, 40), (5, 16)), kv_cache_gib=6, target_device="cuda:0", draft_device="cuda:0")


def test_explicit_capacity_over_a_gpus_free_memory_names_the_numbers():
    # 10**6 tokens: 4096 * 10**6 bytes (3.81 GiB) of target cache, 2048 * 10**6 (1.91 GiB) of draft cache.
    with pytest.raises(ValueError, match=r"kv_capacity_tokens: 1000000 tokens need 5.72 GiB of KV cache \(1.91 GiB "
                                         r"of it for the draft on cuda:1\), more than the free memory of cuda:1 "
                                         r"\(1 GiB free of 16 GiB\)"):
        resolve("ssd", machine((20, 40), (1, 16)), kv_capacity_tokens=10**6, target_device="cuda:0",
                draft_device="cuda:1")
    got = resolve("ssd", machine((20, 40), (2, 16)), kv_capacity_tokens=10**6, target_device="cuda:0",
                  draft_device="cuda:1")
    assert got["kv_capacity_tokens"] == 10**6


def test_explicit_budget_over_the_cpus_memory():
    with pytest.raises(ValueError, match=r"kv_cache_gib: 4 GiB exceeds this machine's memory \(2 GiB\)"):
        resolve("ar", machine(host_bytes=2 * GIB), kv_cache_gib=4)


def test_kv_cache_gib_auto_from_python_and_the_command_line():
    assert EngineConfig(kv_cache_gib="auto").to_dict()["kv_cache_gib"] == 0.0
    for bad in [0, -1, "big", True, float("nan")]:
        with pytest.raises(ValueError, match="kv_cache_gib: must be a number of GiB > 0 or 'auto'"):
            EngineConfig(kv_cache_gib=bad)
    assert serve_parser().parse_args(["--kv-cache-gib", "auto"]).kv_cache_gib == "auto"
    assert serve_parser().parse_args(["--kv-cache-gib", "2.5"]).kv_cache_gib == 2.5


# ---- runs

def test_ssd_on_the_cpu_runs_greedy_as_ar(pair):
    target, draft = pair
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 20))] for _ in range(4)]
    with LLM(target, max_model_len=128) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(16))]
    # 4 GiB / (1536 + 512) bytes: the pair's target has 3 layers, the draft 1, each 4 KV heads of 16.
    with LLM(target, draft=draft, mode="ssd", adaptive=False, max_model_len=128, kv_cache_gib="auto") as llm:
        assert llm.config.kv_capacity_tokens == 2097152
        assert [o.token_ids for o in llm.generate(prompts, greedy(16))] == want


def _greedy_ssd_equals_ar(pair, target_device, draft_device, **options):
    target, draft = pair
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 30))] for _ in range(8)]
    with LLM(target, max_model_len=256, target_device=target_device, kv_cache_gib=1) as ar:
        want = [o.token_ids for o in ar.generate(prompts, greedy(48))]
    with LLM(target, draft=draft, mode="ssd", adaptive=False, k=3, max_model_len=256, kv_cache_gib=1,
             target_device=target_device, draft_device=draft_device, **options) as ssd:
        got = [o.token_ids for o in ssd.generate(prompts, greedy(48))]
        assert ssd.stats()["rounds"] > 0
    assert got == want


@pytest.mark.cuda
def test_ssd_draft_on_the_targets_gpu(pair):
    _greedy_ssd_equals_ar(pair, "cuda:0", "cuda:0")


@pytest.mark.cuda
def test_ssd_draft_on_a_share_of_the_targets_gpu(pair):
    """The draft's kernels on a green context of a quarter of the SMs."""
    _greedy_ssd_equals_ar(pair, "cuda:0", "cuda:0", draft_sm_share=0.25)


@pytest.mark.cuda
def test_ssd_draft_on_the_cpu_beside_a_gpu_target(pair):
    _greedy_ssd_equals_ar(pair, "cuda:0", "cpu")


@pytest.mark.cuda
@pytest.mark.multi_gpu
def test_ssd_draft_on_its_own_gpu(pair):
    _greedy_ssd_equals_ar(pair, "cuda:0", "cuda:1")


@pytest.mark.cuda
def test_auto_budget_on_a_real_gpu_fits_its_free_memory(pair):
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(0)
    with LLM(pair[0], target_device="cuda:0", kv_cache_gib="auto", max_model_len=64) as llm:
        tokens = llm.config.kv_capacity_tokens
        assert llm.generate([[1, 2, 3]], greedy(4))[0].token_ids
    # 1536 bytes a token (3 layers, 4 KV heads of 16, fp32 K and V); the margin is 10 % of an H100's or
    # H200's memory; the tiny model's weights take well under 0.5 GiB.
    assert free - 0.1 * total - 0.5 * GIB <= tokens * 1536 <= free - 0.1 * total
    gc.collect()
    torch.cuda.empty_cache()
