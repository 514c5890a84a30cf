"""Models by name (``org/name``) in a local HuggingFace cache: which directory, which snapshot, which
file, and the errors. Every cache here is built by hand under tmp_path in huggingface_hub's layout
(``models--org--name/{blobs,refs/main,snapshots/<commit>}``, snapshot files linked to blobs)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ssd.assets import smollm2_gguf_path
from ssd.models import ModelLoadError, load, load_tokenizer
from ssd.models.hub_cache import resolve_model
from tests.reference.tiny_models import TinySpec, build_tiny_model

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


@pytest.fixture
def cache_env(monkeypatch, tmp_path):
    """No HuggingFace variable set and a fresh home: each test sets what it means."""
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def add_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, Path | bytes], *,
                 main: bool = True) -> Path:
    """A snapshot of ``repo_id`` whose files are links to blobs (as huggingface_hub writes them);
    ``files`` maps a name in the snapshot to a file or to bytes. ``main``: refs/main names it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for i, (name, content) in enumerate(files.items()):
        blob = repo / "blobs" / f"{commit[:8]}{i:04d}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            blob.symlink_to(content)  # a copy in the real cache; a link keeps the test light
        else:
            blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """Two tiny checkpoints whose weights differ (seeds 1 and 2): {seed: (directory, embedding)}."""
    root = tmp_path_factory.mktemp("hub_tiny")
    out = {}
    for seed in (1, 2):
        directory, hf_model = build_tiny_model(TinySpec(vocab_size=64, num_layers=1, seed=seed), root / f"s{seed}")
        out[seed] = (directory, hf_model.model.embed_tokens.weight.detach().clone())
    return out


def checkpoint_files(directory: Path) -> dict[str, Path]:
    return {p.name: p for p in directory.iterdir() if p.is_file()}


def test_a_name_loads_the_snapshot_refs_main_names(cache_env, tmp_path, tiny_checkpoints):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HUB_CACHE", str(cache))
    (dir_1, embed_1), (dir_2, embed_2) = tiny_checkpoints[1], tiny_checkpoints[2]
    add_snapshot(cache, "org/tiny", COMMIT_A, checkpoint_files(dir_1), main=False)
    snapshot = add_snapshot(cache, "org/tiny", COMMIT_B, checkpoint_files(dir_2))  # refs/main: B
    assert resolve_model("org/tiny") == snapshot
    model = load("org/tiny")
    assert torch.equal(model.weights["model.embed_tokens.weight"], embed_2)
    assert not torch.equal(embed_1, embed_2)


def test_without_refs_main_the_one_snapshot_is_used(cache_env, tmp_path, tiny_checkpoints):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HUB_CACHE", str(cache))
    directory, embed = tiny_checkpoints[1]
    snapshot = add_snapshot(cache, "org/tiny", COMMIT_A, checkpoint_files(directory), main=False)
    assert resolve_model("org/tiny") == snapshot
    assert torch.equal(load("org/tiny").weights["model.embed_tokens.weight"], embed)
    add_snapshot(cache, "org/tiny", COMMIT_B, {"config.json": b"{}"}, main=False)
    with pytest.raises(ModelLoadError, match="no refs/main and 2 snapshots") as info:
        resolve_model("org/tiny")
    assert COMMIT_A in str(info.value) and COMMIT_B in str(info.value)


