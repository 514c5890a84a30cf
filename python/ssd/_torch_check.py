"""The torch ssd._C was compiled against, checked before _C loads.

setup.py records that torch in ssd/_build_info.py; beside another torch
release, loading _C would fail with an undefined symbol, so ``import ssd``
raises an ImportError naming both versions instead.
"""
from __future__ import annotations

import importlib.util
import re
import sys


def torch_version() -> str | None:
    """The version of the torch ``import torch`` loads, read from its torch/version.py
    without importing it (torch is heavy); None without a torch or that file."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(f"{folder}/version.py", encoding="utf-8") as f:
                match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.MULTILINE)
        except OSError:
            continue
        return match[1] if match else None
    return None


def release(version: str) -> str:
    """The "X.Y" of a torch version: the part an extension is tied to."""
    match = re.match(r"\d+\.\d+", version)
    return match[0] if match else version


def check_torch() -> None:
    """Raises ImportError naming both versions when the torch here is not the X.Y
    release ssd._C was compiled against (ssd/_build_info.py, written by setup.py):
    loading _C would fail with an undefined symbol. A build by hand records nothing."""
    try:
        from ssd._build_info import TORCH_VERSION as built
    except ImportError:
        return
    found = torch_version()
    if found is None:
        return  # importing torch will say it is missing
    if release(found) != release(built):
        raise ImportError(f"ssd was built against torch {built}, but this environment has torch {found}: "
                          f"install torch=={release(built)}.* or rebuild ssd here "
                          f"(pip install --no-build-isolation --force-reinstall .)")
