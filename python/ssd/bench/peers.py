"""Peers beside the engine: transformers ``generate`` and assisted generation on the same pair."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from tqdm import tqdm


class StampStreamer:
    """A generate() streamer that records when each new token arrives."""

    def __init__(self):
        self.stamps: list[float] = []
        self._seen_prompt = False

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self._seen_prompt:  # generate() first hands over the prompt itself
            self._seen_prompt = True
            return
        self.stamps.extend([now] * int(value.numel()))

    def end(self) -> None:
        pass


def load_hf(path: str, dtype):
    """A transformers model from an HF directory or a GGUF file, in eval mode."""
    import transformers
    from transformers import AutoModelForCausalLM

    # transformers renamed torch_dtype to dtype in 4.56.
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    kwargs = {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}
    p = Path(path)
    if p.is_file():  # a GGUF file
        return AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, **kwargs).eval()
    return AutoModelForCausalLM.from_pretrained(str(p), **kwargs).eval()


def run_hf_peers(target_path: str, draft_path: str, prompts: list[list[int]], cfg, temperature: float) -> list[dict]:
    """transformers generate (target alone) and assisted generation (assistant_model = draft), batch 1,
    torch on cfg.target_threads threads; decode tok/s measured like the engine's (first token excluded)."""
    import torch

    torch.set_num_threads(cfg.target_threads)
    dtype = getattr(torch, cfg.dtype)
    target = load_hf(target_path, dtype)
    draft = load_hf(draft_path, dtype)
    results = []
    for name, assistant in (("hf generate", None), ("hf assisted", draft)):
        decode_s, decode_tokens, tokens, wall, ttft = 0.0, 0, 0, 0.0, []
        for i, ids in enumerate(tqdm(prompts, desc=name, leave=False)):
            x = torch.tensor([ids], dtype=torch.long)
            streamer = StampStreamer()
            kwargs = dict(max_new_tokens=cfg.max_tokens, min_new_tokens=cfg.max_tokens, streamer=streamer,
                          attention_mask=torch.ones_like(x), pad_token_id=target.generation_config.eos_token_id
                          if not isinstance(target.generation_config.eos_token_id, list)
                          else target.generation_config.eos_token_id[0])
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                torch.manual_seed(cfg.seed + i)
            else:
                kwargs.update(do_sample=False)
            if assistant is not None:
                kwargs["assistant_model"] = assistant
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.generate(x, **kwargs)
            wall += time.perf_counter() - t0
            n = out.shape[1] - x.shape[1]
            stamps = streamer.stamps
            if len(stamps) >= 2:
                decode_s += stamps[-1] - stamps[0]
                decode_tokens += len(stamps) - 1
            tokens += n
            ttft.append(stamps[0] - t0 if stamps else float("nan"))
        results.append({"peer": name, "batch_size": 1, "temperature": temperature,
                        "threads": cfg.target_threads, "decode_tok_per_s": decode_tokens / decode_s if decode_s else 0.0,
                        "e2e_tok_per_s": tokens / wall, "ttft_s": statistics.mean(ttft)})
    return results
