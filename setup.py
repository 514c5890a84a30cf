"""Builds ssd._C through CMake, with the tools and torch of the environment being
installed into (the Python running this file, sys.executable): its cmake and ninja
(PATH's only where the environment has none), its torch and pybind11.

The wheel requires the torch release it was compiled against (torch==X.Y.*), and
ssd/_build_info.py records that torch, so importing ssd beside another one is a
clear ImportError rather than an undefined symbol.

Environment: SSD_CUDA=auto|on|off, SSD_CUDA_ARCHS (GPU
architectures, default "80;90"), SSD_BUILD_DIR (default build/py-<python>-torch<version>,
kept between builds for incremental rebuilds).

Importing this file defines the helpers without building anything (tests use them).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

ROOT = Path(__file__).resolve().parent
MIN_CMAKE = (3, 26)
MIN_TORCH = "2.11"
# Besides torch, whose requirement depends on the build (torch_requirement).
DEPENDENCIES = [
    "numpy",
    "tokenizers>=0.21",  # encode_batch_fast
    "gguf",
    "jinja2",
    "tqdm",
    # ssd serve
    "fastapi",
    "uvicorn",
    "prometheus_client",
]
# The C++20 the sources rely on: <bit>, concepts, designated initializers.
CXX20_PROBE = """
#include <bit>
#include <concepts>
#include <span>
template <std::unsigned_integral T> constexpr int width(T x) { return std::bit_width(x); }
struct Pair { int a, b; };
int main() { Pair p{.a = 1, .b = 2}; return width(4u) + p.b; }
"""
INSTALL_CXX = "install one with C++20 support, e.g. GCC >= 10 (`apt install g++`) or conda's `cxx-compiler`"


# --- the environment's tools -------------------------------------------------

def environment_bin_dirs(module: str, attribute: str, executable: str = sys.executable) -> list[Path]:
    """Where the environment of `executable` keeps its programs: the directory its
    `module` package names (cmake.CMAKE_BIN_DIR, ninja.BIN_DIR), then the one beside
    `executable` (a venv's bin/, whether or not it is activated)."""
    dirs = []
    try:
        named = getattr(importlib.import_module(module), attribute, None)
    except ImportError:
        named = None
    if named:
        dirs.append(Path(named))
    dirs.append(Path(executable).parent)  # not resolved: a venv's python links outside it
    return dirs


def find_tool(name: str, bin_dirs: list[Path], path: str | None = None) -> str:
    """The program `name` from the first of `bin_dirs` that has it, else from PATH
    (`path`, default $PATH). Raises CompileError when neither has it."""
    for d in bin_dirs:
        candidate = d / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name, path=path)
    if found is None:
        raise CompileError(f"no {name} in this environment ({', '.join(map(str, bin_dirs))}) nor on PATH: "
                           f"pip install {name} into the environment of {sys.executable}")
    return found


def cmake_version(cmake: str) -> tuple[int, ...]:
    """The version `cmake --version` reports, as numbers."""
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise CompileError(f"{cmake} --version printed no version: {out.strip()!r}")
    return tuple(int(part) for part in match.groups(default="0"))


def check_cmake(cmake: str) -> None:
    """Raises CompileError naming `cmake` and what to install when it is older than MIN_CMAKE."""
    version = cmake_version(cmake)
    if version[:2] < MIN_CMAKE:
        need = ".".join(map(str, MIN_CMAKE))
        raise CompileError(f"{cmake} is CMake {'.'.join(map(str, version))}, ssd needs >= {need}: "
                           f"pip install 'cmake>={need}' into the environment of {sys.executable}")


def find_cxx(environ: dict[str, str] | None = None, path: str | None = None) -> list[str] | None:
    """The C++ compiler CMake will pick, as a command: $CXX, else c++, g++ or clang++
    from PATH (`path`, default $PATH); None when there is none."""
    environ = os.environ if environ is None else environ
    if environ.get("CXX"):
        command = shlex.split(environ["CXX"])
        program = shutil.which(command[0], path=path) if command else None
        return [program, *command[1:]] if program else None
    found = next(filter(None, (shutil.which(name, path=path) for name in ("c++", "g++", "clang++"))), None)
    return [found] if found else None


def cxx_problem(environ: dict[str, str] | None = None, path: str | None = None) -> str | None:
    """One line saying why there is no C++20 compiler to build with, or None when there is one."""
    environ = os.environ if environ is None else environ
    cxx = find_cxx(environ, path)
    if cxx is None:
        looked = f"CXX={environ['CXX']}" if environ.get("CXX") else "c++, g++ or clang++ on PATH"
        return f"no C++ compiler found ({looked}): {INSTALL_CXX}"
    try:
        proc = subprocess.run([*cxx, "-std=c++20", "-fsyntax-only", "-x", "c++", "-"], input=CXX20_PROBE,
                              capture_output=True, text=True, timeout=120)
    except OSError as e:
        return f"the C++ compiler {cxx[0]} does not run ({e.strerror}): {INSTALL_CXX}"
    if proc.returncode != 0:
        first = next((line for line in proc.stderr.splitlines() if line.strip()), "no message")
        return f"the C++ compiler {cxx[0]} does not compile C++20 ({first.strip()}): {INSTALL_CXX}"
    return None


