"""python -m ssd.bench on a tiny random pair: the table, the JSON document and the plots."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ssd

from tests.reference.tiny_models import TinySpec, build_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target, _ = build_tiny_model(TinySpec(vocab_size=256, num_layers=3, seed=1, init_std=0.1), root / "t")
    draft, _ = build_tiny_model(TinySpec(vocab_size=256, num_layers=1, seed=2, init_std=0.1), root / "d")
    return target, draft


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
