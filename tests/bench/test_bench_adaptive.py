"""python -m ssd.bench adaptive's bookkeeping on hand-made runs: the plan, the medians, the ratios and
criteria, the greedy check and the options (no engine run)."""
import io

import pytest

from ssd.bench import adaptive
from ssd.bench.adaptive import aggregate, check_tokens, grid, parse_args, plan, print_summary, summarize, waves_at

VARIANTS = ["ar", "ar 2thr", "sd", "ssd", "sd adaptive", "ssd adaptive"]


def test_variants_and_thresholds():
    assert list(adaptive.VARIANTS) == VARIANTS
    assert adaptive.VARIANTS["ar 2thr"] == ("ar", None, 2)
    assert adaptive.VARIANTS["ssd adaptive"] == ("ssd", True, 1)
    assert adaptive.VARIANTS["sd"] == ("sd", False, 1)
    assert adaptive.FIXED == ("ar", "sd", "ssd")
    assert (adaptive.MIN_RATIO, adaptive.MIN_RATIO_SPREAD, adaptive.SPREAD) == (0.90, 0.95, 0.05)
    assert (adaptive.MIN_B1_T0_OVER_SSD, adaptive.MIN_B1_T0_OVER_AR) == (0.97, 1.5)


def test_plan_interleaves_reps_over_points_and_variants():
    points = grid(["mtbench", "humaneval"], [0.0], [1, 2])
    assert points == [("mtbench", 0.0, 1), ("mtbench", 0.0, 2), ("humaneval", 0.0, 1), ("humaneval", 0.0, 2)]
    runs = plan(points[:2], 2)
    assert len(runs) == 24
    assert runs[:7] == [(0, ("mtbench", 0.0, 1), "ar"), (0, ("mtbench", 0.0, 1), "ar 2thr"),
                        (0, ("mtbench", 0.0, 1), "sd"), (0, ("mtbench", 0.0, 1), "ssd"),
                        (0, ("mtbench", 0.0, 1), "sd adaptive"), (0, ("mtbench", 0.0, 1), "ssd adaptive"),
                        (0, ("mtbench", 0.0, 2), "ar")]
    assert runs[12] == (1, ("mtbench", 0.0, 1), "ar")
    assert runs[-1] == (1, ("mtbench", 0.0, 2), "ssd adaptive")


def row(t, b, variant, rep, tok, counters=None, tokens=None, acc=None, hit=None):
    return {"dataset": "mtbench", "temperature": t, "batch_size": b, "variant": variant, "rep": rep,
            "decode_tok_per_s": tok, "acceptance_rate": acc, "cache_hit_rate": hit, "counters": counters or {},
            "token_ids": tokens if tokens is not None else [[1, 2, 3]]}


# (temperature, batch) -> variant -> decode tok/s of reps 0, 1, 2
TOK = {
    # B=1 T=0: best fixed ssd (29), spread 29/11 - 1, every criterion met.
    (0.0, 1): {"ar": [10, 12, 11], "ar 2thr": [15, 15, 15], "sd": [20, 18, 22], "ssd": [30, 28, 29],
               "sd adaptive": [19, 19, 19], "ssd adaptive": [29, 30, 28]},
    # B=4 T=1: best fixed ar (40), spread 40/32 - 1 = 0.25, ratio 37/40 = 0.925: >= 0.90 but < 0.95.
    (1.0, 4): {"ar": [40, 40, 40], "ar 2thr": [60, 60, 60], "sd": [36, 36, 36], "ssd": [32, 32, 32],
               "sd adaptive": [38, 38, 38], "ssd adaptive": [37, 37, 37]},
    # B=2 T=0: spread 52/50 - 1 = 0.04 (no 0.95 criterion), ratio 48/52; sd adaptive's rep 1 differs from ar.
    (0.0, 2): {"ar": [50, 50, 50], "ar 2thr": [70, 70, 70], "sd": [51, 51, 51], "ssd": [52, 52, 52],
               "sd adaptive": [45, 45, 45], "ssd adaptive": [48, 48, 48]},
}


def rows():
    out = []
    for (t, b), by_variant in TOK.items():
        for variant, toks in by_variant.items():
            for rep, tok in enumerate(toks):
                counters = {"active_seconds": 2.0 + rep}
                if variant == "ssd adaptive":
                    counters.update(adaptive_steps=200 * (rep + 1), adaptive_switches=5,
                                    adaptive_decision_seconds=0.02)
                bad = (t, b, variant, rep) == (0.0, 2, "sd adaptive", 1)
                out.append(row(t, b, variant, rep, float(tok), counters, [[1, 2, 4]] if bad else None,
                               acc=0.5 + rep / 10, hit=0.25 * rep))
    return out


