"""python -m ssd.bench gpu's constructed pair (ssd.bench.gpu_pair) and its runs,
on tiny shapes on the CPU: the target's layer count gives it an 8B model's
weight bytes, the calibrated perturbation gives the requested agreement as
the engine measures it, and the bench reports ar, sd and ssd at batches 1
and 4 with greedy sd and ssd equal to ar."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssd
from ssd.bench import gpu_pair
from ssd.bench.gpu import CALIBRATION_PROMPTS, SHAPES, generated_model
from ssd.models import ModelConfig
from ssd.testing import _construct as construct

REPO = Path(__file__).resolve().parents[2]
# Held-out agreement is a proportion over 256 positions (2 prompts x 128): its
# sampling error alone is about 0.03, so 0.08 is about three of those.
HELD_OUT_TOLERANCE = 0.08


def config(shape: dict) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", **shape)


def test_llama_target_has_an_8b_models_weight_bytes():
    draft, reference = config(SHAPES["llama"]["draft"]), config(SHAPES["llama"]["target"])
    # The published parameter counts of Llama-3.2-1B and Llama-3.1-8B.
    assert construct.model_cost(draft, draft.num_layers) == 1_235_814_400
    assert gpu_pair.weight_params(reference) == 8_030_261_248
    plan = gpu_pair.layer_plan(draft, reference)
    assert (plan.n_base, plan.n_perturb) == (16, gpu_pair.PERTURBING_LAYERS)
    # The target ties its head as the draft does: its weights are model_cost at its layer count,
    # within half a layer of the 8B's.
    target_params = construct.model_cost(draft, plan.n_total)
    assert abs(target_params - 8_030_261_248) <= construct.layer_params(draft) / 2
    assert plan.n_total == 128


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: more threads only wait on each other
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("agreement", [0.5, 0.9])
def test_calibrated_agreement_is_what_the_engine_measures(one_thread, agreement):
    draft = generated_model(SHAPES["tiny"]["draft"], "cpu", torch.bfloat16, seed=2, name="tiny-draft")
    plan = gpu_pair.layer_plan(draft.config, config(SHAPES["tiny"]["target"]))
    vocab = draft.config.vocab_size
    prompts = gpu_pair.random_prompts(vocab, *CALIBRATION_PROMPTS, seed=gpu_pair.CALIBRATION_SEED)
    target, calib = gpu_pair.build_target(draft, plan, 0, agreement, prompts)
    assert abs(calib["agreement"] - agreement) <= 2 * gpu_pair.TOLERANCE, calib["steps"]
    assert target.config.num_layers == plan.n_total
    draft_core, target_core = draft.core_model("cpu"), target.core_model("cpu")
    # The engine's forward of the built target agrees with the torch forward that calibrated it
    # (same prompts; a near-tie may round the other way) and holds on other prompts.
    assert abs(gpu_pair.engine_agreement(draft_core, target_core, prompts) - calib["agreement"]) <= 0.01
    held_out = gpu_pair.random_prompts(vocab, *CALIBRATION_PROMPTS, seed=gpu_pair.MEASURE_SEED)
    assert abs(gpu_pair.engine_agreement(draft_core, target_core, held_out) - agreement) <= HELD_OUT_TOLERANCE


def test_bench_gpu_tiny_reports_every_mode_at_both_batches(tmp_path):
    out = tmp_path / "bench_gpu.json"
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).resolve().parents[1])}
    # What scripts/gpu_check.sh --cpu runs.
    proc = subprocess.run([sys.executable, "-m", "ssd.bench", "gpu", "--device", "cpu", "--shapes", "tiny",
                           "--max-tokens", "24", "--repeats", "2", "--contexts", "64", "256", "--prefill-tokens",
                           "256", "--draft-sm-shares", "0.25", "--time-budget-s", "55", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    runs = {(r["mode"], r["batch"]): r for r in result["runs"]}
    assert sorted(runs) == sorted((m, b) for m in ("ar", "sd", "ssd") for b in (1, 4))
    for (mode, batch), r in runs.items():
        assert "error" not in r, r
        assert len(r["token_ids"]) == batch and all(len(t) == 24 for t in r["token_ids"])
        assert r["tok_s"] > 0 and 0 < r["target_busy_fraction"] <= 1
        if mode == "ar":
            continue
        assert r["matches_ar"] is True and r["token_ids"] == runs[("ar", batch)]["token_ids"]
        assert 0 <= r["acceptance_rate"] <= 1
        assert r["speedup_vs_ar"] == pytest.approx(r["tok_s"] / runs[("ar", batch)]["tok_s"])
        if mode == "sd":
            assert r["cache_hit_rate"] is None and r["predicted_speedup"] > 0
        elif r["counters"]["cache_lookups"] > 0:
            assert 0 <= r["cache_hit_rate"] <= 1 and r["predicted_speedup"] > 0
        else:  # the adaptive policy ran ssd without trees: no hit rate, no overlapped-round prediction
            assert r["cache_hit_rate"] is None and r["predicted_speedup"] is None
    for batch in (1, 4):
        s = result["speedup"][str(batch)]
        assert s["ssd_over_sd"] == pytest.approx(runs[("ssd", batch)]["tok_s"] / runs[("sd", batch)]["tok_s"])
        assert s["sd_over_ar"] == pytest.approx(runs[("sd", batch)]["tok_s"] / runs[("ar", batch)]["tok_s"])
    pair = result["pair"]
    assert pair["agreement_requested"] == 0.75
    assert abs(pair["agreement_calibration"] - 0.75) <= 2 * gpu_pair.TOLERANCE
    assert abs(pair["agreement_measured"] - 0.75) <= HELD_OUT_TOLERANCE
    assert 0 <= pair["agreement_on_ar_output"] <= 1
    # The long-context measurements (tests/bench/test_bench_gpu_context.py checks their fields).
    assert [(r["context"], r["tok_s"] > 0) for r in result["contexts"]["runs"]] == [(64, True), (256, True)]
    assert result["prefill"]["batch_invariant"]["from"] == "the 256-token context run"
    assert result["outside_kernels"]["fraction"] is None
    assert result["draft_sm_share"] == {"runs": [], "why": "not measured on cpu: green contexts are a CUDA GPU's"}
    assert result["all_match_ar"] is True and result["errors"] == []
    assert "ssd       4" in proc.stdout and "greedy sd and ssd equal ar: True" in proc.stdout


def test_draft_share_runs_against_stream_priority():
    """gpu_share.compare's rows, with the engine runs stubbed: one ssd batch-1 run per share, its
    tok/s over the stream-priority ssd run's, and whether its tokens are ar's."""
    from types import SimpleNamespace

    from ssd.bench import gpu_share

    calls = []

    def run_mode(target, draft, mode, prompts, args, common, **options):
        calls.append((mode, len(prompts), options))
        share = options["draft_sm_share"]
        if share == 0.5:
            return {"mode": mode, "batch": 1, "error": "ValueError: draft_sm_share: no driver"}
        return {"mode": mode, "batch": 1, "tok_s": 30.0, "token_ids": [[1, 2] if share == 0.25 else [1, 3]]}

    runs = [{"mode": "ar", "batch": 1, "tok_s": 10.0, "token_ids": [[1, 2]]},
            {"mode": "ssd", "batch": 1, "tok_s": 20.0, "token_ids": [[1, 2]]},
            {"mode": "ssd", "batch": 4, "tok_s": 50.0, "token_ids": [[1, 2]] * 4}]
    args = SimpleNamespace(device="cuda:0", draft_sm_shares=[0.25, 0.5, 0.75])
    got = gpu_share.compare(run_mode, "t", "d", [7], args, {}, runs)
    assert calls == [("ssd", 1, {"draft_device": "cuda:0", "draft_sm_share": s}) for s in (0.25, 0.5, 0.75)]
    assert got["priority_tok_s"] == 20.0
    rows = {r["draft_sm_share"]: r for r in got["runs"]}
    assert rows[0.25]["over_priority"] == 1.5 and rows[0.25]["matches_ar"] is True
    assert rows[0.75]["matches_ar"] is False
    assert "error" in rows[0.5] and "over_priority" not in rows[0.5]
    text = gpu_share.format_compare(got)
    assert "share 0.25: 30.0 tok/s, 1.50x priority's, = ar: True" in text and "share 0.50: error" in text


def test_a_refused_mode_is_recorded_and_the_others_run(one_thread, monkeypatch, tmp_path):
    # As on CUDA where the engine refuses ssd: the run records the error, the bench goes on and exits 1.
    from ssd.bench import gpu

    llm = ssd.LLM

    def refusing(target, *, mode="ar", **kwargs):
        if mode == "ssd":
            raise ValueError("mode 'ssd' refused here")
        return llm(target, mode=mode, **kwargs)

    monkeypatch.setattr(ssd, "LLM", refusing)
    out = tmp_path / "bench_gpu.json"
    assert gpu.main(["--device", "cpu", "--shapes", "tiny", "--max-tokens", "12", "--repeats", "1",
                     "--batches", "1", "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    runs = {r["mode"]: r for r in result["runs"]}
    assert runs["ssd"]["error"] == "ValueError: mode 'ssd' refused here"
    assert runs["sd"]["matches_ar"] is True and runs["ar"]["tok_s"] > 0
    assert result["errors"] == ["ssd batch 1: ValueError: mode 'ssd' refused here"]
    assert result["speedup"]["1"]["ssd_over_sd"] is None and result["speedup"]["1"]["sd_over_ar"] > 0
