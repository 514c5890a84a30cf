"""What every HTTP request passes before a handler sees it (an ASGI middleware).

* the API key: ``Authorization: Bearer KEY`` (the scheme in any case, the key
  compared in constant time) on /v1/ endpoints, and on /metrics when asked;
* the body: at most ``max_body_bytes`` (413 past it, before reading it when
  Content-Length says so), read in full within ``body_timeout_s`` of the
  request's start (408 past it), and cut with a 503 when a drain's deadline
  passes; the handler then gets it at once;
* ``ServerState.http_active`` counts the requests inside, for the drain.

A refusal here closes the connection (``Connection: close``): the rest of its
body is never read. The limits on connections and on the time a request's
headers may take are the HTTP protocol's (``connections.py``).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import sys

from ssd.serve.protocol import RequestError


def too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than this server takes ({limit} bytes)", status=413,
                        code="request_too_large")


def timed_out(what: str, seconds: float) -> RequestError:
    return RequestError(f"the request's {what} did not arrive within {seconds:g} s", status=408,
                        code="request_timeout")


SHUTTING_DOWN = dict(status=503, type="server_unavailable", headers={"Retry-After": "5"})


def error_bytes(err: RequestError) -> bytes:
    return json.dumps(err.body(), ensure_ascii=False, separators=(",", ":")).encode()


async def send_error(send, err: RequestError, close: bool = False) -> None:
    """The error as a whole response (OpenAI's shape), over ASGI."""
    body = error_bytes(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def authorized(headers, key: str) -> bool:
    """``Authorization: Bearer <key>``, the scheme in any case, the key compared in constant time."""
    value = next((v for k, v in headers if k == b"authorization"), b"")
    scheme, _, token = value.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())


class _TooLarge(Exception):
    pass


class _Left(Exception):
    pass


async def _read_all(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Left
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class Guard:
    """The ASGI middleware (module docstring); ``state``: the ServerState."""

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = self.state
        state.http_active += 1
        try:
            path = scope["path"]
            if state.api_key and (path.startswith("/v1/") or (state.protect_metrics and path == "/metrics")):
                if not authorized(scope["headers"], state.api_key):
                    return await send_error(send, RequestError(
                        "invalid or missing API key", status=401, type="authentication_error",
                        code="invalid_api_key"))
            body = await self._body(scope, receive, send)
            if body is None:
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            state.http_active -= 1

    async def _body(self, scope, receive, send) -> bytes | None:
        """The whole body, or None once a refusal was sent (or the client left)."""
        limits = self.state.limits
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            await send_error(send, too_large(limits.max_body_bytes), close=True)
            return None
        reading = asyncio.ensure_future(_read_all(receive, limits.max_body_bytes))
        stopped: list[str] = []

        def stop(why: str) -> None:
            stopped.append(why)
            reading.cancel()

        timer = asyncio.get_running_loop().call_later(limits.body_timeout_s, stop, "timeout")
        cut = lambda: stop("drain")  # noqa: E731
        self.state.body_cuts.add(cut)
        try:
            return await reading
        except _TooLarge:
            await send_error(send, too_large(limits.max_body_bytes), close=True)
        except _Left:
            pass
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if not stopped or (sys.version_info >= (3, 11) and this is not None and this.cancelling()):
                raise  # the request's own task was cancelled
            if stopped[0] == "timeout":
                await send_error(send, timed_out("body", limits.body_timeout_s), close=True)
            else:
                await send_error(send, RequestError("the server is shutting down", **SHUTTING_DOWN), close=True)
        finally:
            timer.cancel()
            self.state.body_cuts.discard(cut)
            reading.cancel()
        return None


def _replay(body: bytes, receive):
    """A receive that gives the body read already, then the client's own messages (its disconnect)."""
    given = False

    async def replay():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
