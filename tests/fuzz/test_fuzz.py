"""Every fuzz target runs a few seconds under atheris (in CI too) and must not crash.

The long runs (10 minutes per target and more) are ``python -m tests.fuzz
TARGET --seconds 600``; this test is the smoke run that keeps the targets and
their documented error types honest on every commit. All six targets together
take about two minutes (``SECONDS`` each plus 3-9 s of start-up: ~100 s on 2 cores).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import ssd
from tests.fuzz.harness import TARGETS

try:
    import atheris  # noqa: F401
except ImportError:
    # atheris ships wheels for CPython >= 3.11 on x86-64 Linux (the CI); only
    # elsewhere may it be missing (building it needs clang's libFuzzer).
    if platform.system() == "Linux" and platform.machine() == "x86_64" and sys.version_info >= (3, 11):
        raise
    pytest.skip("atheris has no wheel for this platform", allow_module_level=True)

SECONDS = 12
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", TARGETS)
def test_target_does_not_crash(target, tmp_path):
    # The child imports the same ssd as this process (installed, or python/ via PYTHONPATH).
    path = [str(ROOT), str(Path(ssd.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    # TMPDIR: the targets' and the harness's scratch directories go under tmp_path, which pytest removes.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "TMPDIR": str(tmp_path)}
    artifacts = tmp_path / "artifacts"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", target, "--seconds", str(SECONDS), "--artifacts", str(artifacts)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SECONDS + 120)
    found = sorted(p.name for p in artifacts.iterdir()) if artifacts.exists() else []
    assert proc.returncode == 0 and not found, (
        f"fuzz target {target} crashed (exit {proc.returncode}); inputs saved in {artifacts}: {found}; replay with "
        f"python -m tests.fuzz {target} --replay FILE\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    assert "Done " in proc.stderr, proc.stderr[-3000:]
