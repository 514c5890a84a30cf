"""Vocabulary padding: logit rows past the tokenizer are cut (LoadedModel.drop_vocab_padding).

A target and a draft share one tokenizer of N_IDS tokens but have 160 and 128
embedding / lm_head rows, and their padding rows are built to win every
argmax (and all but all of the probability): the engine must never sample
them, in ar, sd and ssd alike, and the pair must be accepted.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models as tk_models
from tokenizers import pre_tokenizers

from ssd import LLM, SamplingParams
from tests.reference.tiny_models import TinySpec, random_hf_model

N_IDS = 100  # the tokenizer's ids; rows past them are padding
PROMPTS = [[5, 17, 42], [99, 3, 3, 64, 8, 1]]
N_TOKENS = 6


def write_tokenizer(directory: Path, prefix: str = "t") -> None:
    """A word-level tokenizer of N_IDS tokens ``t0 .. t99``."""
    vocab = {f"{prefix}{i}": i for i in range(N_IDS)}
    backend = BackendTokenizer(tk_models.WordLevel(vocab, unk_token=f"{prefix}0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(directory / "tokenizer.json"))


def padded_model(directory: Path, rows: int, seed: int, num_layers: int):
    """A random llama of ``rows`` vocabulary rows whose padding rows dominate the logits.

    Hidden channel 0 is 1 in every embedding and nothing reads or writes it in
    the layers, so it reaches the final norm as the same positive value; the
    padding rows of lm_head read only that channel, with a large weight, and
    the real rows never do (they score as a random model's would).
    """
    model = random_hf_model(TinySpec(vocab_size=rows, hidden_size=32, intermediate_size=48, num_layers=num_layers,
                                     num_heads=2, num_kv_heads=2, init_std=0.3, seed=seed))
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            for reader in (attention.q_proj, attention.k_proj, attention.v_proj, mlp.gate_proj, mlp.up_proj):
                reader.weight[:, 0] = 0.0
            attention.o_proj.weight[0] = 0.0
            mlp.down_proj.weight[0] = 0.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[N_IDS:] = 0.0
        head[N_IDS:, 0] = 100.0
    directory.mkdir(parents=True)
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return model


def hf_greedy(model, prompt: list[int], n: int, rows: int | None = None) -> list[int]:
    """transformers' greedy continuation, the argmax taken over the first ``rows`` logits."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits[:rows].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def padded_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab_padding")
    target = padded_model(root / "target", rows=160, seed=3, num_layers=2)
    draft = padded_model(root / "draft", rows=128, seed=4, num_layers=1)
    return root / "target", root / "draft", target


def generate(target: Path, params: SamplingParams, **engine) -> list[list[int]]:
    with LLM(target, max_model_len=32, **engine) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_padding_rows_would_win(padded_pair):
    """The models as built pick padding ids when nothing cuts them (else this file proves nothing)."""
    _, _, hf_target = padded_pair
    assert all(t >= N_IDS for p in PROMPTS for t in hf_greedy(hf_target, p, N_TOKENS))


MODES = [dict(), dict(mode="sd", k=3), dict(mode="ssd", k=3)]


def test_greedy_modes_agree_and_sample_no_padding(padded_pair):
    target, draft, hf_target = padded_pair
    want = [hf_greedy(hf_target, p, N_TOKENS, rows=N_IDS) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    for mode in MODES:
        got = generate(target, greedy, draft=None if not mode else draft, adaptive=False, **mode)
        assert got == want, mode


def test_seeded_sampling_modes_agree_and_sample_no_padding(padded_pair):
    """Gumbel coupling: seeded sd and ssd give seeded ar's tokens; at temperature 1
    the padding rows would take nearly all the probability."""
    target, draft, _ = padded_pair
    sampled = SamplingParams(temperature=1.0, max_tokens=N_TOKENS, ignore_eos=True, seed=7)
    runs = [generate(target, sampled, draft=None if not mode else draft, adaptive=False, coupling="gumbel", **mode)
            for mode in MODES]
    assert runs[0] == runs[1] == runs[2]
    assert all(0 <= t < N_IDS for tokens in runs[0] for t in tokens)


def test_prompt_ids_past_the_tokenizer_are_refused(padded_pair):
    target, _, _ = padded_pair
    with LLM(target, max_model_len=32) as llm:
        assert llm.model.config.vocab_size == N_IDS
        with pytest.raises(ValueError, match=rf"token id {N_IDS} is outside the vocabulary \(size {N_IDS}\)"):
            llm.generate([[1, N_IDS]], SamplingParams(max_tokens=1))


def test_draft_with_another_tokenizer_is_refused_before_loading(padded_pair, tmp_path):
    """Refused by the tokenizers alone: the draft's weights here are not even readable."""
    target, draft, _ = padded_pair
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text((draft / "config.json").read_text())
    (other / "model.safetensors").write_bytes(b"not safetensors")
    write_tokenizer(other, prefix="u")
    with pytest.raises(ValueError, match=r"draft: its tokenizer \(.*other\) differs from the target's \(.*target\): "
                                         r"token 't0' is id 0 against absent; a draft must share"):
        LLM(target, draft=other, mode="sd", k=3, max_model_len=32)


def test_models_without_tokenizer_keep_every_row(padded_pair, tmp_path):
    """No tokenizer: no rule to cut by; every row is a token id (as before)."""
    target, _, _ = padded_pair
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((target / name).read_bytes())
    with LLM(bare, max_model_len=32) as llm:
        assert llm.model.config.vocab_size == 160
