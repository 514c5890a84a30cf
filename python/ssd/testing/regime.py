"""``regime_pair``: a constructed draft/target pair in the paper's regime.

From SmolLM2-135M-Instruct: draft = the model as shipped; target = the same
model with near-zero BALLAST layers appended (cost) and then a few PERTURBING
layers (agreement), see ``_construct``. Both are written as ordinary HF
directories (fp32 safetensors) under
``<cache>/regime/a{acceptance}-c{cost_ratio}-s{seed}/{draft,target}`` with a
``pair.json`` describing how the pair was made and what was measured.

Cost: cost(model) = layers * layer_params + head_params (parameters read per
decoded token); n_ballast is chosen so that cost(draft) / cost(target) is
closest to ``cost_ratio`` (``_construct.ballast_count``).

Agreement: teacher-forced top-1 agreement = the fraction of positions where
argmax(draft logits) == argmax(target logits), over the positions that predict
the draft's own greedy continuation of a few chat-rendered MT-bench and
HumanEval prompts (the positions greedy speculative decoding verifies). The
perturbation scale ``eps`` is bisected (in log space) until the agreement is
within ``_TOLERANCE`` of the request; it is then re-measured with the C++
engine on the written directories.

The pair is labelled ``"constructed": true``: it has the cost and acceptance
structure of a real pair, not the behaviour of any published model.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ssd import assets
from ssd.models import LoadedModel
from ssd.models import load as load_model

from . import _construct as construct
from ._hf_dir import write_hf_dir

logger = logging.getLogger(__name__)

PERTURBING_LAYERS = 8
# Open intervals of the requests regime_pair accepts.
ACCEPTANCE_RANGE = (0.3, 0.99)
COST_RATIO_RANGE = (0.05, 0.9)
_EPS_RANGE = (1e-3, 8.0)
_TOLERANCE = 0.01
_MAX_ITERATIONS = 8
_CONTINUATION_TOKENS = 96
_THREADS = 2
COHERENCE_PROMPTS = (
    "What is the capital of France? Answer in two sentences.",
    "Give me three tips for staying focused while studying.",
)


@dataclass(frozen=True)
class RegimePair:
    """A built pair: its directory, the two model directories and ``pair.json``."""

    root: Path
    draft: Path
    target: Path
    info: dict

    @property
    def measured_agreement(self) -> float:
        return self.info["measured"]["agreement"]


def calibration_prompts() -> list[str]:
    """The fixed prompts whose draft continuations calibrate eps."""
    return assets.mtbench_prompts(3) + assets.humaneval_prompts(3)


def regime_pair(acceptance: float = 0.75, cost_ratio: float = 0.25,
                cache_dir: str | os.PathLike | None = None, *, seed: int = 0,
                progress: bool = True) -> RegimePair:
    """Builds (or returns the cached) constructed pair.

    Args:
        acceptance: requested teacher-forced top-1 agreement, in (0.3, 0.99).
        cost_ratio: requested cost(draft) / cost(target), in (0.05, 0.9).
        cache_dir: cache root (default: ``ssd.assets.cache_root()``).
        seed: seeds the random replaced weights.
        progress: show tqdm progress bars.

    Raises:
        ValueError: for arguments out of range.
        OSError: when the cache has too little free disk space.
    """
    _check_args(acceptance, cost_ratio, seed)
    root = assets.cache_root(cache_dir) / "regime" / f"a{acceptance:g}-c{cost_ratio:g}-s{seed}"
    cached = _cached(root)
    if cached is not None:
        return cached
    return _build(root, float(acceptance), float(cost_ratio), seed, cache_dir, progress)


def _check_args(acceptance, cost_ratio, seed) -> None:
    for name, value, (lo, hi) in (("acceptance", acceptance, ACCEPTANCE_RANGE),
                                  ("cost_ratio", cost_ratio, COST_RATIO_RANGE)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo < value < hi:
            raise ValueError(f"{name}: must be a number in ({lo}, {hi}), got {value!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")


def _cached(root: Path) -> RegimePair | None:
    info_path = root / "pair.json"
    if not info_path.is_file():
        return None
    info = json.loads(info_path.read_text(encoding="utf-8"))
    return RegimePair(root, root / "draft", root / "target", info)


# ------------------------------------------------------------------ build


def _build(root: Path, acceptance: float, cost_ratio: float, seed: int,
           cache_dir, progress: bool) -> RegimePair:
    from tqdm.auto import tqdm

    started = time.perf_counter()
    stages = tqdm(total=6, desc="regime pair", unit="stage", disable=not progress)
    stages.set_postfix_str("loading SmolLM2")
    gguf = assets.smollm2_gguf_path(cache_dir)
    base = load_model(gguf)
    config = base.config
    plan = construct.LayerPlan(config.num_layers,
                               construct.ballast_count(config, PERTURBING_LAYERS, cost_ratio),
                               PERTURBING_LAYERS)
    staging = root.with_name(f".{root.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _check_disk(staging, config, plan)
    stages.update()

    stages.set_postfix_str("writing draft")
    draft_dir = staging / "draft"
    write_hf_dir(draft_dir, base, config.num_layers,
                 ((n, (lambda t=t: t), tuple(t.shape)) for n, t in base.weights.items()))
    texts = agreement_text(draft_dir, calibration_prompts())
    stages.update()

    stages.set_postfix_str("calibrating eps")
    calib = _calibrate(base, plan, seed, texts, acceptance, progress)
    stages.update()

    stages.set_postfix_str("writing target")
    target_dir = staging / "target"
    n_tensors = len(base.weights) + 9 * (plan.n_ballast + plan.n_perturb)
    with tqdm(total=n_tensors, desc="target tensors", leave=False, disable=not progress) as bar:
        write_hf_dir(target_dir, base, plan.n_total,
                     construct.target_tensors(base.weights, config, plan, seed, calib["eps"]),
                     bar.update)
    del base
    stages.update()

    stages.set_postfix_str("measuring with the engine")
    measured = _measure(draft_dir, target_dir, texts)
    stages.update()

    stages.set_postfix_str("checking coherence")
    coherence = {"target": chat_samples(target_dir), "draft": chat_samples(draft_dir)}
    stages.update()
    stages.close()

    info = _pair_info(acceptance, cost_ratio, seed, gguf, config, plan, calib, measured, coherence)
    info["build_seconds"] = round(time.perf_counter() - started, 1)
    if not info["coherence"]["target_coherent"]:
        logger.warning("regime pair %s: the target's greedy chat replies look incoherent "
                       "(see pair.json 'coherence'); agreement may be inflated by repetition",
                       root.name)
    (staging / "pair.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(root, ignore_errors=True)  # a partial or stale build
    staging.rename(root)
    logger.info("regime pair %s built in %.0f s", root.name, info["build_seconds"])
    return RegimePair(root, root / "draft", root / "target", info)


def _check_disk(where: Path, config, plan: construct.LayerPlan) -> None:
    need = 4 * (construct.model_cost(config, config.num_layers)
                + construct.model_cost(config, plan.n_total)) * 1.05
    free = shutil.disk_usage(where).free
    if free < need:
        raise OSError(f"regime pair needs ~{need / 2**30:.1f} GiB under {where.parent}, "
                      f"only {free / 2**30:.1f} GiB free")


def _calibrate(base: LoadedModel, plan: construct.LayerPlan, seed: int,
               texts: list[tuple[list[int], int]], acceptance: float, progress: bool) -> dict:
    """Bisects log(eps) on the torch forward; returns eps, agreement and the history."""
    from tqdm.auto import tqdm

    fwd = construct.TorchForward(base.config, base.weights)
    appended = plan.appended()
    ballast = [layer for layer in appended if layer.kind == "ballast"]
    perturb = [layer for layer in appended if layer.kind == "perturb"]
    with torch.no_grad():
        states = [fwd.embed_ids(ids) for ids, _ in texts]
        layers = [("base", i) for i in range(plan.n_base)] + [("ballast", l) for l in ballast]
        draft_top = None
        for kind, layer in tqdm(layers, desc="base+ballast pass", leave=False, disable=not progress):
            w = (construct.base_layer_weights(base.weights, layer) if kind == "base"
                 else construct.layer_weights(base.weights, layer, seed, construct.BALLAST_SCALE))
            states = [fwd.layer(x, w) for x in states]
            if kind == "base" and layer == plan.n_base - 1:
                draft_top = _scored_argmax(fwd, states, texts)
        unit = [construct.layer_weights(base.weights, layer, seed, 1.0) for layer in perturb]

        def agreement(eps: float) -> float:
            ys = states
            for w in unit:
                scaled = {k: (v * eps if k in ("self_attn.o_proj.weight", "mlp.down_proj.weight") else v)
                          for k, v in w.items()}
                ys = [fwd.layer(y, scaled) for y in ys]
            top = _scored_argmax(fwd, ys, texts)
            return float((top == draft_top).float().mean())

        lo, hi = (math.log(e) for e in _EPS_RANGE)
        history = []
        bar = tqdm(range(_MAX_ITERATIONS), desc="calibrating eps", leave=False, disable=not progress)
        for _ in bar:
            eps = math.exp((lo + hi) / 2)
            a = agreement(eps)
            history.append({"eps": eps, "agreement": a})
            bar.set_postfix(eps=f"{eps:.4g}", agreement=f"{a:.3f}")
            if abs(a - acceptance) <= _TOLERANCE:
                break
            if a > acceptance:
                lo = math.log(eps)
            else:
                hi = math.log(eps)
        bar.close()
    best = min(history, key=lambda h: abs(h["agreement"] - acceptance))
    if abs(best["agreement"] - acceptance) > 0.05:
        logger.warning("eps calibration reached agreement %.3f for a request of %.3f",
                       best["agreement"], acceptance)
    return {"eps": best["eps"], "agreement": best["agreement"], "history": history,
            "positions": int(draft_top.numel())}


def _scored_argmax(fwd: construct.TorchForward, states: list[torch.Tensor],
                   texts: list[tuple[list[int], int]]) -> torch.Tensor:
    """Argmax at the positions that predict the continuation, all texts concatenated."""
    return torch.cat([fwd.logits(x[start - 1:-1]).argmax(-1) for x, (_, start) in zip(states, texts)])


def _measure(draft_dir: Path, target_dir: Path, texts) -> dict:
    draft = load_model(draft_dir)
    target = load_model(target_dir)
    for model in (draft, target):
        model.core_model()
        model.weights.clear()  # the core holds its own copy
    return {"agreement": top1_agreement(draft, target, texts),
            "positions": sum(len(ids) - start for ids, start in texts)}


# ----------------------------------------------------- agreement, coherence


def agreement_text(draft_dir: str | os.PathLike, prompts: list[str],
                   max_new_tokens: int = _CONTINUATION_TOKENS) -> list[tuple[list[int], int]]:
    """Chat-rendered prompts plus the draft's greedy continuation.

    Returns [(token_ids, start)]: positions ``start-1 .. len-2`` predict the
    continuation ``token_ids[start:]``.
    """
    from ssd import LLM, SamplingParams

    llm = LLM(str(draft_dir), max_model_len=2048, target_threads=_THREADS)
    try:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=max_new_tokens))
    finally:
        llm.shutdown()
    return [(list(o.prompt_token_ids) + list(o.token_ids), len(o.prompt_token_ids))
            for o in outs if o.token_ids]


def top1_agreement(draft: LoadedModel, target: LoadedModel,
                   texts: list[tuple[list[int], int]], threads: int = _THREADS) -> float:
    """Teacher-forced top-1 agreement over the continuation positions (C++ engine)."""
    from ssd.models.core import sequence_logits

    same = total = 0
    for ids, start in texts:
        top_d = sequence_logits(draft.core_model(), ids, num_threads=threads)[start - 1:-1].argmax(-1)
        top_t = sequence_logits(target.core_model(), ids, num_threads=threads)[start - 1:-1].argmax(-1)
        same += int((top_d == top_t).sum())
        total += top_d.numel()
    return same / total


def chat_samples(model_dir: str | os.PathLike, prompts=COHERENCE_PROMPTS,
                 max_tokens: int = 64) -> list[dict]:
    """Greedy chat replies with a crude coherence measure each."""
    from ssd import LLM, SamplingParams

    llm = LLM(str(model_dir), max_model_len=512, target_threads=_THREADS)
    try:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        llm.shutdown()
    return [{"prompt": p, "text": o.text, **coherence_measure(o.text, list(o.token_ids))}
            for p, o in zip(prompts, outs)]


def coherence_measure(text: str, token_ids: list[int]) -> dict:
    """Fraction of ASCII letters/spaces, distinct-token fraction, longest same-token run."""
    letters = sum(1 for c in text if c.isascii() and (c.isalpha() or c == " "))
    run = longest = 0
    for i, t in enumerate(token_ids):
        run = run + 1 if i and t == token_ids[i - 1] else 1
        longest = max(longest, run)
    distinct = len(set(token_ids)) / max(1, len(token_ids))
    ascii_fraction = letters / max(1, len(text))
    return {"ascii_letter_space_fraction": round(ascii_fraction, 3),
            "distinct_token_fraction": round(distinct, 3), "longest_token_run": longest,
            "coherent": ascii_fraction >= 0.6 and distinct >= 0.3 and longest < 5}


def _pair_info(acceptance, cost_ratio, seed, gguf: Path, config, plan, calib, measured,
               coherence) -> dict:
    draft_cost = construct.model_cost(config, plan.n_base)
    target_cost = construct.model_cost(config, plan.n_total)
    return {
        "constructed": True,
        "description": ("draft = SmolLM2-135M-Instruct as shipped; target = the same model with "
                        "ballast then perturbing layers appended (copies of its last layers with "
                        "random o_proj/down_proj); not a published model"),
        "seed": seed,
        "source": {"gguf": gguf.name, "sha256_prefix": _sha256(gguf)[:16]},
        "requested": {"acceptance": acceptance, "cost_ratio": cost_ratio},
        "measured": {"agreement": measured["agreement"], "positions": measured["positions"],
                     "method": "teacher-forced top-1 agreement on the draft's greedy "
                               "continuations of the calibration prompts, C++ engine"},
        "eps": calib["eps"],
        "ballast_scale": construct.BALLAST_SCALE,
        "layers": {"base": plan.n_base, "ballast": plan.n_ballast, "perturb": plan.n_perturb,
                   "total": plan.n_total, "source_window": construct.SOURCE_WINDOW,
                   "order": "base, ballast, perturb"},
        "cost": {"draft_params": draft_cost, "target_params": target_cost,
                 "ratio_by_params": draft_cost / target_cost,
                 "formula": "cost = n_layers * layer_params + vocab * hidden (+ final norm); "
                            "n_ballast = round((cost_draft / cost_ratio - cost_draft) / "
                            "layer_params) - n_perturb"},
        "calibration": {"iterations": calib["history"], "agreement_torch": calib["agreement"],
                        "positions": calib["positions"], "tolerance": _TOLERANCE,
                        "prompts": "mtbench[0:3] + humaneval[0:3]",
                        "continuation_tokens": _CONTINUATION_TOKENS},
        "coherence": {**coherence,
                      "target_coherent": all(s["coherent"] for s in coherence["target"])},
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