def test_check_tokens_compares_with_the_same_reps_ar_at_temperature_0():
    runs = rows()
    check_tokens(runs)
    assert all("token_ids" not in r for r in runs)
    same = {(r["temperature"], r["batch_size"], r["variant"], r["rep"]): r["same_tokens_as_ar"] for r in runs}
    assert same[(0.0, 2, "sd adaptive", 1)] is False
    assert same[(0.0, 2, "sd adaptive", 0)] is True
    assert same[(0.0, 1, "ar 2thr", 2)] is True
    assert same[(0.0, 1, "ar", 0)] is None  # the reference
    assert same[(1.0, 4, "ssd adaptive", 0)] is None  # sampling: not checked


def test_aggregate_takes_medians_and_the_median_reps_details():
    runs = rows()
    check_tokens(runs)
    entries = {(e["temperature"], e["batch_size"], e["variant"]): e for e in aggregate(runs)}
    assert len(entries) == 18
    e = entries[(0.0, 1, "ssd adaptive")]
    assert e["tok_per_s_reps"] == [29.0, 30.0, 28.0]
    assert e["median_tok_per_s"] == 29.0
    assert e["median_rep"] == 0
    assert e["acceptance_rate"] == 0.5 and e["cache_hit_rate"] == 0.0
    assert e["adaptive_counters"] == {"adaptive_steps": 200, "adaptive_switches": 5,
                                      "adaptive_decision_seconds": 0.02}
    assert e["switches_per_100_steps"] == pytest.approx(2.5)
    assert e["decision_fraction"] == pytest.approx(0.01)
    assert e["same_tokens_as_ar"] is True
    ssd = entries[(0.0, 1, "ssd")]
    assert ssd["median_tok_per_s"] == 29.0 and ssd["median_rep"] == 2
    assert ssd["adaptive_counters"] == {} and ssd["switches_per_100_steps"] is None
    assert ssd["decision_fraction"] is None
    assert entries[(0.0, 1, "sd")]["median_tok_per_s"] == 20.0
    assert entries[(0.0, 2, "sd adaptive")]["same_tokens_as_ar"] is False
    assert entries[(1.0, 4, "ar")]["same_tokens_as_ar"] is None


def test_aggregate_even_reps_median_and_lower_median_rep():
    entries = aggregate([row(0.0, 1, "ar", 0, 14.0), row(0.0, 1, "ar", 1, 10.0)])
    assert len(entries) == 1
    assert entries[0]["median_tok_per_s"] == 12.0 and entries[0]["median_rep"] == 1


def test_summarize_ratios_and_criteria():
    runs = rows()
    check_tokens(runs)
    points = {(p["temperature"], p["batch_size"]): p for p in summarize(aggregate(runs))}
    assert list(points) == [(0.0, 1), (0.0, 2), (1.0, 4)]

    p = points[(0.0, 1)]
    assert p["tok_per_s"] == {"ar": 11.0, "ar 2thr": 15.0, "sd": 20.0, "ssd": 29.0, "sd adaptive": 19.0,
                              "ssd adaptive": 29.0}
    assert p["best_fixed"] == "ssd" and p["best_fixed_tok_per_s"] == 29.0
    assert p["spread"] == pytest.approx(29 / 11 - 1)
    assert p["ratio"] == pytest.approx(1.0)
    assert p["sd_adaptive_ratio"] == pytest.approx(19 / 29)
    assert p["ssd_adaptive_over_ssd"] == pytest.approx(1.0)
    assert p["ssd_adaptive_over_ar"] == pytest.approx(29 / 11)
    assert p["checks"] == {"ratio >= 0.9": True, "ratio >= 0.95 (spread > 0.05)": True,
                           "ssd_adaptive_over_ssd >= 0.97": True, "ssd_adaptive_over_ar >= 1.5": True,
                           "same tokens as ar": True}
    assert p["pass"] is True

    p = points[(1.0, 4)]
    assert p["best_fixed"] == "ar" and p["spread"] == pytest.approx(0.25) and p["ratio"] == pytest.approx(0.925)
    assert p["ssd_adaptive_over_ssd"] is None and p["ssd_adaptive_over_ar"] is None  # batch 1 only
    assert p["checks"] == {"ratio >= 0.9": True, "ratio >= 0.95 (spread > 0.05)": False}
    assert p["pass"] is False

    p = points[(0.0, 2)]
    assert p["best_fixed"] == "ssd" and p["spread"] == pytest.approx(0.04) and p["ratio"] == pytest.approx(48 / 52)
    assert p["checks"] == {"ratio >= 0.9": True, "same tokens as ar": False}
    assert p["pass"] is False


def test_summarize_a_missing_variant_fails_its_criteria():
    entries = aggregate([row(0.0, 1, v, 0, tok) for v, tok in (("ar", 10.0), ("sd", 20.0), ("ssd", 30.0))])
    (p,) = summarize(entries)
    assert p["ratio"] is None and p["ssd_adaptive_over_ar"] is None
    assert p["checks"]["ratio >= 0.9"] is False and p["pass"] is False


