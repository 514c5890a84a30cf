"""python -m ssd.bench as the one benchmark entry point: subcommands, provenance of results, the
speed model's inputs, and the decode and fallback benchmarks' bookkeeping (no models built)."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ssd

REPO = Path(__file__).resolve().parents[2]


def bench(*args):
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "ssd.bench", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


# ---------------------------------------------------------------- one entry point


def test_help_lists_every_benchmark():
    from ssd.bench.__main__ import KERNEL_BENCHES, SUBCOMMANDS

    proc = bench("--help")
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert f"python -m ssd.bench {name} " in proc.stdout, name
    scripts = sorted(p.name for p in (REPO / "bench" / "kernels").glob("bench_*.py"))
    # A kernel benchmark added to bench/kernels/ without a line in the help fails here.
    assert sorted(KERNEL_BENCHES) == scripts
    for script in scripts:
        assert f"python bench/kernels/{script}" in proc.stdout, script
    assert "--regime-acceptance" in proc.stdout  # the default run's own options are still there


def test_bench_directory_holds_only_results_and_kernel_benchmarks():
    assert {p.name for p in (REPO / "bench").iterdir()} <= {"kernels", "results"}


SUBCOMMAND_OPTION = {"decode": "--bw-mb", "contention": "--busy-cpu", "serve": "--rates", "gpu": "--shapes",
                     "fallback": "--auto", "coupling": "--saguaro-c", "adaptive": "--warmup-prompt-len"}


def test_every_subcommand_has_its_help_checked():
    from ssd.bench.__main__ import SUBCOMMANDS

    assert set(SUBCOMMAND_OPTION) == set(SUBCOMMANDS)


# argparse formats each help string with %: a bare "%" in one crashes --help (it did in adaptive's).
@pytest.mark.parametrize("name, option", sorted(SUBCOMMAND_OPTION.items()))
def test_subcommand_help(name, option):
    proc = bench(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m ssd.bench {name}") and option in proc.stdout


def test_decode_rejects_bad_options():
    proc = bench("decode", "--max-tokens", "1")
    assert proc.returncode == 2 and "--max-tokens must be at least 2" in proc.stderr
    proc = bench("decode", "--threads", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr
    proc = bench("decode", "--cpu-isas", "sse4")
    assert proc.returncode == 2 and "invalid choice: 'sse4'" in proc.stderr
    proc = bench("decode", "--threads", "1", "2", "--tensor-parallel", "2")
    assert proc.returncode == 2 and "--tensor-parallel: 2 processes cannot share 1 threads evenly" in proc.stderr
    from ssd import _C

    if "avx512" not in _C.cpu_isas():
        proc = bench("decode", "--cpu-isas", "avx2", "avx512")
        assert proc.returncode == 2 and "--cpu-isas: this CPU cannot run" in proc.stderr and "avx512" in proc.stderr


# ---------------------------------------------------------------- provenance


def test_command_line_is_shell_quoted():
    from ssd.bench.record import BENCH_PROG, command_line

    assert command_line(["decode", "--quick"], BENCH_PROG) == "python -m ssd.bench decode --quick"
    assert command_line([], BENCH_PROG) == "python -m ssd.bench"
    assert command_line(["--json", "my results.json"], "python bench/kernels/bench_verify.py") == \
        "python bench/kernels/bench_verify.py --json 'my results.json'"


def test_write_result_records_command_and_machine(tmp_path, monkeypatch):
    from ssd.bench.record import write_result

    monkeypatch.setattr(sys, "argv", ["bench/kernels/bench_verify.py", "--json", "out dir/v.json"])
    path = write_result(tmp_path / "sub" / "v.json", {"results": [1, 2], "machine": "stale"})
    doc = json.loads(path.read_text())
    assert list(doc)[:2] == ["command", "machine"]
    assert doc["command"] == "python bench/kernels/bench_verify.py --json 'out dir/v.json'"
    machine = doc["machine"]
    assert {"platform", "processor", "cpu_model", "cpus", "python", "torch"} <= set(machine)
    assert machine["cpus"] == os.cpu_count() and machine["cpu_model"] and machine["torch"]
    assert doc["results"] == [1, 2]
    doc = json.loads(write_result(tmp_path / "w.json", {}, "python -m ssd.bench --quick").read_text())
    assert doc["command"] == "python -m ssd.bench --quick"


def test_git_commit_ignores_an_enclosing_repository(tmp_path):
    # An installed copy under some other git repository (site-packages in a
    # git-managed pyenv) must not record that repository's commit.
    import ssd.bench.record as record

    source = Path(record.__file__).read_text()

    def git_commit_as(path: Path):
        """record._git_commit() of a copy of record.py placed at `path`."""
        path.parent.mkdir(parents=True)
        path.write_text(source)
        namespace = {"__file__": str(path), "__name__": "record_copy"}
        exec(compile(source, str(path), "exec"), namespace)
        return namespace["_git_commit"]()

    other = tmp_path / "other"
    git = ["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t"]
    other.mkdir()
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    assert git_commit_as(other / "lib" / "site-packages" / "ssd" / "bench" / "record.py") is None
    # Laid out as ssd's own checkout (python/ssd/bench), the commit is read.
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    assert git_commit_as(other / "python" / "ssd" / "bench" / "record.py") == head.stdout.strip()


# ---------------------------------------------------------------- the speed model's inputs


COMPONENTS = {"t_ar": 0.1, "t_verify": 0.15, "t_draft": 0.025, "t_fork": 0.015, "t_tree": 0.03}


def test_predict_ar_and_sd():
    from ssd.bench.core import predict

    c, k = COMPONENTS, 4
    assert predict({"mode": "ar", "batch_size": 2}, c, k) == pytest.approx(2 / 0.1)
    # sd: one round is K draft steps, then the verify, for tokens_per_round tokens per sequence.
    run = {"mode": "sd", "batch_size": 2, "tokens_per_round": 2.5}
    assert predict(run, c, k) == pytest.approx(2 * 2.5 / (k * 0.025 + 0.15))


def test_predict_ssd_at_batch_two_waits_on_any_miss():
    from ssd.bench.core import predict

    c, k = COMPONENTS, 4
    run = {"mode": "ssd", "batch_size": 2, "cache_hit_rate": 0.8, "e_hit": 3.0, "e_miss": 2.0,
           "counters": {"fallback_neural": 1, "fallback_fast": 1}, "fanout": [1, 1, 1, 1, 1],
           "fanout_policy": "geometric"}
    t_p = (0.015 + k * 0.03) / 0.15
    t_b = 0.5 * k * 0.025 / 0.15
    all_hit = 0.8 ** 2  # both sequences must hit for the round to skip the fallback
    tokens = 0.8 * 3.0 + 0.2 * 2.0
    expected = 2 * tokens / (0.15 * (all_hit * max(1, t_p) + (1 - all_hit) * (max(1, t_p) + t_b)))
    assert predict(run, c, k) == pytest.approx(expected)


def test_counters_come_from_the_core():
    from ssd import _C

    names = _C.counter_names()
    assert {"rounds", "cache_hits", "fallback_neural", "draft_round_seconds", "generated_tokens"} <= set(names)
    source = (REPO / "python" / "ssd" / "bench" / "core.py").read_text()
    assert "counter_names()" in source and "COUNTERS = (" not in source


# ---------------------------------------------------------------- decode


def _decode_rows():
    def row(engine, dtype, threads, rates, tokens, other=0.0):
        return {"engine": engine, "dtype": dtype, "threads": threads, "rates": rates, "ttft_s": [0.3] * len(rates),
                "token_ids": tokens, "other_cpu_fraction": other}

    return [row("ssd", "float32", 1, [30.0, 36.0, 33.0], [1, 2, 3, 4]),
            row("transformers", "float32", 1, [15.0, 16.5, 16.0], [1, 2, 9, 4], other=0.2)]


def test_decode_summary_and_table():
    from ssd.bench.decode import summarise, table

    rows = _decode_rows()
    bw = {1: {"gbps": 20.0, "other_cpu_fraction": 0.01}}
    bytes_per_token = {"float32": 500_000_000}
    summarise(rows, bw, bytes_per_token)
    ssd_row, hf_row = rows
    assert ssd_row["tok_s"] == 33.0 and (ssd_row["tok_s_min"], ssd_row["tok_s_max"]) == (30.0, 36.0)
    assert ssd_row["bound_tok_s"] == pytest.approx(40.0) and ssd_row["fraction_of_bound"] == pytest.approx(33 / 40)
    assert ssd_row["speedup_vs_transformers"] == pytest.approx(33.0 / 16.0)
    assert hf_row["speedup_vs_transformers"] is None
    assert ssd_row["greedy_prefix_match"] == hf_row["greedy_prefix_match"] == 2
    text = table(rows, bw, bytes_per_token, max_tokens=4)
    assert "2.06x" in text and "2/4" in text and "copy bandwidth 1 thread(s): 20.00 GB/s" in text
    assert "WARNING: other processes used more than 10%" in text  # transformers ran beside 20% other load


def test_decode_table_has_a_row_per_instruction_set():
    from ssd.bench.decode import summarise, table

    ssd_row, hf_row = _decode_rows()
    rows = [{**ssd_row, "cpu_isa": "avx2"}, {**ssd_row, "cpu_isa": "portable", "rates": [3.0, 3.3, 3.6]}, hf_row]
    summarise(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000})
    assert [r["speedup_vs_transformers"] for r in rows] == [pytest.approx(33.0 / 16.0), pytest.approx(3.3 / 16.0),
                                                            None]
    lines = table(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000}, max_tokens=4).splitlines()
    assert any(line.split()[2:5] == ["ssd", "(avx2)", "33.00"] for line in lines)
    assert any(line.split()[2:5] == ["ssd", "(portable)", "3.30"] for line in lines)


def test_decode_tensor_parallel_rows_are_their_own_and_report_the_collectives():
    from ssd.bench.decode import summarise, table

    ssd_row, hf_row = _decode_rows()
    tp_row = {**ssd_row, "tensor_parallel": 2, "rates": [10.0, 11.0, 12.0], "collectives_per_forward": 60.0,
              "collective_ms_per_forward": 30.5}
    rows = [ssd_row, tp_row, hf_row]
    summarise(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000})
    assert hf_row["speedup_vs_transformers"] is None and ssd_row["speedup_vs_transformers"] == pytest.approx(33 / 16)
    assert hf_row["greedy_prefix_match"] == 2  # against the one-process row, not the split one
    lines = table(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000}, max_tokens=4).splitlines()
    assert any(line.split()[2:5] == ["ssd", "(tp2)", "11.00"] for line in lines)
    assert "ssd (tp2) float32 1 thr: 60 all-gathers per forward, 30.50 ms of it per forward" in lines


def test_decode_quantized_rows_compare_with_bf16_and_run_ssd_only():
    from pathlib import Path

    from ssd.bench.decode import make_jobs, parse_args, summarise, table

    ssd_row, hf_row = _decode_rows()
    rows = [{**ssd_row, "dtype": "bfloat16", "rates": [50.0]}, {**ssd_row, "dtype": "q4_0", "rates": [110.0]},
            {**hf_row, "dtype": "bfloat16"}]
    per_token = {"bfloat16": 250_000_000, "q4_0": 80_000_000}
    summarise(rows, {1: {"gbps": 20.0}}, per_token)
    assert [r["speedup_vs_bf16"] for r in rows] == [pytest.approx(1.0), pytest.approx(2.2), None]
    q4_line = next(line for line in table(rows, {1: {"gbps": 20.0}}, per_token, 4).splitlines()
                   if line.startswith("q4_0"))
    assert "2.20x" in q4_line and "250.0" in q4_line  # vs bf16, and the bound of its own bytes
    jobs = make_jobs(parse_args(["--dtypes", "bfloat16", "q4_0", "auto", "--threads", "1"]), Path("m.gguf"), [1])
    kinds = sorted((j["kind"], j.get("dtype")) for j in jobs)
    assert kinds == [("bandwidth", None), ("ssd", "auto"), ("ssd", "bfloat16"), ("ssd", "q4_0"),
                     ("transformers", "bfloat16")]


def test_decode_worker_measures_bandwidth_and_rejects_unknown_jobs(capsys):
    from ssd.bench.decode_worker import MARK_RESULT, main

    assert main([json.dumps({"kind": "bandwidth", "threads": 1, "bw_mb": 8})]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1][len(MARK_RESULT):])
    assert result["bytes"] == 2 * 8 * 2**20 and result["gbps"] > 0
    assert main([json.dumps({"kind": "llama.cpp"})]) == 2
    assert "unknown job kind 'llama.cpp'" in capsys.readouterr().err


FAKE_LLAMA_BENCH = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("version: 9.9 (fake)"); sys.exit(0)
opt = dict(zip(args[::2], args[1::2]))
gen = int(opt["-n"])
rate = 300.0 if gen == 0 else 100.0 + int(opt["-t"])
print(json.dumps([{"n_prompt": int(opt["-p"]), "n_gen": gen, "n_depth": int(opt.get("-d", 0)),
                   "model_filename": opt["-m"], "samples_ts": [rate] * int(opt["-r"])}]))
"""
FAKE_LLAMA_QUANTIZE = """#!/bin/sh
[ "$1" = --allow-requantize ] || exit 3
echo "$4" > "$3"
"""


