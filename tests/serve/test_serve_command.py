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
from tests.reference.processes import assert_gone, free_port, tensor_parallel_workers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")


class Served:
    def __init__(self, *args):
        self.port = free_port()
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


def test_a_lost_tensor_parallel_rank_ends_requests_and_exits_1(serve_factory):
    """ssd serve --tensor-parallel-size 2 answers the openai client; a killed worker ends the running
    request with an error, /health turns to "failed", and the server exits 1 leaving no process."""
    import openai

    srv = serve_factory("--tensor-parallel-size", "2", "--kv-cache-gib", "0.25")
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8 and r.choices[0].text
    workers = tensor_parallel_workers(srv.proc.pid)
    assert len(workers) == 1
    cm, lines, _ = _stream_until_first_chunk(srv.url, 450)
    workers[0].kill()
    t0 = time.monotonic()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    cm.__exit__(None, None, None)
    errors = [e["error"]["message"] for e in events if "error" in e]
    assert errors and "tensor parallelism" in errors[0], events[-3:]
    health = []
    while srv.proc.poll() is None and time.monotonic() - t0 < 30:
        try:
            r = httpx.get(srv.url + "/health", timeout=1)
            health.append((r.status_code, r.json()["status"]))
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    assert srv.proc.wait(30) == 1
    assert all(h == (503, "failed") for h in health), health
    assert "the engine failed" in srv.proc.stdout.read()
    assert_gone([w.pid for w in workers])


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


def test_sigint_drains_as_sigterm_does(serve_factory):
    srv = serve_factory("--drain-timeout", "60")
    cm, lines, _ = _stream_until_first_chunk(srv.url, 48)
    srv.proc.send_signal(signal.SIGINT)
    assert _rest(lines) == ("length", 48)
    cm.__exit__(None, None, None)
    assert srv.proc.wait(30) == 0, srv.proc.stdout.read()  # uvicorn's own handling: -2


def test_a_second_signal_exits_at_once(serve_factory):
    srv = serve_factory("--drain-timeout", "60")
    cm, lines, _ = _stream_until_first_chunk(srv.url, 480)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    status = srv.proc.wait(30)
    assert time.monotonic() - t0 < 3.0 and status == 1, (time.monotonic() - t0, status, srv.proc.stdout.read())
    cm.__exit__(None, None, None)


def test_the_drain_deadline_covers_half_sent_bodies(serve_factory):
    """A body still arriving when the deadline passes gets 503 and the server exits 0 within the deadline
    plus its final grace (3 s); uvicorn's graceful shutdown used to add 10 s for the open connection."""
    srv = serve_factory("--drain-timeout", "2")
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"model\": ")
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    data = b""
    while piece := sock.recv(65536):
        data += piece
    assert data.startswith(b"HTTP/1.1 503") and b"shutting down" in data, data
    assert srv.proc.wait(30) == 0, srv.proc.stdout.read()
    assert time.monotonic() - t0 < 2 + 3 + 1


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_large_bodies_stall_no_one_and_leave_no_memory(serve_factory):
    """Five bodies just under the size limit are each tokenised (on a worker thread) and refused for length;
    meanwhile a stream's gaps between chunks stay under 0.5 s and /health answers within 0.1 s, and the
    server's RSS after the fifth is within 50 MB of its RSS after the first. (Before: tokenising on the event
    loop stalled both for seconds, and each 4 MB body left about 150 MB behind.)"""
    import threading

    limit = 2_000_000
    srv = serve_factory("--max-body-bytes", str(limit))
    text = "The quick brown fox jumps over the lazy dog 12345. " * (limit // 50)
    body = json.dumps({"model": "smollm2", "max_tokens": 4,
                       "messages": [{"role": "user", "content": text[:limit - 200]}]}).encode()
    assert limit - 1000 < len(body) <= limit
    gaps, health, stop = [], [], threading.Event()

    def stream():  # one stream after another, until the bodies are done; the gaps after each first chunk
        while not stop.is_set():
            cm, lines, _ = _stream_until_first_chunk(srv.url, 400)
            last = time.monotonic()
            for line in lines:
                if line.startswith("data: "):
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                if stop.is_set():
                    break
            cm.__exit__(None, None, None)

    def poll():
        with httpx.Client() as client:
            while not stop.is_set():
                t = time.monotonic()
                assert client.get(srv.url + "/health", timeout=10).status_code == 200
                health.append(time.monotonic() - t)
                time.sleep(0.05)

    threads = [threading.Thread(target=stream), threading.Thread(target=poll)]
    for t in threads:
        t.start()
    rss = []
    try:
        time.sleep(1.0)
        for _ in range(5):
            r = httpx.post(srv.url + "/v1/chat/completions", content=body, timeout=120,
                           headers={"content-type": "application/json"})
            assert r.status_code == 400 and "do not fit max_model_len" in r.json()["error"]["message"], r.text
            rss.append(_rss_mb(srv.proc.pid))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert len(gaps) > 20 and max(gaps) < 0.5, sorted(gaps)[-5:]
    assert len(health) > 20 and max(health) < 0.1, sorted(health)[-5:]
    assert abs(rss[-1] - rss[0]) < 50, rss