@pytest.mark.parametrize("where", ["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "default"])
def test_the_cache_directory_follows_the_environment(cache_env, tmp_path, where):
    """$HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub; a variable set lower in that order is not looked at."""
    caches = {"HF_HUB_CACHE": tmp_path / "hub_cache", "HF_HOME": tmp_path / "hf_home" / "hub",
              "XDG_CACHE_HOME": tmp_path / "xdg" / "huggingface" / "hub",
              "default": tmp_path / "home" / ".cache" / "huggingface" / "hub"}
    values = {"HF_HUB_CACHE": caches["HF_HUB_CACHE"], "HF_HOME": tmp_path / "hf_home",
              "XDG_CACHE_HOME": tmp_path / "xdg"}
    order = list(caches)
    for name in order[order.index(where):-1]:  # the chosen variable and every one below it
        cache_env.setenv(name, str(values[name]))
    for cache in caches.values():  # the same name in every cache
        add_snapshot(cache, "org/one", COMMIT_A, {"m.gguf": b"GGUF"})
    assert resolve_model("org/one").parent.parent.parent.parent == caches[where]


def test_a_missing_name_names_every_place_looked_at(cache_env, tmp_path):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(ModelLoadError) as info:
        load("org/absent")
    message = str(info.value)
    assert str(tmp_path / "org" / "absent") in message  # the path, from the working directory
    assert str(cache) in message and "HF_HUB_CACHE" in message and "models--org--absent" in message
    with pytest.raises(ModelLoadError, match="models--org--absent"):
        load_tokenizer("org/absent")
    # refs/main naming a snapshot that is not there
    add_snapshot(cache, "org/broken", COMMIT_A, {"config.json": b"{}"})
    (cache / "models--org--broken" / "refs" / "main").write_text(COMMIT_B)
    with pytest.raises(ModelLoadError, match=f"{COMMIT_B}.*no snapshot"):
        resolve_model("org/broken")
    # not a name at all: only the path is reported
    with pytest.raises(ModelLoadError, match="model path does not exist") as info:
        load(tmp_path / "no" / "such.gguf")
    assert "HuggingFace" not in str(info.value)


def test_an_existing_path_wins_over_a_name(cache_env, tmp_path, tiny_checkpoints):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HUB_CACHE", str(cache))
    (dir_1, embed_1), (dir_2, _) = tiny_checkpoints[1], tiny_checkpoints[2]
    add_snapshot(cache, "org/tiny", COMMIT_A, checkpoint_files(dir_2))
    shutil.copytree(dir_1, tmp_path / "org" / "tiny")  # ./org/tiny, relative to the working directory
    assert resolve_model("org/tiny") == Path("org/tiny")
    assert torch.equal(load("org/tiny").weights["model.embed_tokens.weight"], embed_1)


def test_a_gguf_repository_with_one_file_is_that_file(cache_env, tmp_path):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HOME", str(tmp_path / "hf"))
    gguf = smollm2_gguf_path()
    snapshot = add_snapshot(tmp_path / "hf" / "hub", "org/smol-gguf", COMMIT_A,
                            {"README.md": b"# model card", "SmolLM2.Q4_1.gguf": gguf})
    assert resolve_model("org/smol-gguf") == snapshot / "SmolLM2.Q4_1.gguf"
    by_name, by_path = load_tokenizer("org/smol-gguf"), load_tokenizer(gguf)
    text = "Hello world, naïve café 12345"
    assert by_name.encode(text) == by_path.encode(text) != []
    assert not cache.exists()


def test_a_gguf_repository_with_several_files_asks_for_one(cache_env, tmp_path):
    cache = tmp_path / "hub"
    cache_env.setenv("HF_HUB_CACHE", str(cache))
    snapshot = add_snapshot(cache, "org/quants", COMMIT_A,
                            {"m.Q4_0.gguf": b"GGUF", "m.Q8_0.gguf": b"GGUF", "f16/m.F16.gguf": b"GGUF"})
    with pytest.raises(ModelLoadError) as info:
        resolve_model("org/quants")
    message = str(info.value)
    for name in ("m.Q4_0.gguf", "m.Q8_0.gguf", "f16/m.F16.gguf", "org/quants/FILE.gguf"):
        assert name in message, name
    assert resolve_model("org/quants/m.Q8_0.gguf") == snapshot / "m.Q8_0.gguf"
    assert resolve_model("org/quants/f16/m.F16.gguf") == snapshot / "f16" / "m.F16.gguf"
    with pytest.raises(ModelLoadError, match="no m.Q2_K.gguf in snapshot"):
        resolve_model("org/quants/m.Q2_K.gguf")
    add_snapshot(cache, "org/empty", COMMIT_A, {"README.md": b"# nothing"})
    with pytest.raises(ModelLoadError, match="neither config.json nor a .gguf file"):
        resolve_model("org/empty")
