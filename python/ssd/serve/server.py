"""Running the HTTP server: uvicorn, a drain on SIGTERM or SIGINT, a thread-hosted variant for tests and benchmarks.

The first SIGTERM or SIGINT stops admitting (new requests and /health get
503), lets running requests finish and half-sent bodies arrive for up to
``drain_s`` seconds, then cancels what is left (responses end with
finish_reason "abort", unfinished bodies get 503), and the server exits:
``run()`` returns, within ``drain_s`` plus at most ``_FINAL_S`` and uvicorn's
``_CLOSE_S``. A second signal exits at once: requests are cancelled, nothing
is waited for, and ``forced`` is set (``ssd serve`` then exits 1, else 0).

An engine that fails (a tensor-parallel rank lost: ``LLM.failure()``) ends
every request with an error; within ``_FAILURE_WATCH_S`` the server notices,
/health says "failed" (503, at once), and it exits as after a drain's
deadline with ``failed`` set (``ssd serve`` exits 1).
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
from ssd.serve.connections import protocol_class

log = logging.getLogger("ssd.serve")

# How often the hit-rate watch looks (it judges windows of HitRateWatch.window_s).
_WATCH_EVERY_S = 5.0
# How often the server asks whether the engine has failed.
_FAILURE_WATCH_S = 0.5
# After a drain's deadline: how long cancelled requests have to send their last chunks, and how long
# uvicorn then waits for connections to close before it cancels what is left.
_FINAL_S = 2.0
_CLOSE_S = 1.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float):
        super().__init__(config)
        self.state, self.drain_s = state, drain_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self.forced = False
        self.failed = False

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        watches = [asyncio.ensure_future(self._watch_hit_rate()), asyncio.ensure_future(self._watch_failure())]
        try:
            await super().serve(sockets)
        finally:
            for w in watches:
                w.cancel()

    def handle_exit(self, sig, frame):
        """The signal handler uvicorn installs (SIGINT, SIGTERM): the first drains, a second exits at once.

        Runs on the main thread, which runs the event loop: it only sets flags and schedules work.
        """
        if self._loop is None:
            return super().handle_exit(sig, frame)
        if not self._draining:
            self._draining = True
            log.info("%s: draining (a second signal exits at once)", signal.Signals(sig).name)
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.drain()))
            return
        log.warning("%s again: exiting at once, cancelling %d requests", signal.Signals(sig).name,
                    self.state.in_flight)
        self.forced = True
        self.should_exit = self.force_exit = True
        self._loop.call_soon_threadsafe(self.state.engine.abort_all)

    async def drain(self, drain_s: float | None = None) -> None:
        """Stops admitting, waits for running requests and bodies up to drain_s, cancels the rest, then exits."""
        state = self.state
        state.draining = True
        drain_s = self.drain_s if drain_s is None else drain_s
        log.info("draining: %d requests in flight, up to %.0f s", state.in_flight, drain_s)
        deadline = time.monotonic() + drain_s
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._busy():
            log.warning("drain deadline passed: cancelling %d requests", state.in_flight)
            state.cut_body_reads()
            state.engine.abort_all()
            end = time.monotonic() + _FINAL_S  # their final chunks reach the clients
            while self._busy() and time.monotonic() < end:
                await asyncio.sleep(0.05)
        self.should_exit = True

    def _busy(self) -> bool:
        return self.state.in_flight > 0 or self.state.http_active > 0

    async def _watch_failure(self) -> None:
        while True:
            await asyncio.sleep(_FAILURE_WATCH_S)
            failure = self.state.failure()
            if failure:
                break
        log.error("the engine failed: %s; exiting", failure)
        self.failed = True
        self._draining = True
        # Its requests have ended with an error already: what is left is sending them.
        await self.drain(drain_s=_FINAL_S)

    async def _watch_hit_rate(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            self.state.hit_rate.check()


def make_server(state: ServerState, *, host: str = "127.0.0.1", port: int = 8000, drain_s: float = 30.0,
                log_level: str = "info") -> DrainingServer:
    config = uvicorn.Config(build_app(state), host=host, port=port, log_level=log_level, access_log=False,
                            http=protocol_class(state.limits), timeout_graceful_shutdown=_CLOSE_S,
                            lifespan="off")
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
