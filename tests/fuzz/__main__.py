"""python -m tests.fuzz TARGET [--seconds N] [--corpus DIR] [--artifacts DIR] [-- LIBFUZZER ARGS]

Fuzzes one target (json, safetensors, gguf, tokenizer, chat_template, server) for N
seconds; ``--replay FILE...`` runs saved inputs (e.g. a crash-* file) once.
Run from the repository root with the ssd under test importable. Exit status 0:
no crash; otherwise libFuzzer's report names the input file it saved.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.fuzz.harness import TARGETS, replay, run


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time (default 60)")
    parser.add_argument("--corpus", type=Path, help="keep the corpus here (grows across runs)")
    parser.add_argument("--artifacts", type=Path, help="where crashing inputs are written (default: .)")
    parser.add_argument("--replay", type=Path, nargs="+", metavar="FILE", help="run these inputs once")
    args = parser.parse_args(argv)
    if args.replay:
        replay(args.target, args.replay)
        return
    run(args.target, args.seconds, args.corpus, args.artifacts, extra)


if __name__ == "__main__":
    main()
