"""Connections: uvicorn's HTTP/1.1 protocol (h11) with a deadline on headers and a cap on connections.

uvicorn times out only idle keep-alive connections: a client that opens a
connection and sends nothing, or sends its headers a byte at a time, holds it
for ever. Here a request's headers must be complete within
``header_timeout_s`` of the connection's opening or of the request's first
byte (else 408, and the connection is closed), and a connection beyond
``max_connections`` open ones has its request answered 503 and is closed.
Either way the answer is OpenAI's error shape. Everything else is uvicorn's.
"""
from __future__ import annotations

import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

from ssd.config import ServerLimits
from ssd.serve.guard import error_bytes, send_error, timed_out
from ssd.serve.protocol import RequestError

log = logging.getLogger("ssd.serve")


def protocol_class(limits: ServerLimits) -> type[H11Protocol]:
    """The protocol class for a uvicorn Config (``http=``), with these limits."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": limits})


def _over_capacity(max_connections: int) -> RequestError:
    return RequestError(f"the server has its maximum of {max_connections} connections open; retry later",
                        status=503, type="server_overloaded", headers={"Retry-After": "1"})


class LimitedH11Protocol(H11Protocol):
    limits: ServerLimits = ServerLimits()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        if len(self.connections) > self.limits.max_connections:
            log.warning("connection refused: %d connections open", len(self.connections))
            refusal = _over_capacity(self.limits.max_connections)

            async def refuse(scope, receive, send):
                await send_error(send, refusal, close=True)

            self.app = refuse  # this connection's request gets the refusal, not the API
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._await_headers()
        super().data_received(data)
        if not self._between_requests() and self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_headers(self) -> None:
        """Starts the headers' deadline (at the opening, and at a later request's first byte: between
        requests an idle connection is uvicorn's keep-alive timeout's)."""
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._between_requests() or self.transport.is_closing():
            return
        body = error_bytes(timed_out("headers", self.limits.header_timeout_s))
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()
