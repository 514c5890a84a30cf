"""Runs one fuzz target under atheris (libFuzzer); shared by the pytest test and the CLI.

A target module ``tests.fuzz.target_<name>`` defines:

* ``test_one_input(data: bytes)``: feeds ``data`` to the parser; raising
  anything is a crash, so it catches exactly the documented error types;
* ``seeds() -> list[bytes]``: the starting corpus, built in code;
* ``DICTIONARY``: tokens libFuzzer may splice into inputs (optional);
* ``DOCUMENTED``: the exception types that are not crashes (for the report).

A crash is an uncaught exception, a signal (a segfault in C++), a run of one
input longer than ``HANG_SECONDS``, or RSS above ``RSS_LIMIT_MB``. libFuzzer
then writes the input to ``<artifacts>/crash-*``, ``timeout-*`` or ``oom-*``
and exits non-zero.
"""
from __future__ import annotations

import importlib
import os
import resource
import sys
import tempfile
from pathlib import Path
from types import ModuleType

TARGETS = ("json", "safetensors", "gguf", "tokenizer", "chat_template", "server")
# Python packages whose code atheris instruments for coverage, besides the
# target module itself (C++ and Rust code is not instrumented).
INSTRUMENTED = {
    "json": (),
    "safetensors": (),
    "gguf": ("ssd.models", "gguf", "jinja2"),
    "tokenizer": ("ssd.models", "jinja2"),
    "chat_template": ("ssd.models", "jinja2"),
    "server": ("ssd.serve", "ssd.models.tokenizer", "ssd.models.chat_template"),
}
HANG_SECONDS = 5
RSS_LIMIT_MB = 3072  # torch alone holds ~0.5 GB; an input that needs GBs is a crash
# libFuzzer's RSS is the process's peak (getrusage), which on Linux starts at the peak of the process that
# started it: a pytest run that had held 6.8 GB made every target "out of memory" at its first input. So the
# limit counts from the peak this process was born with (read here, before torch is imported).
_BORN_PEAK_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
MAX_INPUT_BYTES = 16384


def load_target(name: str, instrument: bool = False) -> ModuleType:
    """The target module; with ``instrument``, it and its parsers are instrumented for coverage."""
    if name not in TARGETS:
        raise SystemExit(f"unknown fuzz target {name!r}; targets: {', '.join(TARGETS)}")
    if not instrument:
        return importlib.import_module(f"tests.fuzz.target_{name}")
    import atheris
    import torch  # noqa: F401  imported first, so that it is not instrumented

    with atheris.instrument_imports(include=[f"tests.fuzz.target_{name}", *INSTRUMENTED[name]]):
        return importlib.import_module(f"tests.fuzz.target_{name}")


def write_seeds(target: ModuleType, directory: Path) -> None:
    for i, seed in enumerate(target.seeds()):
        (directory / f"seed-{i:03d}").write_bytes(seed)


def write_dictionary(target: ModuleType, path: Path) -> bool:
    """libFuzzer's dictionary format: one quoted token per line, bytes as \\xNN."""
    tokens = getattr(target, "DICTIONARY", ())
    if not tokens:
        return False
    escape = lambda b: "".join(chr(c) if 32 <= c < 127 and c not in b'"\\' else f"\\x{c:02x}" for c in b)  # noqa: E731
    path.write_text("".join(f'"{escape(t.encode() if isinstance(t, str) else t)}"\n' for t in tokens))
    return True


def run(name: str, seconds: int, corpus: Path | None = None, artifacts: Path | None = None,
        extra: list[str] | tuple[str, ...] = ()) -> None:
    """Fuzzes target ``name`` for ``seconds``; never returns (libFuzzer exits the process).

    New interesting inputs go to ``corpus`` (a temporary directory when None),
    crashing inputs to ``artifacts`` (the current directory when None).
    """
    import atheris

    target = load_target(name, instrument=True)
    work = Path(tempfile.mkdtemp(prefix=f"ssd-fuzz-{name}-"))  # seeds, and the corpus unless given
    print(f"fuzzing {name} for {seconds} s; work directory {work}", flush=True)
    seed_dir = work / "seeds"
    seed_dir.mkdir()
    write_seeds(target, seed_dir)
    corpus = corpus or work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    argv = [sys.argv[0], f"-max_total_time={seconds}", f"-timeout={HANG_SECONDS}",
            f"-rss_limit_mb={RSS_LIMIT_MB + _BORN_PEAK_MB}", f"-max_len={MAX_INPUT_BYTES}", "-print_final_stats=1"]
    if artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
        argv.append(f"-artifact_prefix={artifacts}{os.sep}")
    if write_dictionary(target, work / "dictionary"):
        argv.append(f"-dict={work / 'dictionary'}")
    argv += [*extra, str(corpus), str(seed_dir)]
    atheris.Setup(argv, target.test_one_input)
    atheris.Fuzz()


def replay(name: str, paths: list[Path]) -> None:
    """Runs the target once on each file (a crash raises here, with its traceback)."""
    target = load_target(name)
    for path in paths:
        print(f"replaying {path}", flush=True)
        target.test_one_input(path.read_bytes())
