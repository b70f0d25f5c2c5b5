"""One HTTP connection: aiohttp's own handler, with the cap on open connections and deadlines
for a request that arrives too slowly.

aiohttp already bounds what a request may be (``max_line_size``/``max_field_size``/
``max_headers``, ``client_max_size``) and closes a connection idle between requests
(``keepalive_timeout``, from which ``http.idle_timeout`` is set: it runs from the connection's
start, or its last response, to a complete request head). It has no deadline for the bytes of
one request, so a client sending its headers or body a byte at a time was held as long as it
liked. That is added here, as a timer per connection:

* the headers: from the first byte of a request to its last header (``http.header_timeout``);
* the body: from the headers to the body's last byte (``http.body_timeout``).

Either answers 408 (the handler has sent nothing yet, so the status line is still ours) and
closes the connection. A connection over ``http.max_connections`` is served one 503 (with
``Retry-After``) for its first request, then closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from ...settings import HttpSettings
from ..limits import Connections


def raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole response that closes the connection, written straight to the socket: for the
    moments aiohttp has no request (slow headers) or is waiting on one (a slow body)."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class Connection(web.RequestHandler):
    """aiohttp's handler for one connection, counted against the cap and timed while a
    request arrives. The front's middleware calls ``serving`` / ``served`` around each
    request."""

    def __init__(self, manager: web.Server, settings: HttpSettings, limits: Connections,
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.settings = settings
        self.limits = limits
        self.admitted = False  # within the cap: served; otherwise its first request gets 503
        self.peer = "HTTP client"
        self._counted = False
        self._busy = False  # a request is in the handler
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"HTTP client {peer[0]}:{peer[1]}"
        self.admitted = self.limits.open()
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.limits.close(self.admitted)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a request start its header deadline; the handler stops it.
        if data and not self._busy and self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(
                self.settings.header_timeout, self._too_slow, "header",
                f"its request headers took longer than {self.settings.header_timeout:g} s "
                "(http.header_timeout)")
        super().data_received(data)

    def serving(self, request: web.Request) -> None:
        """A request has reached the handler: its headers are in; time its body."""
        self._disarm()
        self._busy = True
        if request.body_exists and not request.content.is_eof():
            self._deadline = asyncio.get_running_loop().call_later(
                self.settings.body_timeout, self._body_too_slow, request)

    def served(self, request: web.Request) -> None:
        """The handler is done. A body it left unread is aiohttp's to drain or drop; until
        then those bytes start no header deadline."""
        self._disarm()
        self._busy = not request.content.is_eof()

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _body_too_slow(self, request: web.Request) -> None:
        self._deadline = None
        if request.content.is_eof() or request.writer.output_size > 0:
            return  # all there (the handler is working on it), or answered already
        self._too_slow("body", f"its request body took longer than "
                       f"{self.settings.body_timeout:g} s (http.body_timeout)")

    def _too_slow(self, reason: str, why: str) -> None:
        self._deadline = None
        if self.transport is None:
            return
        self.limits.closed_for(reason, self.peer, f"{why}; answered 408")
        self.transport.write(raw_response(
            408, "Request Timeout", f"the request arrived too slowly: {why}; send it whole"))
        self.force_close()  # the handler waiting on the body is cancelled with the connection