def _fake_llamacpp(folder):
    """A folder with stand-ins for llama.cpp's llama-bench and llama-quantize."""
    folder.mkdir()
    for name, text in (("llama-bench", FAKE_LLAMA_BENCH), ("llama-quantize", FAKE_LLAMA_QUANTIZE)):
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


def test_llamacpp_peer_tools_files_and_worker(tmp_path, capsys):
    from ssd.bench import llamacpp
    from ssd.bench.decode_worker import MARK_RESULT, main

    with pytest.raises(llamacpp.LlamaCppMissing, match="no .*llama-bench"):
        llamacpp.find_tools(str(tmp_path))
    tools = llamacpp.find_tools(str(_fake_llamacpp(tmp_path / "bin")))
    source = tmp_path / "m.Q4_1.gguf"
    source.write_text("demo")
    cache = tmp_path / "cache"
    assert llamacpp.model_file(source, "auto", tools["llama-quantize"], cache) == source
    q8 = llamacpp.model_file(source, "q8_0", tools["llama-quantize"], cache)
    assert q8 == cache / "m.Q4_1.Q8_0.gguf" and q8.read_text().strip() == "Q8_0"
    q8.write_text("kept")  # made once, then reused
    assert llamacpp.model_file(source, "q8_0", tools["llama-quantize"], cache).read_text() == "kept"
    assert llamacpp.version(tools["llama-bench"]) == "version: 9.9 (fake)"
    job = {"kind": "llamacpp", "dtype": "q8_0", "threads": 2, "model": str(q8), "prompt_ids": [1] * 7,
           "max_tokens": 5, "repeats": 3, "llama_bench": tools["llama-bench"]}
    assert llamacpp.bench_args(job, prefill=False)[-6:] == ["-p", "0", "-n", "5", "-d", "7"]
    assert main([json.dumps(job)]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1][len(MARK_RESULT):])
    assert result["rates"] == [102.0] * 3 and result["prefill_rates"] == [300.0] * 3


