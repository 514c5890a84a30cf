"""Test and benchmark helpers that need real models (nothing heavy at import).

``regime_pair(acceptance, cost_ratio)``: a constructed draft/target pair from
SmolLM2-135M-Instruct with the paper's acceptance and cost structure.
``TestingConfig``: the engine's test-only switches (``LLM(..., testing=...)``).
``FakeDevices``, ``resolve_engine_config``: placements and KV budgets checked without a GPU.
"""
from .regime import (RegimePair, agreement_text, calibration_prompts, chat_samples,
                     coherence_measure, regime_pair, top1_agreement)
from .devices import FakeDevices, resolve_engine_config
from .switches import TestingConfig

__all__ = ["FakeDevices", "RegimePair", "TestingConfig", "agreement_text", "calibration_prompts", "chat_samples",
           "coherence_measure", "regime_pair", "resolve_engine_config", "top1_agreement"]