def test_print_summary_reports_verdicts_and_token_mismatch():
    runs = rows()
    check_tokens(runs)
    entries = aggregate(runs)
    out = io.StringIO()
    assert print_summary(entries, summarize(entries), out) is False
    text = out.getvalue()
    assert "overall: FAIL (1/3 points)" in text
    assert "FAIL: ratio >= 0.95 (spread > 0.05)" in text
    assert "DID NOT REPRODUCE AR'S TOKENS: mtbench B=2 sd adaptive" in text
    assert "sw/100 2.5 dec 0.010" in text


def test_options_defaults_quick_and_overrides():
    args = parse_args([])
    assert (args.batches, args.temperatures, args.datasets) == ([1, 2, 4, 8, 16], [0.0, 1.0], ["humaneval", "mtbench"])
    assert (args.reps, args.max_tokens, args.waves, args.k, args.json, args.plot) == (3, 32, 1, 4, None, None)
    assert args.min_prompts == 4
    args = parse_args(["--quick"])
    assert (args.batches, args.temperatures, args.datasets, args.reps, args.max_tokens, args.min_prompts) == \
        ([1, 2], [0.0], ["mtbench"], 1, 8, 1)
    args = parse_args(["--quick", "--datasets", "random", "--batch", "4", "--reps", "2"])
    assert (args.batches, args.datasets, args.reps, args.max_tokens) == ([4], ["random"], 2, 8)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "1,0"], "--batch: every batch size must be >= 1"),
    (["--reps", "0"], "--reps: must be >= 1"),
    (["--temperature", "0,-0.5"], "--temperature: every temperature must be >= 0"),
    (["--datasets", "mtbench,nope"], "--datasets: unknown nope"),
    (["--waves", "0"], "--waves: must be >= 1"),
    (["--min-prompts", "0"], "--min-prompts: must be >= 1"),
    (["--target", "t"], "--target/--draft: give both"),
    (["--warmup-prompt-len", "-1"], "--warmup-prompt-len: must be >= 0"),
    (["--batch", "x"], "expected a comma-separated list of int"),
])
def test_options_rejected(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_small_batches_run_more_waves_to_reach_min_prompts():
    # batch 1 with 4 prompts at least: 4 waves; batch 3: 2 (6 prompts); a full batch of 4 or more: --waves.
    assert [waves_at(b, 1, 4) for b in (1, 2, 3, 4, 16)] == [4, 2, 2, 1, 1]
    assert [waves_at(b, 3, 4) for b in (1, 2, 8)] == [4, 3, 3]
    assert waves_at(1, 1, 1) == 1


def test_registered_as_a_subcommand():
    from ssd.bench.__main__ import SUBCOMMANDS

    assert SUBCOMMANDS["adaptive"][0] == "ssd.bench.adaptive"


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from ssd.bench.plots import write_adaptive_plot

    runs = rows()
    check_tokens(runs)
    path = write_adaptive_plot(tmp_path / "sub" / "adaptive.png", summarize(aggregate(runs)))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("length", [None, 0, 20])
def test_the_warm_up_prompts(monkeypatch, length):
    """By default each run's warm-up is the first full batch of prompts cut to 16 tokens; --warmup-prompt-len N
    cuts them to N; 0 takes whole prompts from past the timed ones (no timed run decodes them)."""
    import types

    from ssd import models

    def fake_prompts(dataset, n, tokenizer, seed, vocab):
        return [[i] * (50 + i) for i in range(n)]  # prompt i: token i, 50 + i long

    calls = []

    def fake_run(target, draft, mode, prompts, cfg, batch, temperature, threads, label, adaptive=None,
                 warmup_set=None, warmup_tokens=8, warmup_prompts=1):
        calls.append((batch, prompts, warmup_set))
        return row(temperature, batch, "?", 0, 1.0)

    monkeypatch.setattr(adaptive, "load_prompts", fake_prompts)
    monkeypatch.setattr(adaptive, "run_engine", fake_run)
    monkeypatch.setattr(adaptive, "constructed_pair", lambda *a: {"constructed": True, "target": "t", "draft": "d"})
    monkeypatch.setattr(models, "load", lambda *a, **k: types.SimpleNamespace(
        tokenizer=None, config=types.SimpleNamespace(vocab_size=100)))
    argv = ["--batch", "1,4", "--datasets", "mtbench", "--temperature", "0", "--reps", "1", "--variants", "ar,ssd"]
    adaptive.main(argv + ([] if length is None else ["--warmup-prompt-len", str(length)]))
    assert len(calls) == 4
    for batch, prompts, warm in calls:
        assert [p[0] for p in prompts] == [0, 1, 2, 3]  # 4 waves of one prompt at batch 1, one wave at batch 4
        if length == 0:
            assert [p[0] for p in warm] == list(range(4, 4 + batch))
            assert all(len(p) == 50 + p[0] for p in warm)  # whole
        else:
            assert [p[0] for p in warm] == list(range(batch))
            assert all(len(p) == (16 if length is None else length) for p in warm)