def test_decode_rows_compare_ssd_with_llamacpp():
    from pathlib import Path

    from ssd.bench.decode import make_jobs, parse_args, summarise, table

    ssd_row, _ = _decode_rows()
    peer = {"engine": "llamacpp", "dtype": "float32", "threads": 1, "rates": [20.0, 22.0, 24.0],
            "prefill_rates": [600.0], "ttft_s": None, "token_ids": None, "other_cpu_fraction": 0.0}
    rows = [ssd_row, peer]
    summarise(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000}, prompt_tokens=120)
    assert ssd_row["prefill_tok_s"] == pytest.approx(400.0)  # 120 tokens / 0.3 s TTFT
    assert ssd_row["speedup_vs_llamacpp"] == pytest.approx(33.0 / 22.0)
    assert ssd_row["prefill_vs_llamacpp"] == pytest.approx(400.0 / 600.0)
    assert peer["speedup_vs_llamacpp"] is None and peer["prefill_tok_s"] == 600.0
    text = table(rows, {1: {"gbps": 20.0}}, {"float32": 500_000_000}, 4)
    assert "1.50x/0.67x" in text and "vs llama.cpp:" in text
    args = parse_args(["--engines", "ssd", "llamacpp", "--dtypes", "q8_0", "--threads", "2"])
    jobs = make_jobs(args, Path("m.gguf"), [1], {"q8_0": "m.Q8_0.gguf"}, "/bin/llama-bench")
    peer_job = next(j for j in jobs if j["kind"] == "llamacpp")
    assert peer_job["model"] == "m.Q8_0.gguf" and peer_job["llama_bench"] == "/bin/llama-bench"


