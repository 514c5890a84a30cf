"""What every benchmark result records besides its numbers: the command and the machine.

A number without the command that produced it cannot be reproduced, and one
without the machine cannot be compared; every JSON a benchmark writes goes
through ``write_result`` so that neither can be forgotten.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

# How `python -m ssd.bench` is typed; sys.argv[0] under -m is the path of __main__.py.
BENCH_PROG = "python -m ssd.bench"


def command_line(args: list[str] | None = None, prog: str | None = None) -> str:
    """The command as a user would type it, shell-quoted.

    prog: how the program is invoked (default: ``python`` and sys.argv[0], as
    a script was started); args: its arguments (default: sys.argv[1:]).
    """
    if args is None:
        args = sys.argv[1:]
    if prog is None:
        prog = shlex.join(["python", sys.argv[0]])
    return " ".join([prog, shlex.join(args)]) if args else prog


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo, else lscpu, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _git_commit() -> str | None:
    """The source tree's commit when ssd runs from a git checkout (None when installed)."""
    package = Path(__file__).resolve().parents[1]  # .../python/ssd in a checkout
    try:
        out = subprocess.run(["git", "-C", str(package), "rev-parse", "--show-toplevel", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    # An installed copy can sit inside some other repository (site-packages
    # under a git-managed pyenv): only ssd's own checkout counts.
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() / "python" / "ssd" != package:
        return None
    return lines[1]


def machine() -> dict:
    """The machine and software a result was measured on."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": _version("torch"), "ssd": _version("ssd"), "git_commit": _git_commit()}


def write_result(path: str | os.PathLike, doc: dict, command: str | None = None) -> Path:
    """Writes `doc` as JSON with "command" (default: this process's) and "machine" first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command if command is not None else command_line(), "machine": machine(),
           **{k: v for k, v in doc.items() if k not in ("command", "machine")}}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
