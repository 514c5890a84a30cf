"""The `ssd serve` command as a process: startup, SIGTERM drains (running requests finish, new ones
get 503), a drain deadline cancels what is left, and the process exits 0."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ssd.assets import smollm2_gguf_path

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, *args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ssd.cli", "serve", str(smollm2_gguf_path()), "--port", str(self.port),
             "--served-model-name", "smollm2", "--max-model-len", "512", "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "ssd serve did not start"
            time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def serve_factory():
    started = []

    def start(*args):
        started.append(Served(*args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _stream_until_first_chunk(url, max_tokens):
    body = {"model": "smollm2", "prompt": "Tell me a story:", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    cm = httpx.stream("POST", url + "/v1/completions", json=body, timeout=120)
    response = cm.__enter__()
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data: "):
            return cm, lines, json.loads(line[6:])
    raise AssertionError("no chunk")


def _rest(lines) -> tuple[str | None, int | None]:
    """Reads the stream to [DONE]: (last finish_reason, usage.completion_tokens)."""
    reason = tokens = None
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        part = json.loads(line[6:])
        for c in part.get("choices", []):
            reason = c.get("finish_reason") or reason
        if part.get("usage"):
            tokens = part["usage"]["completion_tokens"]
    return reason, tokens


def test_sigterm_lets_running_requests_finish(serve_factory):
    srv = serve_factory("--drain-timeout", "60")
    cm, lines, _ = _stream_until_first_chunk(srv.url, 240)  # long enough to outlast the checks below
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    r = httpx.post(srv.url + "/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["message"] == "the server is shutting down", r.text
    assert httpx.get(srv.url + "/health").status_code == 503
    assert _rest(lines) == ("length", 240)  # the running request got all its tokens
    cm.__exit__(None, None, None)
    assert srv.proc.wait(60) == 0, srv.proc.stdout.read()


def test_the_drain_deadline_cancels_what_is_left(serve_factory):
    srv = serve_factory("--drain-timeout", "1")
    cm, lines, _ = _stream_until_first_chunk(srv.url, 450)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    reason, tokens = _rest(lines)
    cm.__exit__(None, None, None)
    assert reason == "abort" and 0 < tokens < 450, (reason, tokens)
    assert srv.proc.wait(60) == 0, srv.proc.stdout.read()
    assert time.monotonic() - t0 < 30


def test_serve_takes_every_engine_field():
    import dataclasses

    from ssd import EngineConfig

    help_text = subprocess.run([sys.executable, "-m", "ssd.cli", "serve", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    for f in dataclasses.fields(EngineConfig):
        assert f"--{f.name.replace('_', '-')}" in help_text, f.name


def test_bad_engine_values_exit_2_naming_the_field():
    r = subprocess.run([sys.executable, "-m", "ssd.cli", "serve", str(smollm2_gguf_path()), "--k", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "ssd serve: k: must be > 0" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "ssd.cli", "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: ssd COMMAND" in r.stdout
