"""Running the HTTP server: uvicorn, a drain on SIGTERM, a thread-hosted variant for tests and benchmarks.

SIGTERM (what an orchestrator sends) stops admitting (new requests and
/health get 503), lets running requests finish for up to ``drain_s`` seconds,
then cancels the rest (their responses end with finish_reason "abort"), and
exits. A second signal, or SIGINT, exits at once as uvicorn does.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time

import uvicorn

from ssd.serve.app import ServerState, build_app

log = logging.getLogger("ssd.serve")

# How often the hit-rate watch looks (it judges windows of HitRateWatch.window_s).
_WATCH_EVERY_S = 5.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float):
        super().__init__(config)
        self.state, self.drain_s = state, drain_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        watch = asyncio.ensure_future(self._watch_hit_rate())
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()

    def handle_exit(self, sig, frame):
        if sig == signal.SIGTERM and not self._draining and self._loop is not None:
            self._draining = True
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.drain()))
            return
        super().handle_exit(sig, frame)

    async def drain(self) -> None:
        """Stops admitting, waits for running requests up to drain_s, cancels the rest, then exits."""
        state = self.state
        state.draining = True
        log.info("draining: %d requests in flight, up to %.0f s", state.in_flight, self.drain_s)
        deadline = time.monotonic() + self.drain_s
        while state.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if state.in_flight > 0:
            log.warning("drain deadline passed: cancelling %d requests", state.in_flight)
            state.engine.abort_all()
            end = time.monotonic() + 5.0  # their final chunks reach the clients
            while state.in_flight > 0 and time.monotonic() < end:
                await asyncio.sleep(0.05)
        self.should_exit = True

    async def _watch_hit_rate(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            self.state.hit_rate.check()


def make_server(state: ServerState, *, host: str = "127.0.0.1", port: int = 8000, drain_s: float = 30.0,
                log_level: str = "info") -> DrainingServer:
    config = uvicorn.Config(build_app(state), host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=max(1, int(drain_s) + 10), lifespan="off")
    return DrainingServer(config, state, drain_s)


class ServerThread:
    """The server on a thread of this process, on 127.0.0.1 and a free port (tests, benchmarks).

    >>> with ServerThread(state) as srv: ... srv.url ...
    """

    def __init__(self, state: ServerState, *, drain_s: float = 5.0, start_timeout_s: float = 30.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(state, port=self.port, drain_s=drain_s, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="ssd-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the ssd server did not start")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
