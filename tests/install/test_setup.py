"""setup.py's helpers: the environment's cmake and ninja before PATH's, the torch
pin, the build folder's key, the compiler check; and that a build without a C++
compiler stops at one line before CMake runs. Importing setup.py builds nothing."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_setup():
    spec = importlib.util.spec_from_file_location("ssd_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = load_setup()


def program(path: Path, body: str) -> Path:
    """An executable shell script at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


# --- cmake and ninja ---------------------------------------------------------

def test_bin_dirs_are_the_module_s_then_beside_the_unresolved_executable(tmp_path, monkeypatch):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)  # a venv's python links outside the venv
    monkeypatch.setitem(sys.modules, "fake_cmake", types.SimpleNamespace(CMAKE_BIN_DIR="/opt/cmake/bin"))
    assert S.environment_bin_dirs("fake_cmake", "CMAKE_BIN_DIR", str(venv_bin / "python")) == \
        [Path("/opt/cmake/bin"), venv_bin]
    assert S.environment_bin_dirs("no_such_module_here", "BIN_DIR", str(venv_bin / "python")) == [venv_bin]


def test_the_environment_s_tool_wins_over_path_s(tmp_path):
    env_bin, other = tmp_path / "env" / "bin", tmp_path / "usr" / "bin"
    program(other / "cmake", "echo path")
    assert S.find_tool("cmake", [env_bin], path=str(other)) == str(other / "cmake")  # the environment has none
    program(env_bin / "cmake", "echo env")
    assert S.find_tool("cmake", [env_bin], path=str(other)) == str(env_bin / "cmake")


def test_a_file_that_is_not_executable_is_not_a_tool(tmp_path):
    env_bin, other = tmp_path / "env", tmp_path / "usr"
    (env_bin).mkdir()
    (env_bin / "ninja").write_text("not a program")
    program(other / "ninja", "true")
    assert S.find_tool("ninja", [env_bin], path=str(other)) == str(other / "ninja")


def test_no_tool_anywhere_says_what_to_install(tmp_path):
    with pytest.raises(S.CompileError, match=r"no ninja in this environment .* nor on PATH: pip install ninja"):
        S.find_tool("ninja", [tmp_path], path=str(tmp_path))


@pytest.mark.parametrize("printed, ok", [("cmake version 3.25.1", False), ("cmake version 3.26.0", True),
                                         ("cmake version 4.1.2\n\nCMake suite maintained", True),
                                         ("cmake3 version 2.8", False)])
def test_cmake_older_than_3_26_is_refused_by_name(tmp_path, printed, ok):
    cmake = program(tmp_path / "cmake", f"printf '{printed}\\n'")
    if ok:
        S.check_cmake(str(cmake))
    else:
        with pytest.raises(S.CompileError, match=rf"{cmake} is CMake .*, ssd needs >= 3\.26: pip install"):
            S.check_cmake(str(cmake))


# --- torch -------------------------------------------------------------------

@pytest.mark.parametrize("version, requirement", [("2.13.0+cpu", "torch==2.13.*"), ("2.14.1", "torch==2.14.*"),
                                                  ("2.15.0.dev20260101+cu130", "torch==2.15.*"),
                                                  (None, "torch>=2.11")])
def test_the_torch_pin_is_the_release_built_against(version, requirement):
    assert S.torch_requirement(version) == requirement


def test_a_torch_version_without_a_release_is_an_error():
    with pytest.raises(ValueError, match="'nightly' does not start with X.Y"):
        S.torch_requirement("nightly")


def test_the_installed_torch_is_read_from_its_metadata():
    import torch

    assert S.torch_version() == torch.__version__
    assert S.torch_cmake_dir() == Path(torch.__file__).parent / "share" / "cmake" / "Torch"
    assert (S.torch_cmake_dir() / "TorchConfig.cmake").is_file()


# --- the build folder --------------------------------------------------------

def test_the_build_folder_is_keyed_by_interpreter_and_torch():
    assert S.build_dir_name("cp311", "2.13.0+cpu") == "py-cp311-torch2.13.0-cpu"
    names = {S.build_dir_name(py, torch) for py in ("cp311", "cp312") for torch in ("2.13.0+cpu", "2.13.0", "2.14.1")}
    assert len(names) == 6
    assert S.python_tag() == f"cp{sys.version_info.major}{sys.version_info.minor}"


def test_a_cache_of_another_python_or_torch_is_configured_afresh(tmp_path):
    torch_dir = tmp_path / "site" / "torch" / "share" / "cmake" / "Torch"
    torch_dir.mkdir(parents=True)
    cache = ("# This is the CMakeCache file.\nCMAKE_BUILD_TYPE:STRING=Release\n"
             f"Python_EXECUTABLE:FILEPATH=/venv/bin/python\nTorch_DIR:PATH={torch_dir}\n")
    assert not S.needs_fresh(cache, "/venv/bin/python", torch_dir)
    assert S.needs_fresh(cache, "/other/bin/python", torch_dir)
    assert S.needs_fresh(cache, "/venv/bin/python", tmp_path / "gone" / "Torch")
    assert not S.needs_fresh("CMAKE_BUILD_TYPE:STRING=Release\n", "/venv/bin/python", torch_dir)


# --- the C++ compiler --------------------------------------------------------

def test_no_compiler_on_path_is_one_line_saying_what_to_install(tmp_path):
    problem = S.cxx_problem({}, path=str(tmp_path))
    assert problem.startswith("no C++ compiler found (c++, g++ or clang++ on PATH): install one with C++20")
    assert "\n" not in problem
    assert S.cxx_problem({"CXX": str(tmp_path / "g++-99")}).startswith(f"no C++ compiler found (CXX={tmp_path}")


def test_a_compiler_without_cxx20_is_named(tmp_path):
    old = program(tmp_path / "g++-9", "echo \"g++-9: error: unrecognized command-line option '-std=c++20'\" >&2; exit 1")
    problem = S.cxx_problem({"CXX": str(old)})
    assert problem == (f"the C++ compiler {old} does not compile C++20 (g++-9: error: unrecognized command-line "
                       f"option '-std=c++20'): {S.INSTALL_CXX}")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_cxx20_compiler_passes_and_a_cxx17_one_does_not(tmp_path):
    assert S.cxx_problem({"CXX": "g++"}) is None
    cxx17 = program(tmp_path / "g++17", 'exec g++ "$@" -std=c++17')  # the last -std wins
    assert "does not compile C++20" in S.cxx_problem({"CXX": str(cxx17)})


def test_a_build_without_a_compiler_stops_before_cmake(tmp_path):
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    build_dir = tmp_path / "cmake-build"
    env = {**os.environ, "CXX": "/nonexistent/c++", "SSD_BUILD_DIR": str(build_dir)}
    proc = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {S.cxx_problem({'CXX': '/nonexistent/c++'})}"
    assert not build_dir.exists()


def test_the_wheel_requires_the_torch_release_it_was_built_against(tmp_path):
    """pip's view of the project's metadata (from a copy: metadata is written beside
    the sources): the pin from setup.py, the extras from pyproject.toml."""
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "python" / "ssd").mkdir(parents=True)
    (tmp_path / "python" / "ssd" / "__init__.py").write_text("")
    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                             "--quiet", "--report", "-", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    import json

    requires = json.loads(report.stdout)["install"][0]["metadata"]["requires_dist"]
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    assert f"torch=={major}.{minor}.*" in requires
    assert "numpy" in requires and 'pytest; extra == "test"' in requires
