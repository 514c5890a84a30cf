"""python -m ssd.bench serve: options, and a short sweep against a server it hosts."""
import json
import subprocess
import sys

from ssd.assets import smollm2_gguf_path
from ssd.bench import serve


def test_options_are_checked():
    for bad in (["--rates", "0"], ["--modes", "xx"], ["--draft", "d"], ["--requests", "0"]):
        r = subprocess.run([sys.executable, "-m", "ssd.bench", "serve", *bad], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (bad, r.stderr)


def test_percentiles_are_nearest_rank():
    xs = [float(i) for i in range(1, 11)]
    assert serve._pct(xs, 50) == 5 and serve._pct(xs, 99) == 10 and serve._pct(xs, 10) == 1
    assert serve._pct([], 50) is None


def test_a_short_sweep(tmp_path):
    gguf = str(smollm2_gguf_path())
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, "-m", "ssd.bench", "serve", "--target", gguf, "--draft", gguf, "--modes",
                        "ar,sd", "--rates", "4", "--requests", "3", "--max-tokens", "6", "--json", str(out),
                        "--plot", str(tmp_path / "serve.png")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m ssd.bench serve")
    for run in doc["runs"]:
        (point,) = run["points"]
        assert point["completed"] == 3 and 3 <= point["tokens"] <= 18 and point["ttft_p50"] > 0, run
    assert (tmp_path / "serve.png").stat().st_size > 1000
