"""python -m ssd.bench on a tiny random pair: the table, the JSON document and the plots."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ssd


REPO = Path(__file__).resolve().parents[2]


def bench(*args):
    # The subprocess imports the same ssd package as this test (installed or from the source tree).
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "ssd.bench", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO)


def test_bench_writes_table_json_and_plots(pair, tmp_path):
    target, draft = pair
    out, plots = tmp_path / "r.json", tmp_path / "plots"
    proc = bench("--target", str(target), "--draft", str(draft), "--datasets", "random", "--num-prompts", "2",
                 "--max-tokens", "12", "--batch", "1,2", "--temperature", "0,1.0", "--k", "3",
                 "--json", str(out), "--plots", str(plots))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SSD/SD" in proc.stdout and "dec tok/s" in proc.stdout
    assert "every mode produced ar's tokens" in proc.stdout
    doc = json.loads(out.read_text())
    assert set(doc) >= {"pair", "runs", "machine", "config", "components_s"}
    assert doc["command"].startswith("python -m ssd.bench --target ") and "--batch 1,2" in doc["command"]
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["torch"]
    runs = doc["runs"]
    # 2 batch sizes x 2 temperatures x (ar, sd, ssd + ar, sd on the total hardware)
    assert len(runs) == 2 * 2 * 5
    for r in runs:
        for key in ("mode", "dataset", "batch_size", "temperature", "k", "decode_tok_per_s", "e2e_tok_per_s",
                    "acceptance_rate", "mean_accepted_len", "cache_hit_rate", "target_busy_fraction",
                    "predicted_speedup", "target_threads", "draft_threads"):
            assert key in r, key
        assert r["decode_tok_per_s"] > 0
        assert r["counters"]["generated_tokens"] == 2 * 12
    assert all(r["same_tokens_as_ar"] is True for r in runs if r["temperature"] == 0)
    ssd = [r for r in runs if r["mode"] == "ssd"]
    assert all(r["cache_hit_rate"] >= 0 and r["counters"]["cache_lookups"] > 0 for r in ssd)
    # Adaptive by default: each speculative run records the policy's gauges as it ended.
    assert all(r["policy"]["policy_drafting"] in ("none", "sequential", "trees", "misses") and
               r["policy"]["policy_batch"] >= 1 for r in runs if r["mode"] != "ar")
    assert all(r["predicted_tok_per_s"] > 0 for r in runs if not r["same_total_hardware"])
    assert {r["target_threads"] for r in runs if r["same_total_hardware"]} == {2}
    for name in ("tokens_per_mode.png", "tokens_vs_batch.png", "hit_rate_vs_temperature.png",
                 "predicted_vs_measured.png"):
        data = (plots / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_bench_rejects_bad_options(pair):
    target, draft = pair
    proc = bench("--target", str(target), "--draft", str(draft), "--datasets", "wiki")
    assert proc.returncode == 2 and "datasets: unknown dataset 'wiki'" in proc.stderr
    proc = bench("--target", str(target))
    assert proc.returncode == 2 and "give both" in proc.stderr
    proc = bench("--batch", "1,x")
    assert proc.returncode == 2 and "comma-separated list" in proc.stderr


# ---------------------------------------------------------------- regime sweeps (no pair is built)


def test_regime_options_take_one_value_or_a_list():
    from ssd.bench.__main__ import parse_args

    cfg, _ = parse_args([])
    assert (cfg.regime_acceptance, cfg.regime_cost_ratio) == (0.75, 0.25) and cfg.sweep() is None
    cfg, _ = parse_args(["--regime-acceptance", "0.6"])  # one value: a plain number, as before
    assert cfg.regime_acceptance == 0.6 and isinstance(cfg.regime_acceptance, float) and cfg.sweep() is None
    cfg, _ = parse_args(["--regime-acceptance", "0.5,0.6,0.7,0.8,0.9"])
    assert cfg.regime_acceptance == [0.5, 0.6, 0.7, 0.8, 0.9] and cfg.regime_cost_ratio == 0.25
    assert cfg.sweep() == ("acceptance", [0.5, 0.6, 0.7, 0.8, 0.9])
    cfg.validate()
    cfg, _ = parse_args(["--regime-cost-ratio", "0.1,0.2,0.3,0.4,0.5", "--quick"])
    assert cfg.sweep() == ("cost_ratio", [0.1, 0.2, 0.3, 0.4, 0.5]) and cfg.regime_acceptance == 0.75


@pytest.mark.parametrize("argv, message", [
    (["--regime-acceptance", "0.5,0.6", "--regime-cost-ratio", "0.1,0.2"], "1-D sweeps only"),
    (["--regime-acceptance", "0.5,0.6", "--target", "t", "--draft", "d"], "cannot be combined with --target"),
    (["--regime-cost-ratio", "0.1,0.2", "--draft", "d"], "cannot be combined with --target"),
    (["--regime-acceptance", "0.5,1.2"], "argument --regime-acceptance: every value must be in (0.3, 0.99)"),
    (["--regime-acceptance", "0.2"], "argument --regime-acceptance: every value must be in (0.3, 0.99)"),
    (["--regime-cost-ratio", "0.02,0.2"], "argument --regime-cost-ratio: every value must be in (0.05, 0.9)"),
    (["--regime-cost-ratio", "0.2,0.2"], "argument --regime-cost-ratio: a value repeats"),
    (["--regime-cost-ratio", "0.2,x"], "argument --regime-cost-ratio: expected a comma-separated list"),
])
def test_regime_options_reject(argv, message, capsys):
    from ssd.bench.__main__ import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_config_rejects_bad_sweeps():
    from ssd.bench import BenchConfig

    with pytest.raises(ValueError, match="1-D sweeps"):
        BenchConfig(regime_acceptance=[0.5, 0.6], regime_cost_ratio=[0.1, 0.2]).validate()
    with pytest.raises(ValueError, match="regime_acceptance: a list sweeps constructed pairs"):
        BenchConfig(target="t", draft="d", regime_acceptance=[0.5, 0.6]).validate()
    with pytest.raises(ValueError, match=r"regime_cost_ratio: every value must be in \(0.05, 0.9\)"):
        BenchConfig(regime_cost_ratio=[0.1, 0.95]).validate()
    assert BenchConfig(regime_cost_ratio=[0.3]).sweep() is None


def _run(value, dataset, mode, tok_s, pred, total=False):
    """A run record as run_pair makes it (only what the summary, the table and the plots read)."""
    return {"mode": mode, "dataset": dataset, "batch_size": 1, "temperature": 0.0, "same_total_hardware": total,
            "regime_acceptance": value, "regime_cost_ratio": 0.25, "regime_agreement": value - 0.01,
            "decode_tok_per_s": tok_s, "predicted_tok_per_s": None if total else pred,
            "placement": "p", "target_threads": 2 if total else 1, "measured_speedup": None,
            "predicted_speedup_isolated": None, "e2e_tok_per_s": tok_s, "ttft_s": 0.1,
            "acceptance_rate": 0.6, "mean_accepted_len": 2.0, "cache_hit_rate": 0.5, "target_busy_fraction": 0.9,
            "t_p": 0.8, "t_b": 0.2, "counters": {"fallback_neural": 1, "fallback_fast": 2},
            "same_tokens_as_ar": True}


def _synthetic_runs():
    return [
        # acceptance 0.5, mtbench: ar is faster than sd when measured, sd when predicted
        _run(0.5, "mtbench", "ar", 8.0, 6.4), _run(0.5, "mtbench", "sd", 7.0, 8.0),
        _run(0.5, "mtbench", "ssd", 10.0, 12.0),
        _run(0.5, "mtbench", "ar", 20.0, None, total=True),  # other hardware: not a reference
        # acceptance 0.5, humaneval without ar: no best-of-ar-and-sd ratio
        _run(0.5, "humaneval", "sd", 5.0, 5.0), _run(0.5, "humaneval", "ssd", 6.0, 7.5),
        # acceptance 0.9, mtbench
        _run(0.9, "mtbench", "ar", 6.0, 6.4), _run(0.9, "mtbench", "sd", 12.0, 10.0),
        _run(0.9, "mtbench", "ssd", 15.0, 16.0),
    ]


def test_sweep_summary_ratios():
    from ssd.bench.core import sweep_summary

    points = sweep_summary(_synthetic_runs(), "acceptance")
    assert [(p["value"], p["dataset"]) for p in points] == [(0.5, "humaneval"), (0.5, "mtbench"), (0.9, "mtbench")]
    he, mt5, mt9 = points
    assert he["ssd_over_sd"] == pytest.approx(6.0 / 5.0) and he["predicted_ssd_over_sd"] == pytest.approx(1.5)
    assert he["ssd_over_best"] is None and he["predicted_ssd_over_best"] is None and he["best_mode"] is None
    assert mt5["ssd_over_sd"] == pytest.approx(10.0 / 7.0)
    assert mt5["ssd_over_best"] == pytest.approx(10.0 / 8.0) and mt5["best_mode"] == "ar"
    assert mt5["predicted_ssd_over_sd"] == pytest.approx(12.0 / 8.0)
    assert mt5["predicted_ssd_over_best"] == pytest.approx(12.0 / 8.0) and mt5["predicted_best_mode"] == "sd"
    assert mt9["ssd_over_sd"] == pytest.approx(1.25) and mt9["ssd_over_best"] == pytest.approx(1.25)
    assert mt9["predicted_ssd_over_sd"] == pytest.approx(1.6) and mt9["predicted_ssd_over_best"] == pytest.approx(1.6)
    assert (mt9["regime_acceptance"], mt9["regime_cost_ratio"], mt9["regime_agreement"]) == (0.9, 0.25, 0.89)
    assert mt5["decode_tok_per_s"] == {"ar": 8.0, "sd": 7.0, "ssd": 10.0}


def _synthetic_sweep_result():
    from ssd.bench.core import sweep_summary

    runs = _synthetic_runs()
    pairs = [{"constructed": True, "requested": {"acceptance": a, "cost_ratio": 0.25},
              "measured": {"agreement": a - 0.01}} for a in (0.5, 0.9)]
    return {"pairs": pairs, "runs": runs, "peers": [],
            "config": {"k": 4, "fanout": "geometric", "fanout_budget": "auto", "saguaro_c": 1.0,
                       "fallback": "auto", "dtype": "float32", "max_tokens": 8, "num_prompts": 1},
            "sweep": {"parameter": "acceptance", "values": [0.5, 0.9], "fixed": {"cost_ratio": 0.25},
                      "points": sweep_summary(runs, "acceptance")}}


def test_sweep_table_names_each_rows_pair():
    import io

    from ssd.bench.__main__ import print_table

    out = io.StringIO()
    print_table(_synthetic_sweep_result(), out)
    text = out.getvalue()
    assert "CONSTRUCTED regime pairs" in text and "at cost_ratio 0.25" in text
    rows = [line for line in text.splitlines() if line.startswith("acc=") and "SSD/SD" not in line]
    assert len(rows) == len(_synthetic_runs()) + 3  # every run, then the sweep's 3 points
    assert sum(line.startswith("acc=0.9 ") for line in rows) == 3 + 1
    assert "acc=0.5 mtbench B=1 T=0.0: SSD/SD 1.43x, SSD/max(AR,SD) 1.25x" in text


def test_sweep_plot_is_a_png(tmp_path):
    from ssd.bench.plots import write_plots, write_sweep_plot

    result = _synthetic_sweep_result()
    path = write_sweep_plot(result["sweep"], tmp_path / "one")
    assert path.name == "sweep_acceptance.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # write_plots on a sweep writes the sweep plot (the per-mode plots would mix the pairs)
    assert [p.name for p in write_plots(result, tmp_path / "all")] == ["sweep_acceptance.png"]


def test_speed_model_charges_the_fork_forward_when_it_runs():
    from ssd.bench.core import predict

    c = {"t_ar": 0.1, "t_verify": 0.12, "t_draft": 0.025, "t_fork": 0.015, "t_tree": 0.03}
    run = {"mode": "ssd", "batch_size": 1, "cache_hit_rate": 0.5, "e_hit": 3.0, "e_miss": 2.0,
           "counters": {"fallback_neural": 3, "fallback_fast": 1}, "fanout": [2, 1, 1, 1, 0]}
    k = 4
    t_b = 0.75 * k * 0.025 / 0.12
    tokens = 0.5 * 3.0 + 0.5 * 2.0

    def expected(fork):
        t_p = (fork + k * 0.03) / 0.12
        # A miss waits for the tree under way, then for the fallback: max(1, T_p) + T_b.
        return tokens / (0.12 * (0.5 * max(1.0, t_p) + 0.5 * (max(1.0, t_p) + t_b)))

    # A plan with F_K = 0 skips the fork forward over the last proposal ...
    assert predict({**run, "fanout_policy": "geometric"}, c, k) == pytest.approx(expected(0.0))
    # ... the confidence policy always runs it ("fanout" there counts the last tree's branches).
    assert predict({**run, "fanout_policy": "confidence"}, c, k) == pytest.approx(expected(0.015))
    assert expected(0.015) < expected(0.0)
