"""A small pooled HTTP/1.1 client for the router's upstreams, on asyncio protocols and httptools.

Response events go straight to a :class:`Sink` (the request's relay) as they are parsed, so a
streamed body reaches the caller chunk by chunk with no queue in between. Idle keep-alive
connections are pooled per endpoint; a connection that failed or was cut mid-response is closed,
never reused, which is also how a cancelled request is cancelled upstream.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Protocol, cast

import httptools

from revgate.serving.router.writes import SEND_AT_ONCE, HeldWrites

Address = tuple[str, int]
MAX_IDLE_PER_ENDPOINT = 512


class UpstreamError(Exception):
    """The upstream failed before a complete response (refused, reset, malformed)."""

    def __init__(self, message: str, *, stale: bool = False, unsent: bool = False) -> None:
        super().__init__(message)
        self.stale = stale  # a reused idle connection closed before answering: safe to resend at once
        self.unsent = unsent  # no connection was made: not a byte of the request left the router


class Sink(Protocol):
    """Receives one response's events."""

    def on_headers(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Status and headers arrived."""

    def on_body(self, chunk: bytes) -> None:
        """A piece of the (de-chunked) body arrived."""

    def on_complete(self) -> None:
        """The response ended."""

    def on_error(self, error: UpstreamError) -> None:
        """The exchange failed; no further events follow."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to one endpoint, carrying one exchange at a time."""

    def __init__(self, pool: UpstreamPool, address: Address) -> None:
        self.pool, self.address = pool, address
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.received = False
        self.reused = False
        self.paused = False  # reading stopped for a slow caller: never pooled so
        self.out = b""  # the request, held for the end of the loop's turn (see writes.py)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport; disable Nagle for small request writes."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def send(self, request: bytes, sink: Sink) -> None:
        """Write a full request; events go to ``sink``."""
        self.sink, self.headers, self.received = sink, [], False
        assert self.transport is not None
        if len(request) >= SEND_AT_ONCE:  # a long prompt goes now, not after the rest of the turn's work
            self.transport.write(request)
            return
        self.out = request
        self.pool.writes.hold(self)

    def send_held(self) -> None:
        """Hand the held request to the transport, unless the connection ended first (it was never sent)."""
        request, self.out = self.out, b""
        if request and self.transport is not None and not self.transport.is_closing():
            self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a protocol error fails the exchange and the connection."""
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(UpstreamError(f"malformed response from upstream: {error}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools callback: one header."""
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        """httptools callback: status line and headers done."""
        if self.sink is not None:
            self.sink.on_headers(self.parser.get_status_code(), self.headers)

    def on_body(self, body: bytes) -> None:
        """httptools callback: a body piece."""
        if self.sink is not None:
            self.sink.on_body(body)

    def on_message_complete(self) -> None:
        """httptools callback: response done; the connection goes back to the pool if reusable.

        A connection paused for this exchange's slow caller reads again first: pooled paused, the
        next request on it, anyone's, would never be read and would wait out its deadline.
        """
        sink, self.sink = self.sink, None
        if self.paused:
            self.resume(sink)
        if self.parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.close()
        if sink is not None:
            sink.on_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket closed: fail any exchange in progress."""
        self.pool.forget(self)
        stale = self.reused and not self.received
        self._fail(UpstreamError(f"upstream {self.address[0]}:{self.address[1]} closed the connection", stale=stale))

    def pause(self, sink: Sink | None) -> None:
        """Stop reading for ``sink``'s slow caller; a no-op once ``sink``'s exchange has ended."""
        if sink is self.sink and not self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = True
            self.transport.pause_reading()

    def resume(self, sink: Sink | None) -> None:
        """Resume reading for ``sink`` (its caller caught up, or its exchange has just ended)."""
        if (sink is self.sink or self.sink is None) and self.paused:
            self.paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def close(self) -> None:
        """Abort the connection: in-flight work upstream sees a disconnect and is cancelled."""
        self.sink, self.out = None, b""
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: UpstreamError) -> None:
        sink, self.sink, self.out = self.sink, None, b""
        if self.transport is not None:
            self.transport.abort()
        if sink is not None:
            sink.on_error(error)


class UpstreamPool:
    """Idle keep-alive connections per endpoint."""

    def __init__(self) -> None:
        self.idle: dict[Address, list[UpstreamConnection]] = defaultdict(list)
        self.writes = HeldWrites()  # every connection's requests, sent at the end of the loop's turn

    def take(self, address: Address) -> UpstreamConnection | None:
        """An idle, open connection to ``address``, or None."""
        idle = self.idle[address]
        while idle:
            connection = idle.pop()
            if connection.paused:
                connection.close()  # cannot happen since on_message_complete resumes; never hand one out
            elif connection.transport is not None and not connection.transport.is_closing():
                connection.reused = True
                return connection
        return None

    async def connect(self, address: Address, *, fresh: bool = False) -> UpstreamConnection:
        """An idle connection to ``address``, or a new one; UpstreamError if it cannot connect."""
        if not fresh:
            connection = self.take(address)
            if connection is not None:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(lambda: UpstreamConnection(self, address), *address)
        except OSError as error:
            raise UpstreamError(f"cannot connect to upstream {address[0]}:{address[1]}: {error}",
                                unsent=True) from None
        return protocol

    def release(self, connection: UpstreamConnection) -> None:
        """Return a finished keep-alive connection to the pool."""
        idle = self.idle[connection.address]
        if len(idle) < MAX_IDLE_PER_ENDPOINT:
            idle.append(connection)
        else:
            connection.close()

    def forget(self, connection: UpstreamConnection) -> None:
        """Drop a closed connection from the idle list."""
        idle = self.idle.get(connection.address)
        if idle and connection in idle:
            idle.remove(connection)

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self.idle.values():
            for connection in list(idle):
                connection.close()
            idle.clear()


def request_bytes(method: str, path: bytes, address: Address, body: bytes, extra_headers: bytes = b"") -> bytes:
    """An HTTP/1.1 keep-alive request."""
    host = _HOST_LINES.get(address)
    if host is None:
        host = _HOST_LINES[address] = f" HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n".encode()
    return b"%s %s%sContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        method.encode(), path, host, len(body), extra_headers, body
    )


_HOST_LINES: dict[Address, bytes] = {}  # per endpoint, built once
