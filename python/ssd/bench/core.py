"""The benchmark's runs, isolated component times and speed-model predictions."""
from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from ssd.config import EngineConfig

from .record import machine

DATASETS = ("humaneval", "mtbench", "sharegpt", "random")
MODES = ("ar", "sd", "ssd")



@dataclass
class BenchConfig:
    """What ``python -m ssd.bench`` runs (see ``--help`` for each field)."""

    target: str | None = None
    draft: str | None = None
    # A list of several values sweeps that parameter over constructed pairs (one of the two at most).
    regime_acceptance: float | list[float] = 0.75
    regime_cost_ratio: float | list[float] = 0.25
    datasets: list[str] = field(default_factory=lambda: ["humaneval", "mtbench"])
    num_prompts: int = 4
    max_tokens: int = 64
    batches: list[int] = field(default_factory=lambda: [1])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    k: int = 4
    fanout: str | list[int] = "confidence"
    fanout_budget: str | int = "auto"
    saguaro_c: float = 1.0
    fallback: str = "auto"
    coupling: str = EngineConfig.coupling  # the engine's default
    dtype: str = "float32"
    target_threads: int = 1
    draft_threads: int = 1
    same_total_hardware: bool = True
    peers: list[str] = field(default_factory=list)
    seed: int = 0
    max_model_len: int = 2048

    def validate(self) -> None:
        for d in self.datasets:
            if d not in DATASETS:
                raise ValueError(f"datasets: unknown dataset {d!r} (choose from {', '.join(DATASETS)})")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"modes: unknown mode {m!r} (choose from {', '.join(MODES)})")
        for p in self.peers:
            if p != "hf":
                raise ValueError(f"peers: unknown peer {p!r} (only 'hf': transformers generate and assisted generation)")
        if (self.target is None) != (self.draft is None):
            raise ValueError("target/draft: give both (or neither, for the constructed regime pair)")
        for name in ("num_prompts", "max_tokens", "k", "target_threads", "draft_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if any(b < 1 for b in self.batches):
            raise ValueError(f"batch: every batch size must be >= 1, got {self.batches}")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperature: must be >= 0, got {self.temperatures}")
        from ssd.testing.regime import ACCEPTANCE_RANGE, COST_RATIO_RANGE

        swept = []
        for name, (lo, hi) in (("regime_acceptance", ACCEPTANCE_RANGE), ("regime_cost_ratio", COST_RATIO_RANGE)):
            values = _values(getattr(self, name))
            if not values or any(not lo < v < hi for v in values):
                raise ValueError(f"{name}: every value must be in ({lo}, {hi}), got {getattr(self, name)}")
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: a value repeats in {values}")
            if len(values) > 1:
                swept.append(name)
        if len(swept) > 1:
            raise ValueError("regime_acceptance/regime_cost_ratio: only one of them may be a list (1-D sweeps)")
        if swept and self.target is not None:
            raise ValueError(f"{swept[0]}: a list sweeps constructed pairs; it does not apply to target/draft")

    def sweep(self) -> tuple[str, list[float]] | None:
        """("acceptance" or "cost_ratio", its values) when one regime parameter has several values."""
        for name in ("acceptance", "cost_ratio"):
            values = _values(getattr(self, f"regime_{name}"))
            if len(values) > 1:
                return name, values
        return None


def _values(x) -> list[float]:
    return [float(v) for v in x] if isinstance(x, (list, tuple)) else [float(x)]


def load_prompts(dataset: str, n: int, tokenizer, seed: int, vocab: int) -> list[list[int]]:
    """n prompts as token ids: the text datasets chat-rendered and tokenized; 'random' 64 random ids."""
    from ssd import assets

    if dataset == "random":
        rng = random.Random(seed)
        return [[rng.randrange(vocab) for _ in range(64)] for _ in range(n)]
    questions = {"humaneval": assets.humaneval_prompts, "mtbench": assets.mtbench_prompts,
                 "sharegpt": assets.sharegpt_prompts}[dataset](n)
    if tokenizer is None:
        raise ValueError(f"datasets: {dataset} needs a model with a tokenizer")
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                           add_generation_prompt=True))
            for q in questions]


