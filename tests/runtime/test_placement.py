"""Device placement: CUDA devices are named in the config, and a device this
build or machine cannot use is a ValueError that names it, raised before any
weight is loaded (never a crash)."""
from __future__ import annotations

import pytest
import torch

from ssd import LLM, EngineConfig, _C

HAS_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0


def test_bad_device_strings_are_refused():
    for device in ["tpu", "cuda:", "cuda:x", "CUDA", "cuda:0:1", ""]:
        with pytest.raises(ValueError, match=f"target_device: device '{device}': expected 'cpu', 'cuda' or 'cuda:N'"):
            EngineConfig(target_device=device)


@pytest.mark.skipif(HAS_GPU, reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_a_value_error(pair, device):
    target, draft = pair
    with pytest.raises(ValueError, match=f"target_device: device '{device}': no CUDA device is available"):
        LLM(target, target_device=device, max_model_len=64)
    with pytest.raises(ValueError, match=f"draft_device: device '{device}': no CUDA device is available"):
        LLM(target, draft=draft, mode="sd", adaptive=False, draft_device=device, max_model_len=64)
    with pytest.raises(ValueError, match=f"device '{device}': no CUDA device is available"):
        _C.testing.BackendSteps(device)
    assert "cuda" in _C.device_problem(device)
    assert _C.device_problem("cpu") == ""


def test_device_past_the_last_gpu_is_named(pair):
    with pytest.raises(ValueError, match="target_device: device 'cuda:99': "):
        LLM(pair[0], target_device="cuda:99", max_model_len=64)


def test_ar_ignores_the_draft_device():
    # ar has no draft, so its (default or any) draft_device is not checked.
    assert EngineConfig(mode="ar", draft_device="cuda:7").draft_device == "cuda:7"


@pytest.mark.cuda
def test_ssd_mode_stays_on_the_cpu():
    with pytest.raises(ValueError, match="mode 'ssd' runs on the CPU only"):
        EngineConfig(mode="ssd", adaptive=False, target_device="cuda")


def test_batch_invariant_must_be_a_bool():
    with pytest.raises(ValueError, match="batch_invariant: must be True or False"):
        EngineConfig(batch_invariant="yes")
