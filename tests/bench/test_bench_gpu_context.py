"""python -m ssd.bench gpu beyond its tok/s table (ssd.bench.gpu_context): the
bytes a decode step reads (the bound's numerator), the kernel time read from a
profiler trace, the time budget's estimates, the bound per context, the goals,
the options, and a tiny run on the CPU whose JSON holds every new field, with
what needs CUDA None and saying why. The expected numbers are worked by hand
in the comments, not by the functions under test."""
import json
import time
from types import SimpleNamespace

import pytest

from ssd.bench import gpu, gpu_context
from ssd.bench.gpu import add_bandwidth_bound
from ssd.bench.gpu_context import (Deadline, busy_seconds, estimate_s, goals, kv_cache_dtype_on, mean_context,
                                   step_bytes, trace_kernels)


def shape(layers, kv_heads, head_dim):
    return SimpleNamespace(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim)


@pytest.mark.parametrize("config, weight_bytes, context, dtype, expected", [
    # Llama-3.1-8B (32 layers, 8 KV heads of 128) in bf16: 128 KiB of K and V a token
    # (2 * 32 * 8 * 128 * 2 = 131,072 bytes), 128 MiB at 1K; its weights 8,030,261,248 x 2 bytes.
    (shape(32, 8, 128), 16_060_522_496, 1024, "bfloat16", 16_060_522_496 + 134_217_728),
    # The constructed target (128 layers, 8 KV heads of 64), bf16: 256 KiB a token, 4 GiB at 16K.
    (shape(128, 8, 64), 16_000_000_000, 16384, "bfloat16", 16_000_000_000 + 4_294_967_296),
    # The same cache in fp32 (the CPU's 'auto'): twice the KV bytes, 8 GiB at 16K.
    (shape(128, 8, 64), 0, 16384, "float32", 8_589_934_592),
    # The tiny target's shapes in fp32: 2 * 4 * 2 * 32 * 4 = 2,048 bytes a token; 256 tokens: 524,288.
    (shape(4, 2, 32), 1000, 256, "float32", 1000 + 524_288),
    # Context 0: the weights alone.
    (shape(32, 8, 128), 123, 0, "bfloat16", 123),
])
def test_step_bytes_against_hand_numbers(config, weight_bytes, context, dtype, expected):
    assert step_bytes(config, weight_bytes, context, dtype) == expected


def test_kv_cache_dtype_as_the_engine_resolves_auto():
    assert kv_cache_dtype_on("cuda") == "bfloat16" and kv_cache_dtype_on("cuda:1") == "bfloat16"
    assert kv_cache_dtype_on("cpu") == "float32"
    assert kv_cache_dtype_on("cuda", "float32") == "float32" and kv_cache_dtype_on("cpu", "bfloat16") == "bfloat16"


def test_mean_context_of_the_timed_steps():
    # A 32-token prompt and 64 tokens: the 63 timed steps attend over 33 .. 95 keys, (33 + 95) / 2 = 64.
    assert mean_context(32, 64) == 64
    # 1024 and 2 tokens: one timed step, over 1025 keys.
    assert mean_context(1024, 2) == 1025


def test_kernel_time_is_the_union_of_the_kernels_intervals():
    assert busy_seconds([]) == 0
    # [0, 10] and [5, 15] overlap: 15; [20, 25]: 5 more; [21, 22] inside it: nothing.
    assert busy_seconds([(20, 25), (0, 10), (5, 15), (21, 22)]) == 20
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "linear", "ts": 100.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "attention", "ts": 105.0, "dur": 10.0},
        {"ph": "X", "cat": "Kernel", "name": "rms_norm", "ts": 120.0, "dur": 5.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 130.0, "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 99.0, "dur": 3.0},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 200.0},
    ]}
    seconds, count = trace_kernels(trace)
    assert count == 3 and seconds == pytest.approx(20e-6)
    assert trace_kernels({}) == (0.0, 0)


