"""Shared pytest setup: hardware markers skip themselves when the hardware is absent; the tiny
speculative pair used by the runtime and bench tests."""
import pytest

from tests.reference.tiny_models import TinySpec, build_tiny_model


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    # Markers, not keywords: a parameter id such as "cuda" is a keyword too.
    needs_gpu = [i for i in items if i.get_closest_marker("cuda") or i.get_closest_marker("multi_gpu")]
    if not needs_gpu:
        return
    devices = _cuda_devices()
    for item in needs_gpu:
        if item.get_closest_marker("cuda") and devices < 1:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        elif item.get_closest_marker("multi_gpu") and devices < 2:
            item.add_marker(pytest.mark.skip(reason="needs two or more GPUs"))


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """A random target (3 layers) and draft (1 layer), vocabulary 256."""
    root = tmp_path_factory.mktemp("spec_pair")
    target, _ = build_tiny_model(TinySpec(vocab_size=256, num_layers=3, seed=1, init_std=0.1), root / "t")
    draft, _ = build_tiny_model(TinySpec(vocab_size=256, num_layers=1, seed=2, init_std=0.1), root / "d")
    return target, draft
