"""SmolLM2-135M-Instruct (real Q4_1 GGUF): ssd's greedy output equals transformers'.

transformers reads the same GGUF itself (its own dequantisation, config and
tokenizer), so this checks ssd's GGUF loader, tokenizer, chat template, forward
and AR engine end to end against an independent implementation.
"""
from __future__ import annotations

import re

import pytest
import torch
import transformers

from ssd import LLM, SamplingParams
from ssd.assets import humaneval_prompts, mtbench_prompts, smollm2_gguf_path

MAX_TOKENS = 32
MAX_MODEL_LEN = 512
# Below this top-2 logit gap a mismatch may be fp32 rounding, not a bug: such a
# failure is reported with its numbers (see _explain_mismatch), never loosened.
TIE_GAP = 1e-4


def _questions() -> list[str]:
    """Four user messages: two MT-Bench questions, a HumanEval task, a short fact."""
    code = humaneval_prompts(1)[0]
    return [
        mtbench_prompts(1)[0],
        mtbench_prompts(8)[7],
        "Complete the following Python function.\n\n" + code,
        "What is the capital of France? Answer in one sentence.",
    ]


@pytest.fixture(scope="module")
def gguf_path():
    return smollm2_gguf_path()


@pytest.fixture(scope="module")
def hf(gguf_path):
    """(tokenizer, model) from transformers' own GGUF reader."""
    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32)
    # No eos stop, like ignore_eos=True (a min_new_tokens bound would instead mask
    # eos out of the logits and change the greedy choice).
    model.generation_config.eos_token_id = None
    return tokenizer, model.eval()


@pytest.fixture(scope="module")
def llm(gguf_path):
    engine = LLM(target=str(gguf_path), mode="ar", max_model_len=MAX_MODEL_LEN)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(hf):
    """[(question, chat text, token ids)] with transformers' template and tokenizer."""
    tokenizer, _ = hf
    out = []
    for question in _questions():
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) + MAX_TOKENS <= MAX_MODEL_LEN
        out.append((question, text, ids))
    return out


def _hf_greedy(model, prompt_ids: list[int]) -> list[int]:
    """transformers' greedy continuation (the hf fixture has cleared eos: as ignore_eos)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]),
                             attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=MAX_TOKENS)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def ssd_outputs(llm, prompts):
    """ssd's greedy RequestOutputs, from the token ids transformers produced."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return llm.generate([ids for _, _, ids in prompts], params)


def _explain_mismatch(model, prompt_ids, hf_tokens, ssd_tokens) -> str:
    """The first differing step, with transformers' top-2 logits there."""
    step = next(i for i, (a, b) in enumerate(zip(hf_tokens, ssd_tokens)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + hf_tokens[:step]])).logits[0, -1]
    top = torch.topk(logits, 2)
    gap = (top.values[0] - top.values[1]).item()
    kind = "near-tie (report it)" if gap < TIE_GAP else "NOT a tie: a real divergence"
    return (f"first difference at generated token {step}: transformers {hf_tokens[step]}, "
            f"ssd {ssd_tokens[step]}; transformers top-2 {top.indices.tolist()} "
            f"logits {top.values.tolist()} gap {gap:.3g} ({kind}); "
            f"ssd's token logit {logits[ssd_tokens[step]].item():.6g}")


def test_tokenizer_and_chat_template_match_transformers(llm, hf, prompts):
    hf_tokenizer, _ = hf
    tokenizer = llm.tokenizer
    for question, hf_text, hf_ids in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True)
        assert text == hf_text
        assert tokenizer.encode(hf_text) == hf_ids
        assert tokenizer.encode(question) == hf_tokenizer(question, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(hf_ids, skip_special_tokens=False) == hf_tokenizer.decode(hf_ids)


def test_greedy_matches_transformers(hf, prompts, ssd_outputs):
    _, model = hf
    failures = []
    for (question, _, ids), out in zip(prompts, ssd_outputs):
        assert out.error is None and out.finish_reason == "length", (out.finish_reason, out.error)
        assert out.prompt_token_ids == ids
        assert len(out.token_ids) == MAX_TOKENS
        expected = _hf_greedy(model, ids)
        assert len(expected) == MAX_TOKENS
        if out.token_ids != expected:
            failures.append(f"{question[:40]!r}: "
                            f"{_explain_mismatch(model, ids, expected, out.token_ids)}")
    assert not failures, "\n".join(failures)


def test_greedy_text_reads_sensibly(prompts, ssd_outputs):
    """Decoded replies are mostly plain ASCII prose/code, and most of them pick up
    a content word of their question (the model is answering, not babbling)."""
    echoes = 0
    for (question, _, _), out in zip(prompts, ssd_outputs):
        text = out.text
        assert len(text) >= 40, text
        plain = sum(c.isascii() and (c.isalnum() or c.isspace() or c in ".,:;!?'\"()-_=*#`[]<>/")
                    for c in text)
        assert plain / len(text) >= 0.9, text
        words = {w.lower() for w in re.findall(r"[A-Za-z]{5,}", question)}
        echoes += any(w in text.lower() for w in words)
    assert echoes >= 2, [o.text for o in ssd_outputs]