def run_engine(target, draft, mode: str, prompts: list, cfg: BenchConfig, batch: int, temperature: float,
               target_threads: int, label: str, adaptive: bool | None = None, warmup_prompts: int = 1,
               warmup_tokens: int = 8, warmup_set: list | None = None) -> dict:
    """One mode over the prompts in groups of `batch`; returns the run's measurements.

    The untimed warm-up generates warmup_tokens for the prompts of warmup_set, else for the first
    warmup_prompts prompts (first-use costs, page faults; and the adaptive policy's first measurements at
    that batch).

    adaptive: EngineConfig.adaptive for sd and ssd; None leaves the engine's default (and is what the
    result's "adaptive" records then, as for ar, which never speculates).
    """
    from ssd import LLM, SamplingParams, _C

    max_len = min(cfg.max_model_len, target.config.max_position_embeddings)
    kwargs = dict(mode=mode, max_model_len=max_len, max_batch=batch, target_threads=target_threads,
                  draft_threads=cfg.draft_threads, dtype=cfg.dtype, k=cfg.k, coupling=cfg.coupling)
    if mode == "ssd":
        kwargs.update(fanout=cfg.fanout, fanout_budget=cfg.fanout_budget, saguaro_c=cfg.saguaro_c,
                      fallback=cfg.fallback)
    if adaptive is not None and mode != "ar":
        kwargs["adaptive"] = adaptive
    with LLM(target, draft=None if mode == "ar" else draft, **kwargs) as llm:
        def params(i, n=cfg.max_tokens):
            return SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=cfg.seed + i)

        warm = list(warmup_set) if warmup_set is not None else prompts[:warmup_prompts]
        llm.generate(warm, [params(10_000 + i, warmup_tokens) for i in range(len(warm))])  # untimed
        before = llm.stats()
        decode_s = wall_s = 0.0
        decode_tokens = tokens = 0
        ttft, contexts, token_ids = [], [], []
        for g in tqdm(range(0, len(prompts), batch), desc=f"{label} {mode}", leave=False):
            group = prompts[g:g + batch]
            t0 = time.perf_counter()
            outs = llm.generate(group, [params(g + i) for i in range(len(group))])
            wall_s += time.perf_counter() - t0
            metrics = [o.metrics for o in outs]
            token_ids += [o.token_ids for o in outs]
            decode_s += max(m["finish_time"] for m in metrics) - min(m["time_to_first_token"] for m in metrics)
            decode_tokens += sum(m["generated_tokens"] - 1 for m in metrics)
            tokens += sum(m["generated_tokens"] for m in metrics)
            ttft += [m["time_to_first_token"] for m in metrics]
            contexts += [m["prompt_tokens"] + m["generated_tokens"] / 2 for m in metrics]
        after = llm.stats()
    # Only the summed counters have meaningful deltas; the core names them.
    counters = {key: after[key] - before[key] for key in _C.counter_names()}
    metrics = _C.speed_metrics(counters)
    return {"mode": mode, "batch_size": batch, "temperature": temperature, "k": cfg.k if mode != "ar" else 0,
            "coupling": cfg.coupling, "saguaro_c": cfg.saguaro_c if mode == "ssd" else None,
            "adaptive": kwargs.get("adaptive"),
            "target_threads": target_threads, "draft_threads": cfg.draft_threads if mode == "ssd" else 0,
            "placement": placement_name(mode, target_threads, cfg),
            "decode_tok_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            "e2e_tok_per_s": tokens / wall_s, "ttft_s": statistics.mean(ttft),
            "mean_context": statistics.mean(contexts), "counters": counters,
            # The adaptive policy's gauges as the run ended (its estimates; see docs/metrics.md).
            "policy": {key: value for key, value in after.items() if key.startswith("policy_")},
            "fanout": after.get("fanout"), "fanout_budget": after.get("fanout_budget"),
            "fanout_policy": (cfg.fanout if isinstance(cfg.fanout, str) else "list") if mode == "ssd" else None,
            "random_token_acceptance": after.get("random_token_acceptance", 0.0), "token_ids": token_ids,
            **metrics}


def placement_name(mode: str, target_threads: int, cfg: BenchConfig) -> str:
    if mode == "ssd":
        return f"target {target_threads} thr + draft {cfg.draft_threads} thr (own core)"
    if mode == "sd":
        return f"target+draft share {target_threads} thr"
    return f"target {target_threads} thr"


def _median_forward(runner, batch, all_logits=False, matmul_min_rows=0, repeats=5):
    """Median seconds of one forward appending `batch` (undone after each timing)."""
    times = []
    for _ in range(repeats):
        lengths = {sid: runner.length(sid) for sid, _ in batch}
        t = time.perf_counter()
        runner.extend(batch, all_logits, matmul_min_rows)
        times.append(time.perf_counter() - t)
        for sid, n in lengths.items():
            runner.truncate(sid, n)
    return statistics.median(times)