# --- torch -------------------------------------------------------------------

def torch_version() -> str | None:
    """The version of the torch installed beside this Python (its metadata), or None."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_requirement(version: str | None) -> str:
    """The wheel's torch requirement: the X.Y release of `version`, the torch the
    extension is compiled against ("torch==2.13.*"); the minimum without a torch."""
    if version is None:
        return f"torch>={MIN_TORCH}"
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"torch version {version!r} does not start with X.Y")
    return f"torch=={match[1]}.{match[2]}.*"


def torch_cmake_dir() -> Path | None:
    """Torch's CMake package directory (.../torch/share/cmake/Torch) beside this Python, or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "share" / "cmake" / "Torch"


# --- the build folder --------------------------------------------------------

def build_dir_name(python_tag: str, torch: str | None) -> str:
    """The build folder's name for an interpreter and a torch: "py-cp311-torch2.13.0-cpu"."""
    torch_part = "torch-none" if torch is None else "torch" + re.sub(r"[^A-Za-z0-9._-]", "-", torch)
    return f"py-{python_tag}-{torch_part}"


def python_tag() -> str:
    """This interpreter as a wheel tag names it ("cp311")."""
    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    return f"{impl}{sys.version_info.major}{sys.version_info.minor}"


def cache_entry(cache: str, name: str) -> str | None:
    """The value of `name` in the text of a CMakeCache.txt, or None."""
    match = re.search(rf"^{re.escape(name)}:[A-Z]+=(.*)$", cache, re.MULTILINE)
    return match[1] if match else None


def needs_fresh(cache: str, python: str, torch_dir: Path | None) -> bool:
    """Whether a build folder configured with `cache` (CMakeCache.txt's text) was
    configured for another Python or another torch (cmake --fresh then forgets it)."""
    cached_python = cache_entry(cache, "Python_EXECUTABLE")
    if cached_python is not None and cached_python != python:
        return True
    cached_torch = cache_entry(cache, "Torch_DIR")
    if cached_torch is None or torch_dir is None:
        return False
    return Path(cached_torch).resolve() != torch_dir.resolve()


# --- the build ---------------------------------------------------------------

class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_info(self, ext) -> Path:
        """ssd/_build_info.py beside the built extension."""
        return Path(self.get_ext_fullpath(ext.name)).resolve().parent / "_build_info.py"

    def get_outputs(self):
        return [*super().get_outputs(), *(str(self.build_info(ext)) for ext in self.extensions)]

    def build_extension(self, ext):
        cuda = os.environ.get("SSD_CUDA", "auto")
        if cuda not in ("auto", "on", "off"):
            raise CompileError(f"SSD_CUDA must be auto, on or off, got {cuda!r}")
        problem = cxx_problem()
        if problem is not None:
            raise CompileError(problem)
        torch = torch_version()
        if torch is None:
            raise CompileError(f"no torch in the environment of {sys.executable}: "
                               f"pip install 'torch>={MIN_TORCH}' there first")
        cmake = find_tool("cmake", environment_bin_dirs("cmake", "CMAKE_BIN_DIR"))
        check_cmake(cmake)
        ninja = find_tool("ninja", environment_bin_dirs("ninja", "BIN_DIR"))

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("SSD_BUILD_DIR") or ROOT / "build" / build_dir_name(python_tag(), torch))
        build_dir.mkdir(parents=True, exist_ok=True)
        cache = build_dir / "CMakeCache.txt"
        fresh = cache.is_file() and needs_fresh(cache.read_text(errors="replace"), sys.executable, torch_cmake_dir())
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", *(["--fresh"] if fresh else []),
            f"-DCMAKE_MAKE_PROGRAM={ninja}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSSD_CUDA={cuda}",
            f"-DSSD_CUDA_ARCHS={os.environ.get('SSD_CUDA_ARCHS', '80;90')}",
        ]
        if cuda == "off":
            configure.append("-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
        print(f"ssd: building in {build_dir} with {cmake}, {ninja}, torch {torch}", flush=True)
        for step, cmd in (("configure", configure), ("build", [cmake, "--build", str(build_dir), "--target", "_C"])):
            if subprocess.run(cmd).returncode != 0:
                raise CompileError(f"CMake {step} failed in {build_dir} (its output is above)")
        self.build_info(ext).write_text(
            '"""Written by setup.py when it built ssd._C: the torch it was compiled against."""\n'
            f"TORCH_VERSION = {torch!r}\n")


if __name__ == "__main__":
    setup(
        packages=find_packages("python"),
        package_dir={"": "python"},
        install_requires=[torch_requirement(torch_version()), *DEPENDENCIES],
        ext_modules=[CMakeExtension("ssd._C")],
        cmdclass={"build_ext": CMakeBuild},
    )
