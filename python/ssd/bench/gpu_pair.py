"""The constructed draft/target pair of ``python -m ssd.bench gpu``, made on the device.

The draft is a generated model (random weights; Llama-3.2-1B-shaped for
``--shapes llama``). The target is the draft's layers followed by BALLAST
layers and then ``PERTURBING_LAYERS`` PERTURBING layers, as
``ssd.testing.regime_pair`` builds its CPU pair (``ssd.testing._construct``):
every appended layer copies one of the draft's last layers with random
``o_proj`` and ``down_proj``, at ``BALLAST_SCALE`` for ballast (near-identity
layers that add weight bytes) and at a calibrated ``eps`` for the perturbing
layers (which set how often the target's argmax agrees with the draft's).
The target therefore has the draft's shapes (hidden 2048, ...) and many more
layers: as many as make its weight bytes closest to the reference target's
(Llama-3.1-8B's for ``llama``; ``layer_plan``).

Agreement is the teacher-forced greedy top-1 agreement: the fraction of
positions of random-token prompts where argmax(draft logits) equals
argmax(target logits). ``calibrate`` bisects log(eps) with a torch forward
that runs the draft's and the ballast layers once and only the perturbing
layers per step; ``engine_agreement`` measures the built pair with the
engine's own forward on other prompts.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ssd.models import LoadedModel, ModelConfig
from ssd.testing import _construct as construct
from ssd.testing.regime import PERTURBING_LAYERS

EPS_RANGE = (1e-3, 8.0)  # where calibration bisects log(eps)
TOLERANCE = 0.01  # calibration stops within this of the requested agreement
MAX_STEPS = 10
CALIBRATION_SEED = 1
MEASURE_SEED = 2  # the engine's measurement uses other prompts than the calibration


def weight_params(config: ModelConfig) -> int:
    """Parameters of a Llama model's weights: layers, final norm, embedding
    and (untied) head."""
    head = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    return construct.model_cost(config, config.num_layers) + head


def layer_plan(draft: ModelConfig, reference: ModelConfig) -> construct.LayerPlan:
    """The target's layers: the draft's, then ballast, then PERTURBING_LAYERS,
    with as many ballast layers as make the target's weight bytes closest to
    `reference`'s (same dtype). The target ties its embeddings as the draft
    does, so its weight parameters are ``model_cost(draft, layers)``, the
    quantity ``ballast_count`` matches."""
    if not draft.tie_word_embeddings:
        raise ValueError("the draft must tie its embeddings (the target reuses its head)")
    cost_ratio = construct.model_cost(draft, draft.num_layers) / weight_params(reference)
    n_ballast = construct.ballast_count(draft, PERTURBING_LAYERS, cost_ratio)
    return construct.LayerPlan(draft.num_layers, n_ballast, PERTURBING_LAYERS)


def appended_layer(draft: LoadedModel, layer: construct.AppendedLayer, seed: int, scale: float
                   ) -> dict[str, torch.Tensor]:
    """Full names -> tensors of one appended layer, in the draft's dtype and on its device."""
    dtype = draft.weights["model.embed_tokens.weight"].dtype
    return {f"model.layers.{layer.index}.{key}": t.to(dtype)
            for key, t in construct.layer_weights(draft.weights, layer, seed, scale).items()}


def random_prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def build_target(draft: LoadedModel, plan: construct.LayerPlan, seed: int, agreement: float,
                 prompts: list[list[int]]) -> tuple[LoadedModel, dict]:
    """The target of `plan` over `draft` (which must hold its weights), with
    the perturbing layers' eps calibrated to `agreement` on `prompts`; the
    target and the calibration's record (``calibrate``). The target's tensors
    of the draft's layers are the draft's own (shared, not copied)."""
    weights = dict(draft.weights)
    appended = plan.appended()
    for layer in appended:
        if layer.kind == "ballast":
            weights.update(appended_layer(draft, layer, seed, construct.BALLAST_SCALE))
    calib = calibrate(draft, weights, plan, seed, agreement, prompts)
    for layer in appended:
        if layer.kind == "perturb":
            weights.update(appended_layer(draft, layer, seed, calib["eps"]))
    config = dataclasses.replace(draft.config, num_layers=plan.n_total)
    target = dataclasses.replace(draft, config=config, weights=weights, source="constructed:" + draft.name,
                                 name=draft.name + "+appended")
    return target, calib


def calibrate(draft: LoadedModel, weights: dict[str, torch.Tensor], plan: construct.LayerPlan, seed: int,
              agreement: float, prompts: list[list[int]]) -> dict:
    """Bisects log(eps) in EPS_RANGE until the agreement on `prompts` is within
    TOLERANCE of `agreement` (at most MAX_STEPS). `weights` holds the draft's
    and the ballast layers. Returns eps (the step closest to the request), its
    agreement, the positions scored and every step."""
    fwd = construct.TorchForward(draft.config, draft.weights)
    with torch.no_grad():
        states = [fwd.embed_ids(ids) for ids in prompts]  # each [T, hidden] fp32
        for i in range(plan.n_base + plan.n_ballast):
            w = construct.base_layer_weights(weights, i)
            states = [fwd.layer(x, w) for x in states]
            if i == plan.n_base - 1:
                draft_top = torch.cat([fwd.logits(x).argmax(-1) for x in states])
        perturb = [layer for layer in plan.appended() if layer.kind == "perturb"]

        def measure(eps: float) -> float:
            ys = states
            for layer in perturb:
                full = appended_layer(draft, layer, seed, eps)
                ys = [fwd.layer(y, construct.base_layer_weights(full, layer.index)) for y in ys]
            top = torch.cat([fwd.logits(y).argmax(-1) for y in ys])
            return float((top == draft_top).float().mean())

        lo, hi = (math.log(e) for e in EPS_RANGE)
        steps = []
        for _ in range(MAX_STEPS):
            eps = math.exp((lo + hi) / 2)
            steps.append({"eps": eps, "agreement": measure(eps)})
            if abs(steps[-1]["agreement"] - agreement) <= TOLERANCE:
                break
            if steps[-1]["agreement"] > agreement:
                lo = math.log(eps)  # too close to the draft: perturb more
            else:
                hi = math.log(eps)
    best = min(steps, key=lambda s: abs(s["agreement"] - agreement))
    return {"eps": best["eps"], "agreement": best["agreement"], "positions": int(draft_top.numel()),
            "steps": steps}


def engine_agreement(draft_core, target_core, prompts: list[list[int]]) -> float:
    """Teacher-forced top-1 agreement of two engine models (``ssd._C.Model``) over every position of `prompts`."""
    from ssd.models.core import sequence_logits

    same = total = 0
    for ids in prompts:
        top_d = sequence_logits(draft_core, ids).argmax(-1)
        top_t = sequence_logits(target_core, ids).argmax(-1)
        same += int((top_d == top_t).sum())
        total += top_d.numel()
    return same / total


def agreement_on_text(draft_core, prompt: list[int], tokens: list[int]) -> tuple[int, int]:
    """(positions where the draft's argmax is the next of `tokens`, len(tokens)), teacher-forced
    on prompt + tokens: with `tokens` the target's greedy output, what greedy sd verifies."""
    from ssd.models.core import sequence_logits

    top = sequence_logits(draft_core, prompt + tokens[:-1])[len(prompt) - 1:].argmax(-1)
    return int((top == torch.tensor(tokens, device=top.device)).sum()), len(tokens)
