"""The caller-facing HTTP/1.1 server connection, on an asyncio protocol with httptools.

One request at a time per connection (pipelined requests wait their turn). A handler either
returns a coroutine (run as a task) or takes the request on without one, from callbacks, and
calls :meth:`ServerConnection.request_done` when it ends: the common proxied exchange needs no
task. When the caller goes away, the running request's task is cancelled (or its ``on_lost``
callback runs), which aborts its upstream connection: the disconnect propagates as upstream
cancellation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import httptools


@dataclass(slots=True)
class Request:
    """A parsed request; header names are lower-case bytes."""

    method: str
    path: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool


Handler = Callable[["ServerConnection", Request], Coroutine[Any, Any, None] | None]
REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
MAX_BODY = 16 * 1024 * 1024


class ServerConnection(asyncio.Protocol):
    """One caller connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.pending: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # a request is being served (by a task or by callbacks)
        self.on_lost: Callable[[], None] | None = None  # a callback-served request's cancellation
        self.on_pause: Callable[[], None] | None = None
        self.on_resume: Callable[[], None] | None = None
        self.closed = False
        self.close_when_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        """Feed the parser; malformed input gets a 400 and the connection closes."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.respond(400, b'{"error":{"message":"malformed HTTP request"}}', keep_alive=False)

    def on_url(self, url: bytes) -> None:
        """httptools callback."""
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools callback."""
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        """httptools callback; bodies over the limit are refused."""
        self.size += len(body)
        self.body.append(body)

    def on_message_complete(self) -> None:
        """httptools callback: queue the request and start it if the connection is idle."""
        request = Request(
            self.parser.get_method().decode(),
            self.url,
            self.headers,
            b"".join(self.body),
            self.parser.should_keep_alive(),
        )
        oversized = self.size > MAX_BODY
        self.url, self.headers, self.body, self.size = b"", {}, [], 0
        if oversized:
            self.respond(413, b'{"error":{"message":"request body over 16 MiB"}}', keep_alive=False)
            return
        self.pending.append(request)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.pending or self.closed:
            return
        self.busy = True
        work = self.handler(self, self.pending.popleft())
        if work is not None:
            self.continue_in(work)

    def _done(self, _: asyncio.Task[None]) -> None:
        self.task = None
        self.request_done()

    def continue_in(self, work: Coroutine[Any, Any, None]) -> None:
        """The request in progress goes on as a task (cancelled if the caller leaves)."""
        self.on_lost = None
        self.task = asyncio.get_running_loop().create_task(work)
        self.task.add_done_callback(self._done)

    def request_done(self) -> None:
        """The request in progress ended: close if asked to, else start the next pipelined one."""
        self.busy, self.on_lost = False, None
        if self.close_when_done and self.transport is not None:
            self.transport.close()
            return
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        """The caller went away: cancel the request in progress (and with it the upstream exchange)."""
        self.closed = True
        self.pending.clear()
        if self.task is not None:
            self.task.cancel()
        elif self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost()

    def pause_writing(self) -> None:
        """The caller reads slower than the upstream writes: stop reading upstream."""
        if self.on_pause is not None:
            self.on_pause()

    def resume_writing(self) -> None:
        """The caller caught up."""
        if self.on_resume is not None:
            self.on_resume()

    def write(self, data: bytes) -> None:
        """Write to the caller unless it has gone."""
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def finish(self, keep_alive: bool) -> None:
        """End a response: close (once the request ends) unless the connection is kept alive."""
        if keep_alive:
            return
        self.close_when_done = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    def respond(self, status: int, body: bytes, *, keep_alive: bool = True, headers: bytes = b"",
                content_type: bytes = b"application/json") -> None:
        """A complete, small response."""
        self.write(response_head(status, content_type, headers, len(body), keep_alive) + body)
        self.finish(keep_alive)


def response_head(status: int, content_type: bytes, headers: bytes, length: int | None, keep_alive: bool) -> bytes:
    """Status line and headers; ``length`` None means chunked transfer encoding."""
    framing = b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    connection = b"" if keep_alive else b"connection: close\r\n"
    reason = REASONS.get(status, b"Unknown")
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
        status, reason, content_type, framing, connection, headers
    )


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


async def serve(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port``; each connection runs ``handler`` per request."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ServerConnection(handler), host, port, backlog=2048, reuse_address=True)
