"""scripts/: each answers -h/--help with its usage and does nothing else; install.sh
installs only into a virtualenv or conda environment unless told --system, picks
torch's CPU build, and adds the test extras only when asked (test.sh asks, demo.sh
does not); test.sh hands its other arguments to pytest.

The scripts run with a fake `python` first on PATH (and as $PYTHON) that logs every
call and runs none of them, except `python -c CODE`, which runs for real without
site-packages (so no torch, and not a virtualenv)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL_SCRIPTS = ["install.sh", "test.sh", "demo.sh", "cuda_build_check.sh", "gpu_check.sh"]
TOOLS = ["python", "python3", "pip", "pip3", "cmake", "ninja", "nvcc", "nvidia-smi", "compute-sanitizer",
         "pytest", "c++", "g++", "git"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.fixture
def fake(tmp_path):
    """(environment for a script, path of the log of every tool it called)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(f"""#!/bin/bash
line=$(IFS='|'; echo "{tool}|$*")
printf '%s\n' "${{line//$'\n'/ }}" >> "{log}"
if [ "{tool}" = python ] && [ "$1" = -c ]; then exec "{sys.executable}" -S "$@"; fi
if [[ " $* " == *" --dry-run "* ]]; then printf '%s' "${{FAKE_REPORT:-}}"; fi
exit 0
""")
        script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "python"), "HOME": str(tmp_path),
           "OUT": str(tmp_path / "out")}
    return env, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable] if script.endswith(".py") else ["bash"]
    return subprocess.run([*command, str(REPO / "scripts" / script), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", [*SHELL_SCRIPTS, "check_links.py"])
def test_help_prints_the_usage_and_does_nothing_else(fake, script, flag):
    env, log = fake
    proc = run(script, flag, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    usage = [line for line in proc.stdout.splitlines() if line.lower().startswith("usage:")]
    assert usage and f"scripts/{script}" in usage[0], proc.stdout
    assert calls(log) == []
    assert not Path(env["OUT"]).exists()


@pytest.mark.parametrize("script", ["test.sh", "demo.sh", "install.sh"])
def test_help_anywhere_among_the_arguments_wins(fake, script):
    env, log = fake
    proc = run(script, "--system", "-k", "x", "--help", env=env) if script != "install.sh" else \
        run(script, "--test", "--help", env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage:"), proc.stderr
    assert calls(log) == []


@pytest.mark.parametrize("script, option", [("install.sh", "--tests"), ("gpu_check.sh", "--gpu"),
                                            ("cuda_build_check.sh", "--venv")])
def test_an_unknown_option_is_refused_by_name(fake, script, option):
    env, log = fake
    proc = run(script, option, env=env)
    assert proc.returncode == 2
    assert f"{script}: unknown option {option}" in proc.stderr
    assert calls(log) == []


def test_install_refuses_a_python_outside_a_virtualenv(fake):
    env, log = fake
    proc = run("install.sh", env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"install.sh: {env['PYTHON']} is not in a virtualenv or conda environment: create "
                                   "one (python -m venv .venv && . .venv/bin/activate) or pass --system to install "
                                   "there anyway")
    assert [c.split("|")[:2] for c in calls(log)] == [["python", "-c"]]  # the check alone, no pip


@pytest.mark.parametrize("offered, torch_install", [
    ("2.13.0+cpu", "python|-m|pip|install|torch==2.13.0"),  # a local index serving the CPU build: offline
    ("2.13.0", f"python|-m|pip|install|torch==2.13.0|--index-url|{CPU_INDEX}"),  # PyPI's build is CUDA's
    (None, f"python|-m|pip|install|torch==2.13.0|--index-url|{CPU_INDEX}"),  # pip could not tell
])
def test_install_without_torch_installs_its_cpu_build(fake, offered, torch_install):
    env, log = fake
    if offered is not None:
        env["FAKE_REPORT"] = json.dumps({"install": [{"metadata": {"name": "torch", "version": offered}}]})
    proc = run("install.sh", "--system", env=env)
    assert proc.returncode == 0, proc.stderr
    pip = [c for c in calls(log) if c.startswith("python|-m|pip|install") and "--dry-run" not in c]
    assert pip == [torch_install,
                   "python|-m|pip|install|cmake>=3.26|ninja|pybind11>=2.12|setuptools>=64|wheel",
                   "python|-m|pip|install|--no-build-isolation|."]


def test_test_sh_installs_the_test_extras_and_hands_pytest_its_arguments(fake):
    env, log = fake
    (Path(env["PYTHON"]).parent / "nvcc").unlink()  # no CUDA compile check
    proc = run("test.sh", "--system", "-k", "a and not b", "tests/install", env=env)
    assert proc.returncode == 0, proc.stderr
    made = calls(log)
    assert "python|-m|pip|install|--no-build-isolation|.[test]" in made
    assert "python|-m|pytest|-q|-k|a and not b|tests/install" in made
    assert "python|-m|pip|install|-q|--no-deps|--no-build-isolation|." in made  # gpu_check.sh --cpu


def test_demo_installs_without_the_test_extras(fake):
    env, log = fake
    proc = run("demo.sh", "--system", "--max-tokens", "16", "--prompt", "Hi", env=env)
    assert proc.returncode == 0, proc.stderr
    made = calls(log)
    assert "python|-m|pip|install|--no-build-isolation|." in made
    assert not any(".[test]" in c for c in made)
    assert made[-1] == "python|-m|ssd|--max-tokens|16|--prompt|Hi"
