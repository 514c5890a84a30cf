"""Models by name: ``org/name`` found in the local HuggingFace cache, never downloaded.

``resolve_model(source)`` turns what a user passed as a model into a path:

* a path that exists is returned as is (it always wins over a name);
* ``org/name`` (or a bare ``name``) is looked up in the HuggingFace hub cache:
  ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
  else ``~/.cache/huggingface/hub``, as ``huggingface_hub`` lays it out:
  ``models--org--name/refs/main`` holds a commit hash and
  ``models--org--name/snapshots/<hash>/`` the files. Without ``refs/main``
  the one snapshot there is used;
* ``org/name/FILE.gguf`` is one file of a repository's snapshot.

A snapshot with ``config.json`` is an HF model directory; one without it but
with exactly one ``.gguf`` file is that file (several: ModelLoadError listing
them). Anything not found raises ModelLoadError naming every place looked at.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ModelLoadError

# A repository id: one or two parts of letters, digits, '-', '_' and '.', as the hub allows.
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_cache_dir() -> tuple[Path, str]:
    """The hub cache directory and where it came from (the environment variable, or the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser(), "$HF_HUB_CACHE"
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub", "$HF_HOME/hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub", \
            "$XDG_CACHE_HOME/huggingface/hub"
    return Path.home() / ".cache" / "huggingface" / "hub", "the default"


def split_model_name(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, file in the snapshot or None)`` when ``name`` reads as a model name, else None.

    ``org/name`` and ``name`` are repositories; ``org/name/path/to/FILE.gguf``
    is a file inside one.
    """
    parts = name.split("/")
    if not all(_PART.fullmatch(p) for p in parts) or any(p in (".", "..") for p in parts):
        return None
    if len(parts) <= 2:
        return name, None
    return "/".join(parts[:2]), "/".join(parts[2:])


def resolve_model(source: str | os.PathLike) -> Path:
    """The path ``source`` names: itself when it exists, else its snapshot in the hub cache.

    Raises:
        ModelLoadError: neither a path that exists nor a model in the cache; the
            message names the path and the cache entry looked at.
    """
    path = Path(source).expanduser()
    if path.exists():
        return path
    text = os.fspath(source)
    parsed = split_model_name(text)
    if parsed is None:
        raise ModelLoadError(f"model path does not exist: {path}")
    repo_id, file = parsed
    cache, origin = hub_cache_dir()
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"

    def not_found(detail: str) -> ModelLoadError:
        return ModelLoadError(
            f"model {text!r} not found: the path {path.absolute()} does not exist, and the HuggingFace cache "
            f"{cache} ({origin}) has {detail}. ssd never downloads models: fetch it first "
            f"(huggingface-cli download {repo_id}) or pass a path")

    if not repo_dir.is_dir():
        raise not_found(f"no {repo_dir.name}")
    snapshot = _snapshot(repo_dir, not_found)
    if file is not None:
        target = snapshot / file
        if not target.is_file():
            raise not_found(f"no {file} in snapshot {snapshot}")
        return target
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf") if p.is_file())
    if len(ggufs) == 1:
        return snapshot / ggufs[0]
    if not ggufs:
        raise ModelLoadError(f"model {text!r}: snapshot {snapshot} has neither config.json nor a .gguf file")
    raise ModelLoadError(f"model {text!r}: snapshot {snapshot} holds {len(ggufs)} GGUF files "
                         f"({', '.join(ggufs)}); pick one: {repo_id}/FILE.gguf or the file's path")


def _snapshot(repo_dir: Path, not_found) -> Path:
    """The snapshot ``refs/main`` points at, else the only one there."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        try:
            commit = ref.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read {ref}: {exc}") from exc
        snapshot = repo_dir / "snapshots" / commit
        if not commit or not snapshot.is_dir():
            raise not_found(f"{ref} naming commit {commit!r} but no snapshot {snapshot}")
        return snapshot
    snapshots_dir = repo_dir / "snapshots"
    snapshots = sorted(p for p in snapshots_dir.iterdir() if p.is_dir()) if snapshots_dir.is_dir() else []
    if len(snapshots) == 1:
        return snapshots[0]
    if not snapshots:
        raise not_found(f"no {ref} and no snapshot in {snapshots_dir}")
    raise ModelLoadError(f"{repo_dir} has no refs/main and {len(snapshots)} snapshots "
                         f"({', '.join(p.name for p in snapshots)}); pass the path of the one to use")

