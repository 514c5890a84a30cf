"""Importing ssd beside another torch release than the one ssd._C was compiled
against (recorded by setup.py in ssd/_build_info.py) is an ImportError naming both,
raised before _C loads (whose own failure would be an undefined symbol)."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "ssd"
TORCH = importlib.metadata.version("torch")
MAJOR, MINOR = TORCH.split(".")[:2]
# What loading an extension built against another torch looks like.
FAKE_C = 'raise ImportError("_C.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")\n'


def installed_copy(root: Path, recorded: str | None) -> Path:
    """A copy of the ssd package whose _C fails like a mismatched build, with `recorded`
    as the build's torch (no _build_info.py when None)."""
    copy = root / "ssd"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__", "_build_info.py"))
    (copy / "_C.py").write_text(FAKE_C)
    if recorded is not None:
        (copy / "_build_info.py").write_text(f"TORCH_VERSION = {recorded!r}\n")
    return root


def run(root: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("first", ["", "import torch; "], ids=["torch-not-loaded", "torch-loaded"])
def test_another_torch_release_is_an_import_error_naming_both(tmp_path, first):
    root = installed_copy(tmp_path, "2.9.1+cu128")
    proc = run(root, first + "import ssd; from ssd import _C")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: ssd was built against torch 2.9.1+cu128, but this environment has "
                           f"torch {TORCH}: install torch==2.9.* or rebuild ssd here"), proc.stderr
    assert "undefined symbol" not in proc.stderr


def test_the_same_release_passes_to_the_extension(tmp_path):
    root = installed_copy(tmp_path, f"{MAJOR}.{MINOR}.99")
    proc = run(root, "import ssd, sys; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"  # the check reads torch's version without importing it
    proc = run(root, "import ssd; from ssd import _C")
    assert "undefined symbol" in proc.stderr  # the check let it through to _C


def test_a_build_that_recorded_nothing_is_not_checked(tmp_path):
    root = installed_copy(tmp_path, None)
    proc = run(root, "import ssd")
    assert proc.returncode == 0, proc.stderr
