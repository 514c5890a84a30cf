"""Builds ssd._C through CMake. Environment: SSD_CUDA=auto|on|off, SSD_NATIVE=1|0,
SSD_CUDA_ARCHS (GPU architectures, default "80;90"), SSD_BUILD_DIR (default build/py,
kept between builds for incremental rebuilds)."""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("SSD_BUILD_DIR", ROOT / "build" / "py"))
        build_dir.mkdir(parents=True, exist_ok=True)
        cuda = os.environ.get("SSD_CUDA", "auto")
        if cuda not in ("auto", "on", "off"):
            raise ValueError(f"SSD_CUDA must be auto, on or off, got {cuda!r}")
        native = "OFF" if os.environ.get("SSD_NATIVE", "1") == "0" else "ON"
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSSD_CUDA={cuda}",
            f"-DSSD_NATIVE={native}",
            f"-DSSD_CUDA_ARCHS={os.environ.get('SSD_CUDA_ARCHS', '80;90')}",
        ]
        if cuda == "off":
            configure.append("-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_C"], check=True)


setup(
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("ssd._C")],
    cmdclass={"build_ext": CMakeBuild},
)
