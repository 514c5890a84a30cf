"""Layer plan and weights of the constructed target, plus a small torch forward.

The target is the base model's layers ``0 .. n_base-1`` followed by
``n_ballast`` BALLAST layers and then ``n_perturb`` PERTURBING layers. Every
appended layer is a copy of one of the base model's last ``SOURCE_WINDOW``
layers (cycling) whose ``o_proj`` and ``down_proj`` are replaced by seeded
Gaussian weights at ``scale`` times the replaced tensor's std: with both output
projections random, the layer adds only noise to the residual stream, so
``scale`` sets how far the output moves. Ballast uses ``BALLAST_SCALE``
(near-identity layers that add cost), perturbing layers the calibrated ``eps``.

Ballast comes first so that calibration can compute the residual stream after
it once and re-run only the perturbing layers for each ``eps``.

The torch forward here serves calibration only (speed: one pass through the
ballast for all iterations); the pair's recorded agreement is re-measured with
the C++ engine on the written directories.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ssd.models import ModelConfig

SOURCE_WINDOW = 4
BALLAST_SCALE = 0.002
_REPLACED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
_LAYER_KEYS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
               "self_attn.v_proj.weight", "self_attn.o_proj.weight",
               "post_attention_layernorm.weight", "mlp.gate_proj.weight",
               "mlp.up_proj.weight", "mlp.down_proj.weight")


@dataclass(frozen=True)
class AppendedLayer:
    """One appended layer: its index in the target, the base layer it copies, its kind."""

    index: int
    source: int
    kind: str  # "ballast" or "perturb"


@dataclass(frozen=True)
class LayerPlan:
    n_base: int
    n_ballast: int
    n_perturb: int

    @property
    def n_total(self) -> int:
        return self.n_base + self.n_ballast + self.n_perturb

    def appended(self) -> list[AppendedLayer]:
        first_source = self.n_base - min(SOURCE_WINDOW, self.n_base)
        window = self.n_base - first_source
        layers = []
        for j in range(self.n_ballast + self.n_perturb):
            kind = "ballast" if j < self.n_ballast else "perturb"
            layers.append(AppendedLayer(self.n_base + j, first_source + j % window, kind))
        return layers


def layer_params(config: ModelConfig) -> int:
    """Parameters of one decoder layer (norms included, biases ignored: Llama has none)."""
    h, i = config.hidden_size, config.intermediate_size
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    return h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h


def head_params(config: ModelConfig) -> int:
    """Parameters read by the output head per token (embedding lookups cost ~nothing)."""
    return config.vocab_size * config.hidden_size


def model_cost(config: ModelConfig, n_layers: int) -> int:
    """Cost proxy of one decode step: parameters read = layers + head (+ final norm)."""
    return n_layers * layer_params(config) + head_params(config) + config.hidden_size


def ballast_count(config: ModelConfig, n_perturb: int, cost_ratio: float) -> int:
    """Ballast layers making cost(draft) / cost(target) closest to ``cost_ratio``.

    cost(target) = cost(draft) + (n_perturb + n_ballast) * layer_params, so
    n_ballast = round((cost(draft) / cost_ratio - cost(draft)) / layer_params) - n_perturb,
    at least 0.
    """
    draft = model_cost(config, config.num_layers)
    extra = (draft / cost_ratio - draft) / layer_params(config)
    return max(0, round(extra) - n_perturb)


def _noise_seed(seed: int, layer_index: int, slot: int) -> int:
    return (seed * 1_000_003 + layer_index * 17 + slot) % (2**63)


def replaced_weight(original: torch.Tensor, seed: int, layer_index: int, slot: int,
                    scale: float) -> torch.Tensor:
    """Seeded Gaussian with ``scale`` x the std of ``original`` (same shape and
    device, fp32). The draws come from ``original``'s device's generator, so a
    seed gives different (equally seeded) weights on the CPU and on a GPU."""
    gen = torch.Generator(device=original.device).manual_seed(_noise_seed(seed, layer_index, slot))
    noise = torch.randn(original.shape, generator=gen, dtype=torch.float32, device=original.device)
    return noise.mul_(scale * float(original.float().std()))


def layer_weights(base: dict[str, torch.Tensor], layer: AppendedLayer, seed: int,
                  scale: float) -> dict[str, torch.Tensor]:
    """Short keys (``self_attn.q_proj.weight``, ...) -> tensors of an appended layer."""
    src = f"model.layers.{layer.source}."
    out = {}
    for key in _LAYER_KEYS:
        if key in _REPLACED:
            out[key] = replaced_weight(base[src + key], seed, layer.index, _REPLACED.index(key), scale)
        else:
            out[key] = base[src + key]
    return out


def target_tensors(base: dict[str, torch.Tensor], config: ModelConfig, plan: LayerPlan,
                   seed: int, eps: float
                   ) -> Iterator[tuple[str, Callable[[], torch.Tensor], tuple[int, ...]]]:
    """(name, make_tensor, shape) for every tensor of the target, made lazily.

    Appended layers are generated when their first tensor is asked for, so at
    most one appended layer is held at a time.
    """
    for name, tensor in base.items():
        yield name, (lambda t=tensor: t), tuple(tensor.shape)
    cache: dict[int, dict[str, torch.Tensor]] = {}
    for layer in plan.appended():
        scale = BALLAST_SCALE if layer.kind == "ballast" else eps

        def make(key: str, layer=layer, scale=scale) -> torch.Tensor:
            if layer.index not in cache:
                cache.clear()
                cache[layer.index] = layer_weights(base, layer, seed, scale)
            return cache[layer.index][key]

        for key in _LAYER_KEYS:
            shape = tuple(base[f"model.layers.{layer.source}.{key}"].shape)
            yield f"model.layers.{layer.index}.{key}", (lambda k=key, m=make: m(k)), shape


# ------------------------------------------------------------- torch forward


class TorchForward:
    """A plain Llama forward over one sequence (HF conventions), for calibration.

    Activations are fp32 on the weights' device; a weight of another dtype
    (bf16) is cast to fp32 for each product, as the engine computes.
    """

    def __init__(self, config: ModelConfig, base: dict[str, torch.Tensor]):
        if config.architecture != "LlamaForCausalLM" or config.rope_scaling is not None:
            raise ValueError("regime pairs are built from Llama models without rope scaling")
        self.config = config
        self.embed = base["model.embed_tokens.weight"]
        self.head = base.get("lm_head.weight", self.embed)
        self.final_norm = base["model.norm.weight"]

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        """ids: [T] -> hidden [T, hidden]."""
        index = torch.tensor(ids, dtype=torch.long, device=self.embed.device)
        return self.embed[index].to(torch.float32, copy=True)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> logits [T, vocab]."""
        return _mm(self._rms(x, self.final_norm), self.head)

    def layer(self, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        """One decoder layer on hidden [T, hidden] (w: short keys as in ``layer_weights``)."""
        c = self.config
        T = x.shape[0]
        h = self._rms(x, w["input_layernorm.weight"])
        q = _mm(h, w["self_attn.q_proj.weight"]).view(T, c.num_heads, c.head_dim).transpose(0, 1)
        k = _mm(h, w["self_attn.k_proj.weight"]).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = _mm(h, w["self_attn.v_proj.weight"]).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        cos, sin = self._rope(T, x.device)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        group = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + _mm(attn.transpose(0, 1).reshape(T, -1), w["self_attn.o_proj.weight"])
        h = self._rms(x, w["post_attention_layernorm.weight"])
        mlp = F.silu(_mm(h, w["mlp.gate_proj.weight"])) * _mm(h, w["mlp.up_proj.weight"])
        return x + _mm(mlp, w["mlp.down_proj.weight"])

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps) * weight

    def _rope(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        freqs = torch.arange(T, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, in] @ weight [out, in].T in x's dtype -> [T, out]."""
    return x @ weight.to(x.dtype).T


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def base_layer_weights(base: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    return {key: base[f"model.layers.{index}.{key}"] for key in _LAYER_KEYS}
