"""Model pairs of the speculative-mode tests (sd and ssd); `pair` is in tests/conftest.py."""
import pytest

from tests.reference.tiny_models import TinySpec, build_tiny_model


@pytest.fixture(scope="session")
def small_pair(tmp_path_factory):
    """A vocabulary-4 pair whose output laws can be enumerated."""
    root = tmp_path_factory.mktemp("spec_law")
    target, _ = build_tiny_model(TinySpec(vocab_size=4, hidden_size=32, intermediate_size=48,
                                          seed=11, init_std=0.1), root / "t")
    draft, _ = build_tiny_model(TinySpec(vocab_size=4, hidden_size=32, intermediate_size=48,
                                         num_layers=1, seed=12, init_std=0.1), root / "d")
    return target, draft