def test_estimates_and_the_deadline():
    # Measured at 1024: prefill 2 s, 31 timed steps in 1.55 s. At 4096 with 32 tokens: 2 * 4^2 + 1.55 * 4 = 38.2 s;
    # with 1 token (a prefill alone) 32 s.
    last = {"context": 1024, "decode_tokens": 32, "prefill_seconds": 2.0, "decode_seconds": 1.55}
    assert estimate_s(last, 4096, 32) == pytest.approx(38.2)
    assert estimate_s(last, 4096, 1) == pytest.approx(32.0)
    assert estimate_s(None, 4096, 32) is None
    now = time.perf_counter()
    assert Deadline(now, None).why_skip(1e9) is None
    assert Deadline(now, 100.0).why_skip(None) is None
    assert Deadline(now, 100.0).why_skip(10.0) is None
    why = Deadline(now - 95.0, 100.0).why_skip(38.2)
    assert why.startswith("skipped: estimated 38 s, ") and "--time-budget-s" in why
    # Nothing to estimate from: it starts while any budget is left.
    assert Deadline(now - 95.0, 100.0).why_skip(None) is None
    assert Deadline(now - 101.0, 100.0).why_skip(None) == "skipped: --time-budget-s spent"


def test_bound_per_context_and_per_product():
    # 3.2 TB/s. ar: 16 GB a step -> 200 tok/s, 150 of it is 75 %. Context 16384: 20 GB a step -> 160 tok/s,
    # 120 is 75 %; a skipped context keeps None. A product at 1600 GB/s wall and 2400 over its kernels: 50 %, 75 %.
    result = {"ar": {"tok_s": 150.0, "step_bytes": 16e9},
              "contexts": {"runs": [{"context": 16384, "tok_s": 120.0, "step_bytes": 20e9, "bound_tok_s": None,
                                     "fraction_of_bound": None},
                                    {"context": 65536, "tok_s": None, "why": "skipped: ..."}]},
              "linear": [{"matrix": "qkv", "gb_s": 1600.0, "kernel_gb_s": 2400.0},
                         {"matrix": "o", "gb_s": 800.0, "kernel_gb_s": None}]}
    lines = add_bandwidth_bound(result, 3.2e12, "datasheet for X").splitlines()
    row, skipped = result["contexts"]["runs"]
    assert row["bound_tok_s"] == pytest.approx(160.0) and row["fraction_of_bound"] == pytest.approx(0.75)
    assert "fraction_of_bound" not in skipped
    qkv, o = result["linear"]
    assert qkv["fraction_of_bandwidth"] == pytest.approx(0.5) and qkv["kernel_fraction_of_bandwidth"] == 0.75
    assert o["fraction_of_bandwidth"] == pytest.approx(0.25) and "kernel_fraction_of_bandwidth" not in o
    assert lines[0] == "ar at 75% of the 200 tok/s bandwidth bound (3.20 TB/s, datasheet for X)"
    assert lines[1] == "ar at context 16384: 120.0 tok/s, 75% of its 160 tok/s bound (20.000 GB a step)"
    assert lines[2:] == ["linear qkv: 50% of the bandwidth (75% over its kernels' time)",
                         "linear o: 25% of the bandwidth"]


def test_outside_kernels_from_two_profiled_requests(monkeypatch):
    # The CUDA path's arithmetic, with the profiler and the engine faked: a 1-token request runs 0.5 s of
    # kernels in 400 launches, a 9-token one 0.5 + 8 x 4.8 ms in 400 + 8 x 390: 4.8 ms and 390 kernels a step.
    # The unprofiled decode: 31 steps in 155 ms, 5 ms a step, so 1 - 4.8 / 5 = 4 % of it is outside kernels.
    profiled = iter([(0.5, 400), (0.5 + 8 * 0.0048, 400 + 8 * 390)])
    asked = []
    monkeypatch.setattr(gpu_context, "cuda_kernels", lambda fn: (fn(), next(profiled))[1])
    monkeypatch.setattr(gpu_context, "request", lambda llm, prompt, n: asked.append((len(prompt), n)))
    row = {"context": 1024, "decode_tokens": 32, "prefill_seconds": 0.3, "decode_seconds": 0.155}
    out = gpu_context.outside_kernels(None, [7] * 1024, row, Deadline(time.perf_counter(), None))
    assert asked == [(1024, 1), (1024, 1 + gpu_context.PROFILED_STEPS)] and gpu_context.PROFILED_STEPS == 8
    assert out["fraction"] == pytest.approx(0.04) and out["kernels_per_step"] == pytest.approx(390)
    assert out["kernel_seconds_per_step"] == pytest.approx(0.0048) and out["wall_seconds_per_step"] == 0.005
    assert gpu_context.format_outside(out) == ("outside kernels: 4.0% of a decode step at context 1024 (kernels "
                                               "4.80 ms of 5.00 ms; 390 kernels a step; torch.profiler over 8 steps)")
    # A profiler that saw no kernels gives no number; neither does a spent budget.
    monkeypatch.setattr(gpu_context, "cuda_kernels", lambda fn: (0.0, 0))
    assert gpu_context.outside_kernels(None, [7], row, Deadline(time.perf_counter(), None)) == {
        "fraction": None, "why": "torch.profiler recorded no CUDA kernels"}
    spent = gpu_context.outside_kernels(None, [7], row, Deadline(time.perf_counter() - 10, 1.0))
    assert spent["fraction"] is None and spent["why"].startswith("skipped: estimated 1 s")


