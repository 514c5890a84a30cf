"""Connections over real sockets (ssd serve on a thread, SmolLM2, mode ar): a client that leaves a non-streamed
request cancels it, headers and bodies that do not arrive in time get 408, connections past the cap get 503,
a body past the limit gets 413, and the server answers others meanwhile."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from ssd import LLM
from ssd.assets import smollm2_gguf_path
from ssd.async_llm import AsyncLLM
from ssd.config import ServerLimits
from ssd.serve import ServerState, ServerThread
from tests.serve.test_server import _scrape, wait_idle

MODEL = "smollm2"


@pytest.fixture(scope="module")
def llm():
    with LLM(str(smollm2_gguf_path()), max_model_len=512, max_batch=8, kv_cache_gib=0.5) as llm:
        yield llm


def serve(llm, **limits) -> ServerThread:
    return ServerThread(ServerState(AsyncLLM(llm), model_name=MODEL, max_in_flight=64, limits=ServerLimits(**limits)))


def connect(srv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=30)


def request_bytes(body: dict, path="/v1/completions") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def response(sock: socket.socket) -> tuple[int, dict, bool]:
    """(status, JSON body, closed after it) of the one response a socket gets."""
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body), True


def test_a_non_streamed_request_whose_client_left_is_cancelled(llm):
    """The disconnect watch never fired behind the auth middleware (Starlette's BaseHTTPMiddleware: its
    receive runs in a task group that is_disconnected()'s cancelled scope cancels before it returns):
    the request ran to max_tokens. Now it ends within a second."""
    with serve(llm) as srv:
        state = srv.server.state
        aborted = 'ssd_requests_total{"finish_reason": "abort"}'
        before = _scrape(srv).get(aborted, 0)
        sock = connect(srv)
        sock.sendall(request_bytes({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 480,
                                    "ignore_eos": True, "temperature": 0}))
        end = time.monotonic() + 30
        while llm.stats()["num_running"] == 0:
            assert time.monotonic() < end
            time.sleep(0.01)
        sock.close()
        t0 = time.monotonic()
        stats = wait_idle(llm, state, timeout=1.0)  # 480 tokens take far longer
        assert time.monotonic() - t0 < 1.0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
        assert _scrape(srv)[aborted] - before == 1


def test_slow_headers_and_silent_connections_time_out_while_others_are_served(llm):
    with serve(llm, header_timeout_s=1.0) as srv:
        silent, slow = connect(srv), connect(srv)
        t0 = time.monotonic()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        i = 0
        while time.monotonic() - t0 < 0.8:  # a byte every 0.1 s: the headers are never done
            slow.send(head[i:i + 1])
            i += 1
            assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
            time.sleep(0.1)
        status, err, _ = response(slow)
        assert status == 408 and err["error"]["code"] == "request_timeout", err
        assert 1.0 <= time.monotonic() - t0 < 3.0
        status, err, _ = response(silent)  # opened and never sent a byte
        assert status == 408, err
        # A request whose headers arrive in time, on a connection kept alive, is served both times.
        with httpx.Client() as client:
            for _ in range(2):
                r = client.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
                assert r.status_code == 200, r.text
                time.sleep(1.5)  # idle between requests is the keep-alive timeout's, not the headers'


def test_a_half_sent_body_times_out(llm):
    with serve(llm, body_timeout_s=1.0) as srv:
        sock = connect(srv)
        whole = request_bytes({"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        sock.sendall(whole[:-5])
        t0 = time.monotonic()
        status, err, _ = response(sock)
        assert status == 408 and err["error"]["code"] == "request_timeout", err
        assert 1.0 <= time.monotonic() - t0 < 3.0
        assert srv.server.state.http_active == 0


def test_connections_past_the_cap_get_503_and_the_rest_are_served(llm):
    with serve(llm, max_connections=3, header_timeout_s=60) as srv:
        held = [connect(srv) for _ in range(3)]
        time.sleep(0.2)
        extra = connect(srv)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, err, _ = response(extra)
        assert status == 503 and err["error"]["type"] == "server_overloaded", err
        held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, body, _ = response(held[0])
        assert status == 200 and body == {"status": "ok"}
        for s in held:
            s.close()
        time.sleep(0.2)
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_a_body_past_the_limit_gets_413(llm):
    with serve(llm, max_body_bytes=10_000) as srv:
        big = {"model": MODEL, "prompt": "word " * 4000, "max_tokens": 2}
        r = httpx.post(srv.url + "/v1/completions", json=big, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
        sock = connect(srv)  # no Content-Length: refused once past the limit
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"1000\r\n" + b" " * 4096 + b"\r\n" * 1)
        sock.sendall((b"1000\r\n" + b" " * 4096 + b"\r\n") * 2)
        status, err, _ = response(sock)
        assert status == 413, err
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