# ---------------------------------------------------------------- contention


def test_contention_rejects_bad_options():
    proc = bench("contention", "--runs", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr
    proc = bench("contention", "--max-tokens", "1")
    assert proc.returncode == 2 and "--max-tokens must be at least 2" in proc.stderr


def test_busy_process_spins_apart_from_the_foreign_load_and_is_stopped():
    import time

    from ssd.bench.contention import busy_process, usable_cpus
    from ssd.bench.cpu_load import ForeignLoad

    with busy_process(usable_cpus()[-1]) as proc:
        with ForeignLoad([proc.pid]) as load:
            time.sleep(0.5)
        assert proc.poll() is None
    assert proc.poll() is not None  # killed and reaped when the block ends
    if load.excluded_fraction is not None:  # /proc is there
        assert load.excluded_fraction > 0  # its CPU time is counted apart, not as a third party's


def test_contention_summary_and_table():
    from ssd.bench.contention import summarise, table

    def row(threads, load, rates, other):
        return {"threads": threads, "load": load, "rates": rates, "other_cpu_fraction": other,
                "busy_cpu_fraction": [0.5] * len(rates) if load == "busy" else [0.0] * len(rates)}

    rows = [row(1, "alone", [100.0, 120.0, 110.0], [0.01] * 3), row(2, "alone", [150.0, 160.0, 155.0], [0.02] * 3),
            row(1, "busy", [100.0, 105.0, 90.0], [0.01] * 3), row(2, "busy", [50.0, 60.0, 70.0], [0.3, None, 0.0])]
    ratios = summarise(rows)
    assert ratios == pytest.approx({"alone": 155 / 110, "busy": 60 / 100})
    assert rows[3]["other_cpu_median"] == pytest.approx(0.15) and rows[2]["busy_cpu_median"] == 0.5
    text = table(rows, ratios)
    assert "2 threads / 1 thread, busy: 0.60x" in text and "(50.0-70.0)" in text
    assert "WARNING: third parties used more than 10%" in text
    assert "WARNING" not in table(rows[:3], summarise(rows[:3]))


def test_contention_smoke_run_writes_json(pair, tmp_path):
    target, _ = pair
    out = tmp_path / "c.json"
    proc = bench("contention", "--model", str(target), "--runs", "1", "--max-tokens", "4", "--dtype", "float32",
                 "--wait-idle", "0", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 threads / 1 thread, busy:" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m ssd.bench contention --model ")
    assert {(r["threads"], r["load"]) for r in doc["results"]} == {(1, "alone"), (2, "alone"), (1, "busy"),
                                                                   (2, "busy")}
    assert all(len(r["rates"]) == 1 and r["tok_s"] > 0 for r in doc["results"])
    assert set(doc["two_over_one_thread"]) == {"alone", "busy"}


# ---------------------------------------------------------------- fallback


def _run(mode, b, t, tok_s, **extra):
    return {"mode": mode, "batch_size": b, "temperature": t, "same_total_hardware": False,
            "decode_tok_per_s": tok_s, **extra}


def _auto_doc():
    ssd_extra = {"counters": {"fallback_neural": 5, "fallback_fast": 2}}
    runs = [_run("ar", 1, 0.0, 10.0), _run("sd", 1, 0.0, 15.0), _run("ssd", 1, 0.0, 17.0, **ssd_extra),
            _run("ar", 2, 0.0, 18.0), _run("sd", 2, 0.0, 19.0), _run("ssd", 2, 0.0, 19.5, **ssd_extra),
            {**_run("ar", 1, 0.0, 99.0), "same_total_hardware": True}]
    config = {"target": None, "draft": None, "regime_acceptance": 0.75, "regime_cost_ratio": 0.25,
              "datasets": ["mtbench"], "batches": [1, 2], "temperatures": [0.0], "modes": ["ar", "sd", "ssd"],
              "fanout": "geometric", "fallback": "auto", "same_total_hardware": True, "peers": ["hf"],
              "a_field_of_a_future_version": 1}
    return {"config": config, "pair": {"constructed": True}, "runs": runs}


def _forced(kind, b, tok_s, hit):
    return {"decode_tok_per_s": tok_s, "cache_hit_rate": hit, "t_b": 0.5 if kind == "neural" else 0.0,
            "e_miss": 3.0 if kind == "neural" else 1.5, "predicted_tok_per_s": tok_s + 1}


def test_fallback_rows():
    from ssd.bench.fallback import fallback_rows, plot_title, print_rows

    forced = {"neural": {(1, 0.0): _forced("neural", 1, 16.0, 0.5), (2, 0.0): _forced("neural", 2, 21.0, 0.6)},
              "fast": {(1, 0.0): _forced("fast", 1, 18.0, 0.5), (2, 0.0): _forced("fast", 2, 20.0, 0.6)}}
    rows = fallback_rows(_auto_doc()["runs"], forced)
    assert [(r["batch_size"], r["better_fixed"]) for r in rows] == [(1, "fast"), (2, "neural")]
    one, two = rows
    assert (one["ar"], one["sd"], one["ssd_auto"], one["ssd_neural"], one["ssd_fast"]) == (10.0, 15.0, 17.0, 16.0, 18.0)
    assert (one["auto_neural_misses"], one["auto_fast_misses"]) == (5, 2)
    assert two["all_hit"] == pytest.approx(0.36) and two["e_miss_fast"] == 1.5
    out = io.StringIO()
    print_rows(rows, out)
    assert len(out.getvalue().splitlines()) == 3
    assert "CONSTRUCTED regime pair, mtbench" in plot_title(_auto_doc())


def test_fallback_reruns_the_auto_runs_configuration():
    from ssd.bench.fallback import forced_config

    cfg = forced_config(_auto_doc(), "fast")
    assert (cfg.fallback, cfg.modes, cfg.same_total_hardware, cfg.peers) == ("fast", ["ssd"], False, [])
    assert (cfg.fanout, cfg.batches, cfg.datasets) == ("geometric", [1, 2], ["mtbench"])


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(sweep={}), "a regime sweep's result"),
    (lambda d: d.pop("runs"), "not a result of python -m ssd.bench"),
    (lambda d: d.update(runs=[r for r in d["runs"] if not (r["mode"] == "sd" and r["batch_size"] == 2)]),
     "no sd run at batch 2, temperature 0.0"),
])
def test_fallback_rejects_an_unusable_auto_result(tmp_path, capsys, change, message):
    from ssd.bench.fallback import main

    doc = _auto_doc()
    change(doc)
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(doc))
    assert main(["--auto", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_fallback_rejects_a_missing_file(tmp_path, capsys):
    from ssd.bench.fallback import main

    assert main(["--auto", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err


# ---------------------------------------------------------------- coupling


def test_coupling_rejects_bad_options():
    proc = bench("coupling", "--temperature", "0,1")
    assert proc.returncode == 2 and "--temperature: the couplings differ only when sampling" in proc.stderr
    proc = bench("coupling", "--target", "x")
    assert proc.returncode == 2 and "--target/--draft: give both" in proc.stderr


def test_coupling_summary_takes_each_modes_best():
    from ssd.bench.coupling import summarize

    def run(mode, coupling, c, tok):
        return {"dataset": "mtbench", "temperature": 1.0, "mode": mode, "coupling": coupling, "saguaro_c": c,
                "decode_tok_per_s": tok}

    rows = [run("ar", "gumbel", None, 5.0), run("sd", "rejection", None, 10.0), run("sd", "gumbel", None, 8.0),
            run("ssd", "rejection", 1.0, 12.0), run("ssd", "rejection", 0.5, 11.0), run("ssd", "gumbel", 1.0, 15.0),
            run("ssd", "gumbel", 0.5, 14.0)]
    (point,) = summarize(rows)
    assert point["best_sd"] == {"coupling": "rejection", "tok_per_s": 10.0}
    assert point["best_ssd"] == {"coupling": "gumbel", "saguaro_c": 1.0, "tok_per_s": 15.0}
    assert point["best_ssd_over_best_sd"] == 1.5
    assert point["gumbel_over_rejection"] == {"sd": 0.8, "ssd": 1.25}


def test_coupling_smoke_run_reproduces_ar_and_writes_json_and_plot(pair, tmp_path):
    target, draft = pair
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    proc = bench("coupling", "--target", str(target), "--draft", str(draft), "--datasets", "random", "--quick",
                 "--temperature", "1.0", "--saguaro-c", "1", "--k", "2", "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m ssd.bench coupling --target ")
    kinds = [(r["mode"], r["coupling"]) for r in doc["runs"]]
    assert kinds == [("ar", "gumbel"), ("sd", "rejection"), ("ssd", "rejection"), ("sd", "gumbel"),
                     ("ssd", "gumbel")]
    assert [r["same_tokens_as_ar"] for r in doc["runs"]] == [None, None, None, True, True]
    assert png.stat().st_size > 0