def test_goals_met_missed_and_not_measured():
    result = {"contexts": {"runs": [{"context": 1024, "fraction_of_bound": 0.81},
                                    {"context": 16384, "fraction_of_bound": 0.59}]},
              "prefill": {"tokens": 4096, "stock_cublas": {"tok_s": None, "why": "not measured on cpu"}},
              "outside_kernels": {"fraction": 0.05}}
    assert [(g["value"], g["met"]) for g in goals(result)] == [(0.81, True), (0.59, False), (None, None),
                                                               (0.05, True)]
    # A prefill of another length is not the 4K goal's; contexts not run are not measured.
    result = {"contexts": {"runs": []}, "prefill": {"tokens": 256, "stock_cublas": {"tok_s": 9e9}},
              "outside_kernels": {"fraction": None}}
    assert [g["met"] for g in goals(result)] == [None] * 4


@pytest.mark.parametrize("options, message", [
    (["--context-tokens", "1"], "--context-tokens must be at least 2"),
    (["--contexts", "64", "0"], "--contexts must be distinct positive lengths, got [64, 0]"),
    (["--contexts", "64", "64"], "--contexts must be distinct positive lengths"),
    (["--prefill-tokens", "-1"], "--prefill-tokens must be 0 or more, got -1"),
    (["--time-budget-s", "0"], "--time-budget-s must be positive, got 0.0"),
])
def test_bad_options_are_refused(capsys, options, message):
    with pytest.raises(SystemExit) as exit_:
        gpu.main(["--device", "cpu", "--shapes", "tiny", *options])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_tiny_cpu_run_reports_contexts_prefill_and_products(tmp_path, capsys):
    # One batch, short decodes; contexts 32 and 96, the prefill a 48-token prompt of its own; a bandwidth
    # given so that the CPU gets a bound (1 PB/s: every fraction far below 1, above 0).
    out = tmp_path / "bench_gpu.json"
    assert gpu.main(["--device", "cpu", "--shapes", "tiny", "--batches", "1", "--max-tokens", "6", "--repeats", "1",
                     "--contexts", "96", "32", "--context-tokens", "5", "--prefill-tokens", "48",
                     "--bandwidth-gbs", "1e6", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    contexts = result["contexts"]
    # The tiny target in fp32: (1 draft + ballast + 8 perturbing) layers of 1 KV head of 32, 4 bytes a value.
    layers = result["pair"]["target_layers"]["total"]
    assert contexts["kv_cache_dtype"] == "float32" and contexts["kv_bytes_per_token"] == 2 * layers * 32 * 4
    assert [r["context"] for r in contexts["runs"]] == [32, 96] and contexts["decode_tokens"] == 5
    for r in contexts["runs"]:
        assert r["tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["prefill_seconds"] > 0
        assert r["mean_context"] == r["context"] + 2.5
        assert r["step_bytes"] == result["target_weight_bytes"] + r["mean_context"] * contexts["kv_bytes_per_token"]
        assert r["bound_tok_s"] == pytest.approx(1e15 / r["step_bytes"]) and 0 < r["fraction_of_bound"] <= 1
    assert result["ar"]["mean_context"] == 32 + 3 and 0 < result["ar_fraction_of_bound"] <= 1
    prefill = result["prefill"]
    assert prefill["tokens"] == 48 and prefill["batch_invariant"]["tok_s"] > 0
    assert prefill["batch_invariant"]["from"] == "its own request"
    assert prefill["stock_cublas"]["tok_s"] is None and "not measured on cpu" in prefill["stock_cublas"]["why"]
    assert result["outside_kernels"]["fraction"] is None and "not measured on cpu" in result["outside_kernels"]["why"]
    products = {r["matrix"]: r for r in result["linear"]}
    assert sorted(products) == ["down", "gate_up", "lm_head", "o", "qkv"]
    # The tiny draft's (and target's) shapes: 2 heads and 1 KV head of 32, hidden 64, intermediate 128, vocab 512.
    assert [(products[m]["n"], products[m]["k"]) for m in ("qkv", "o", "gate_up", "down", "lm_head")] == [
        (128, 64), (64, 64), (256, 64), (64, 128), (512, 64)]
    for r in products.values():
        assert r["gb_s"] > 0 and 0 < r["fraction_of_bandwidth"] <= 1 and r["kernel_gb_s"] is None
    assert [g["met"] for g in result["goals"]] == [None] * 4 and result["errors"] == []
    assert "outside kernels: not measured on cpu" in printed and "ar at context 96: " in printed
    assert "prefill of a 48-token prompt (ar, batch 1): batch-invariant " in printed


def test_time_budget_skips_what_would_not_fit(tmp_path, capsys, monkeypatch):
    # Estimates (tested above) made huge: the first context has nothing to estimate from and runs, as
    # the budget is not spent; the next, and the prefill estimated from it, are skipped and say so.
    # Skips are not failures.
    monkeypatch.setattr(gpu_context, "estimate_s", lambda last, context, tokens: None if last is None else 1e9)
    out = tmp_path / "bench_gpu.json"
    assert gpu.main(["--device", "cpu", "--shapes", "tiny", "--batches", "1", "--max-tokens", "4", "--repeats", "1",
                     "--contexts", "32", "64", "--context-tokens", "3", "--prefill-tokens", "80",
                     "--time-budget-s", "600", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    first, second = result["contexts"]["runs"]
    assert first["tok_s"] > 0 and first["fraction_of_bound"] is None  # no bandwidth on the CPU: no bound
    assert second["tok_s"] is None and second["why"].startswith("skipped: estimated 1000000000 s, ")
    assert result["prefill"]["batch_invariant"]["tok_s"] is None
    assert result["prefill"]["batch_invariant"]["why"].startswith("skipped: estimated ")
    assert result["errors"] == [] and "bandwidth_bound_tok_s" not in result
    assert "      64  skipped: estimated " in capsys.readouterr().out


def test_a_failed_context_is_an_error_and_the_others_run(tmp_path, monkeypatch):
    request = gpu_context.request

    def failing(llm, prompt, max_tokens):
        if len(prompt) == 32:
            raise RuntimeError("out of memory at 32")
        return request(llm, prompt, max_tokens)

    monkeypatch.setattr(gpu_context, "request", failing)
    out = tmp_path / "bench_gpu.json"
    assert gpu.main(["--device", "cpu", "--shapes", "tiny", "--batches", "1", "--max-tokens", "3", "--repeats", "1",
                     "--contexts", "32", "48", "--context-tokens", "3", "--prefill-tokens", "48",
                     "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    failed, ran = result["contexts"]["runs"]
    assert failed == {"context": 32, "tok_s": None, "error": "RuntimeError: out of memory at 32"}
    assert ran["tok_s"] > 0 and result["prefill"]["batch_invariant"]["from"] == "the 48-token context run"
    assert result["errors"] == ["context 32: RuntimeError: out of memory at 32"]


def test_errors_and_goal_lines():
    result = {"contexts": {"runs": [{"context": 1024, "tok_s": 1.0}, {"context": 4096, "error": "E1"}]},
              "prefill": {"tokens": 4096, "batch_invariant": {"tok_s": None, "why": "skipped"},
                          "stock_cublas": {"tok_s": None, "error": "E2"}},
              "outside_kernels": {"fraction": None, "error": "E3"}}
    assert gpu_context.errors(result) == ["context 4096: E1", "prefill stock_cublas: E2", "outside_kernels: E3"]
    assert gpu_context.format_goals([{"goal": "a", "value": 0.8125, "met": True},
                                     {"goal": "b", "value": 0.5, "met": False},
                                     {"goal": "c", "value": None, "met": None}]).splitlines() == [
        "goal: a: met (0.812)", "goal: b: NOT met (0.5)", "goal: c: not measured"]


def test_no_contexts_and_no_prefill(tmp_path):
    out = tmp_path / "bench_gpu.json"
    assert gpu.main(["--device", "cpu", "--shapes", "tiny", "--batches", "1", "--max-tokens", "3", "--repeats", "1",
                     "--contexts", "--prefill-tokens", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["contexts"]["runs"] == [] and result["prefill"]["batch_invariant"] == {
        "tok_s": None, "why": "--prefill-tokens 0"}


def test_defaults_per_shapes():
    assert gpu_context.DEFAULTS["llama"] == ([1024, 4096, 16384], 4096)
    assert gpu_context.DEFAULTS["tiny"] == ([64, 256], 256)