def components(target_core, draft_core, context: float, k: int, batch: int, tree_rows: int,
               target_threads: int, draft_threads: int, matmul_min_rows: int = 4) -> dict:
    """Isolated component times (seconds) at `context` tokens for `batch` sequences.

    As the engine runs them: a draft step of `batch` rows takes the bf16 pair
    kernels from `matmul_min_rows` rows (EngineConfig.draft_matmul_min_rows),
    the ssd tree (the fork forward over `batch` rows, steps over `tree_rows`)
    always does.
    """
    from ssd import _C

    vocab = target_core.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(max(1, int(context)))]
    out = {}
    blocks = (batch + 1) * (int(context) // 16 + 8)
    r = _C.SequenceRunner(target_core, blocks, 16, target_threads)
    ids = [r.add_sequence() for _ in range(batch)]
    r.extend([(i, prompt) for i in ids], False)
    out["t_ar"] = _median_forward(r, [(i, [11 % vocab]) for i in ids])
    out["t_verify"] = _median_forward(r, [(i, [t % vocab for t in range(20, 21 + k)]) for i in ids],
                                      all_logits=True)
    del r
    if draft_core is not None:
        rows = max(batch, tree_rows)
        r = _C.SequenceRunner(draft_core, (rows + 1) * (int(context) // 16 + 8), 16, draft_threads)
        ids = [r.add_sequence() for _ in range(rows)]
        r.extend([(i, prompt) for i in ids], False)
        out["t_draft"] = _median_forward(r, [(i, [11 % vocab]) for i in ids[:batch]],
                                         matmul_min_rows=matmul_min_rows)
        pairs = 1 if matmul_min_rows > 0 else 0
        out["t_fork"] = _median_forward(r, [(i, [11 % vocab]) for i in ids[:batch]], matmul_min_rows=pairs)
        out["t_tree"] = _median_forward(r, [(i, [11 % vocab]) for i in ids[:max(1, tree_rows)]],
                                        matmul_min_rows=pairs)
        out["tree_rows"] = max(1, tree_rows)
        del r
    return out


def predict(run: dict, c: dict, k: int) -> float:
    """The speed model's decode tok/s for a run, from isolated component times.

    The round costs are ``_C.predict_round``'s (the one statement of the model);
    this only turns the isolated times into its inputs, relative to one verify
    forward, and its speedup (tokens per sequence per AR step) into tok/s.
    """
    from ssd import _C

    b = run["batch_size"]
    if run["mode"] == "ar":
        return b / c["t_ar"]
    verify_cost = c["t_verify"] / c["t_ar"]
    if run["mode"] == "sd":
        round_ = _C.predict_round(e_hit=run["tokens_per_round"], t_p=k * c["t_draft"] / c["t_verify"],
                                  batch=b, verify_cost=verify_cost, overlapped=False)
        return b * round_["speedup"] / c["t_ar"]
    cnt = run["counters"]
    misses = cnt["fallback_neural"] + cnt["fallback_fast"]
    # A fast (n-gram) fallback costs no draft forwards; only the neural share waits for K draft steps.
    neural_share = cnt["fallback_neural"] / misses if misses else 1.0
    # The fork forward over the last proposal runs only when F_K > 0 (always under "confidence",
    # whose "fanout" is the last tree's branch counts, not a plan).
    fork_runs = run.get("fanout_policy") == "confidence" or not run.get("fanout") or run["fanout"][-1] > 0
    fork = c.get("t_fork", c["t_draft"]) if fork_runs else 0.0
    round_ = _C.predict_round(p_hit=run["cache_hit_rate"], e_hit=run["e_hit"], e_miss=run["e_miss"],
                              t_p=(fork + k * c["t_tree"]) / c["t_verify"],
                              t_b=neural_share * k * c["t_draft"] / c["t_verify"],
                              batch=b, verify_cost=verify_cost, overlapped=True)
    return b * round_["speedup"] / c["t_ar"]


def as_dict(cfg: BenchConfig) -> dict:
    return asdict(cfg)


def constructed_pair(acceptance: float, cost_ratio: float, progress: bool = True) -> dict:
    """Builds (or loads the cached) constructed regime pair; returns its description for the JSON."""
    from ssd.testing import regime_pair

    pair = regime_pair(acceptance=acceptance, cost_ratio=cost_ratio, progress=progress)
    return {"constructed": True, "label": "CONSTRUCTED regime pair (not a published model)",
            "target": str(pair.target), "draft": str(pair.draft), **pair.info}


def run_pair(cfg: BenchConfig, pair_info: dict, progress: bool = True) -> dict:
    """Every (dataset, batch, temperature, mode) combination on one pair, with isolated component times
    and the speed model's predictions; returns {"runs", "components_s", "peers"}."""
    from ssd import models

    target_path, draft_path = pair_info["target"], pair_info["draft"]
    # Which constructed pair a run belongs to (None for a given pair).
    regime = {"regime_acceptance": None, "regime_cost_ratio": None, "regime_agreement": None}
    if pair_info.get("constructed"):
        regime = {"regime_acceptance": pair_info["requested"]["acceptance"],
                  "regime_cost_ratio": pair_info["requested"]["cost_ratio"],
                  "regime_agreement": pair_info["measured"]["agreement"]}
    target = models.load(target_path, dtype=cfg.dtype)
    draft = models.load(draft_path, dtype=cfg.dtype)
    runs = []
    combos = [(d, b, t) for d in cfg.datasets for b in cfg.batches for t in cfg.temperatures]
    todo = []
    for d, b, t in combos:
        for mode in cfg.modes:
            todo.append((d, b, t, mode, cfg.target_threads))
        if cfg.same_total_hardware:
            for mode in ("ar", "sd"):
                if mode in cfg.modes:
                    todo.append((d, b, t, mode, cfg.target_threads + cfg.draft_threads))
    prompts_of = {d: load_prompts(d, cfg.num_prompts, target.tokenizer, cfg.seed, target.config.vocab_size)
                  for d in cfg.datasets}
    for d, b, t, mode, threads in tqdm(todo, desc="runs", disable=not progress):
        run = run_engine(target, draft, mode, prompts_of[d], cfg, b, t, threads, label=f"{d} b{b} T{t}")
        run["dataset"] = d
        run["same_total_hardware"] = threads != cfg.target_threads
        run.update(regime)
        runs.append(run)
    # Component times in isolation, per batch size, at the mean context of the runs.
    context = statistics.mean(r["mean_context"] for r in runs)
    comp = {}
    for b in tqdm(cfg.batches, desc="components", disable=not progress):
        ssd_runs = [r for r in runs if r["mode"] == "ssd" and r["batch_size"] == b]
        rows = max((round(r["counters"]["tree_branches"] / max(1, r["counters"]["draft_rounds"])) for r in ssd_runs),
                   default=1)
        comp[b] = components(target.core_model(), draft.core_model(), context, cfg.k, b, rows,
                             cfg.target_threads, cfg.draft_threads)
    for r in runs:
        if r["same_total_hardware"]:
            r["predicted_tok_per_s"] = None
            continue
        r["predicted_tok_per_s"] = predict(r, comp[r["batch_size"]], cfg.k)
    # Temperature 0: every mode must give ar's tokens (exactness, checked on the benchmark's own prompts).
    for r in runs:
        ar = next((a for a in runs if a["mode"] == "ar" and a["dataset"] == r["dataset"]
                   and a["batch_size"] == r["batch_size"] and a["temperature"] == r["temperature"]), None)
        r["same_tokens_as_ar"] = (r["token_ids"] == ar["token_ids"]) if ar and r["temperature"] == 0 else None
    for r in runs:
        del r["token_ids"]
    # Speedups over ar with the same target hardware, measured and predicted.
    for r in runs:
        ar = next((a for a in runs if a["mode"] == "ar" and not a["same_total_hardware"]
                   and (a["dataset"], a["batch_size"], a["temperature"]) == (r["dataset"], r["batch_size"], r["temperature"])),
                  None)
        r["measured_speedup"] = r["decode_tok_per_s"] / ar["decode_tok_per_s"] if ar else None
        r["predicted_speedup_isolated"] = (r["predicted_tok_per_s"] / ar["predicted_tok_per_s"]
                                           if ar and r["predicted_tok_per_s"] else None)
    peers = []
    if "hf" in cfg.peers:
        from .peers import run_hf_peers

        for d in cfg.datasets:
            for t in cfg.temperatures:
                peers += [{**p, "dataset": d, **regime}
                          for p in run_hf_peers(target_path, draft_path, prompts_of[d], cfg, t)]
    return {"runs": runs, "components_s": {str(b): c for b, c in comp.items()}, "peers": peers}


def sweep_summary(runs: list[dict], parameter: str) -> list[dict]:
    """The sweep's points: one per (swept value, dataset, batch, temperature) with an ssd run on the
    target's own hardware. ssd_over_sd and ssd_over_best (over the faster of ar and sd) divide measured
    decode tok/s; the predicted_* ratios divide the speed model's tok/s of the same runs. A ratio whose
    reference run is missing (a mode left out) is None."""
    groups: dict[tuple, dict] = {}
    for r in runs:
        if not r["same_total_hardware"]:
            key = (r[f"regime_{parameter}"], r["dataset"], r["batch_size"], r["temperature"])
            groups.setdefault(key, {})[r["mode"]] = r

    def ratio(num, den):
        return num / den if num is not None and den else None

    points = []
    for (value, dataset, batch, temperature), by_mode in sorted(groups.items()):
        ssd, sd, ar = by_mode.get("ssd"), by_mode.get("sd"), by_mode.get("ar")
        if ssd is None:
            continue
        measured = {m: r["decode_tok_per_s"] for m, r in by_mode.items()}
        predicted = {m: r.get("predicted_tok_per_s") for m, r in by_mode.items()}
        best = pred_best = None
        if ar and sd:
            best = max(("ar", "sd"), key=lambda m: measured[m])
            pred_best = max(("ar", "sd"), key=lambda m: predicted[m] or 0.0)
        points.append({
            "value": value, "dataset": dataset, "batch_size": batch, "temperature": temperature,
            "regime_acceptance": ssd["regime_acceptance"], "regime_cost_ratio": ssd["regime_cost_ratio"],
            "regime_agreement": ssd["regime_agreement"],
            "ssd_over_sd": ratio(measured["ssd"], measured.get("sd")),
            "ssd_over_best": ratio(measured["ssd"], measured.get(best)),
            "best_mode": best,
            "predicted_ssd_over_sd": ratio(predicted["ssd"], predicted.get("sd")),
            "predicted_ssd_over_best": ratio(predicted["ssd"], predicted.get(pred_best)),
            "predicted_best_mode": pred_best,
            "decode_tok_per_s": measured, "predicted_tok_per_s": predicted,
            "ssd_acceptance_rate": ssd.get("acceptance_rate"), "ssd_cache_hit_rate": ssd.get("cache_hit_rate"),
            "sd_acceptance_rate": sd.get("acceptance_rate") if sd else None,
        })
    return points


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    """Runs every (dataset, batch, temperature, mode) combination; returns the JSON document.

    With a regime sweep (one of cfg.regime_acceptance / cfg.regime_cost_ratio a list of several values)
    it does so on each constructed pair in turn: "pair" gives way to "pairs" (each with its component
    times) and "sweep" summarizes SSD against SD and the best of AR and SD per point."""
    cfg.validate()
    sweep = cfg.sweep()
    if sweep is None:
        if cfg.target is None:
            acceptance, cost_ratio = (_values(x)[0] for x in (cfg.regime_acceptance, cfg.regime_cost_ratio))
            pair_info = constructed_pair(acceptance, cost_ratio, progress)
        else:
            pair_info = {"constructed": False, "target": cfg.target, "draft": cfg.draft}
        part = run_pair(cfg, pair_info, progress)
        return {"pair": pair_info, "config": as_dict(cfg), "components_s": part["components_s"],
                "runs": part["runs"], "peers": part["peers"], "machine": machine()}
    parameter, values = sweep
    fixed = ("cost_ratio", _values(cfg.regime_cost_ratio)[0]) if parameter == "acceptance" else \
        ("acceptance", _values(cfg.regime_acceptance)[0])
    pairs, runs, peers = [], [], []
    for value in tqdm(values, desc=f"{parameter} sweep", disable=not progress):
        point = {parameter: value, fixed[0]: fixed[1]}
        pair_info = constructed_pair(point["acceptance"], point["cost_ratio"], progress)
        part = run_pair(cfg, pair_info, progress)
        pairs.append({**pair_info, "components_s": part["components_s"]})
        runs += part["runs"]
        peers += part["peers"]
        gc.collect()  # the previous pair's models (a target of several GB) before loading the next
    return {"pairs": pairs, "config": as_dict(cfg), "runs": runs, "peers": peers, "machine": machine(),
            "sweep": {"parameter": parameter, "values": values, "fixed": {fixed[0]: fixed[1]},
                      "points": sweep_summary(runs, parameter)}}
