"""Shared pytest setup: hardware markers skip themselves when the hardware is absent."""
import pytest


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    needs_gpu = [i for i in items if "cuda" in i.keywords or "multi_gpu" in i.keywords]
    if not needs_gpu:
        return
    devices = _cuda_devices()
    for item in needs_gpu:
        if "cuda" in item.keywords and devices < 1:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        elif "multi_gpu" in item.keywords and devices < 2:
            item.add_marker(pytest.mark.skip(reason="needs two or more GPUs"))
