"""The caller-facing HTTP/1.1 server connection, on an asyncio protocol with httptools.

One request at a time per connection: pipelined requests queue behind it, and reading pauses
once ``max_pipelined`` wait. Answers are paced by the caller: while the caller's socket is backed
up (write-paused), the exchange in progress stops reading its upstream, no further pipelined
request starts, and a caller that stays backed up past ``write_stall_timeout_s`` (or lets more
than ``max_buffered_response_bytes`` pile up) is cut off; idle or lingering connections with
unsent bytes are aborted, never left to flush to a reader that is gone.

A handler either returns a coroutine (run as a task) or takes the
request on without one, from callbacks, and calls :meth:`ServerConnection.request_done` when it
ends: the common proxied exchange needs no task. When the caller goes away, the running
request's task is cancelled (or its ``on_lost`` callback runs), which aborts its upstream
connection: the disconnect propagates as upstream cancellation.

Input over a limit (see :mod:`serving.router.limits`) is refused as it arrives: the answer
waits for the request in progress, then it is the connection's last; input after it is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol, cast

import httptools

from revgate.serving.router.limits import Limits, Watchdog, refusal_body
from revgate.serving.router.writes import SEND_AT_ONCE, HeldWrites

log = logging.getLogger("revgate.router")


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
# Where a connection is in reading its current request: what the watchdog times.
IDLE, HEAD, BODY, LINGER = 0, 1, 2, 3
SERVER_ERROR = b'{"error":{"message":"internal error in the router","type":"internal_error"}}'
NO_ROUTE = b'{"error":{"message":"no valid route snapshot loaded yet","type":"unavailable"}}'


def error_body(message: str, kind: str) -> bytes:
    """An OpenAI-shaped error object: the answers the router gives itself, on either port."""
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing input that was just refused."""


class Holds(Protocol):
    """An exchange that keeps answer bytes for its record."""

    @property
    def held(self) -> int:
        """Bytes kept now."""
        ...


class Upstream(Protocol):
    """The connection an exchange reads its answer from: paused while the caller is backed up."""

    def pause(self, sink: Any) -> None:
        """Stop reading for ``sink``'s exchange."""

    def resume(self, sink: Any) -> None:
        """Read again for ``sink``'s exchange."""


class ServerConnection(asyncio.Protocol):
    """One caller connection."""

    def __init__(self, handler: Handler, watchdog: Watchdog, writes: HeldWrites) -> None:
        self.handler, self.watchdog, self.limits, self.writes = handler, watchdog, watchdog.limits, writes
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []  # answer bytes held for the end of the loop's turn (see writes.py)
        self.out_bytes = 0
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.head_bytes = 0  # bytes received since the current request's headers began
        self.head_size = 0  # the current request's header fields parsed so far, in bytes, every repeat counted
        self.phase, self.since = IDLE, 0.0
        self.pending: deque[Request | bytes] = deque()  # bytes: a refusal, the connection's last answer
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # a request is being served (by a task or by callbacks)
        self.paused = self.refused = False
        self.on_lost: Callable[[], None] | None = None  # a callback-served request's cancellation
        self.upstream: Upstream | None = None  # what the exchange in progress reads, paused for a backed-up caller
        self.upstream_sink: Any = None  # the exchange, as the upstream knows it
        self.write_paused = False  # the caller's socket is backed up: answers wait for it
        self.write_paused_at = 0.0
        self.closed = False
        self.close_when_done = False
        self.exchange: Holds | None = None  # the answer in flight, for the record-bytes budget

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport; the watchdog times the connection from now. Past the cap: 503, closed."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.since = self.watchdog.now
        watchdog = self.watchdog
        over = len(watchdog.connections) >= self.limits.max_connections
        watchdog.connections.add(self)
        if over:
            watchdog.connections_refused += 1
            self.refused = True
            self._last_answer(overloaded(f"the router holds its cap of {self.limits.max_connections} connections",
                                         "--max-connections", keep_alive=False))

    def data_received(self, data: bytes) -> None:
        """Feed the parser; input over a limit or malformed is refused, input after a refusal dropped."""
        if self.refused:
            return
        if self.phase != BODY:
            if self.phase == IDLE:
                self.phase, self.since = HEAD, self.watchdog.now
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol switch here: the request is answered as plain HTTP, and nothing after it is read.
            self.refused = self.close_when_done = True
            if not self.busy:
                self.close()
            return
        except httptools.HttpParserError as error:
            if not self.refused:  # else a callback refused and stopped the parser
                self.refuse(400, f"malformed HTTP request: {error}", "malformed_request", "request",
                            "Send a well-formed HTTP/1.1 request.")
            return
        if self.phase == HEAD and self.head_bytes > self.limits.max_header_bytes:
            self._headers_too_large()

    def on_url(self, url: bytes) -> None:
        """httptools callback."""
        if self.phase == IDLE:  # a pipelined request began in the same read as the previous one ended
            self.phase, self.since = HEAD, self.watchdog.now
        self.url += url
        if len(self.url) > self.limits.max_url_bytes:
            self.refuse(414, f"request target over {self.limits.max_url_bytes} bytes", "uri_too_long",
                        "request line", "Send a shorter URL; put data in the request body.")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools callback: the head's size is counted field by field, exactly, whichever read it came in.

        The per-read count in data_received bounds a header line still in progress; this bounds
        the fields, also those of a pipelined request that began in the same read as a body ended.
        """
        self.head_size += len(name) + len(value) + 4
        if self.head_size + len(self.url) > self.limits.max_header_bytes:
            self._headers_too_large()
            raise _Refused
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        """httptools callback: the head's size and count, and a declared body length, against the limits."""
        limits = self.limits
        if len(self.headers) > limits.max_headers:
            self._headers_too_large()
            raise _Refused
        length = self.headers.get(b"content-length")
        if length is not None and len(length) > 6 and length.isdigit() and int(length) > limits.max_body_bytes:
            self._body_too_large()
            raise _Refused
        self.phase, self.since, self.head_bytes, self.head_size = BODY, self.watchdog.now, 0, 0

    def on_body(self, body: bytes) -> None:
        """httptools callback; the cap holds while the body streams in: nothing over it is kept."""
        self.size += len(body)
        if self.size > self.limits.max_body_bytes:
            self._body_too_large()
            raise _Refused
        self.body.append(body)

    def on_message_complete(self) -> None:
        """httptools callback: queue the request and start it if the connection is idle."""
        body = self.body
        request = Request(
            self.parser.get_method().decode(),
            self.url,
            self.headers,
            body[0] if len(body) == 1 else b"".join(body),
            self.parser.should_keep_alive(),
        )
        self.url, self.headers, self.body, self.size = b"", {}, [], 0
        self.phase, self.since = IDLE, self.watchdog.now
        self.pending.append(request)
        if not self.busy:
            self._next()
        if len(self.pending) >= self.limits.max_pipelined and not self.paused and self.transport is not None:
            self.paused = True  # backpressure: the caller's further requests wait in its socket
            self.transport.pause_reading()

    def _headers_too_large(self) -> None:
        limits = self.limits
        self.refuse(431, f"request headers over {limits.max_header_bytes} bytes or {limits.max_headers} fields",
                    "headers_too_large", "request headers", "Send fewer or shorter headers.")

    def _body_too_large(self) -> None:
        self.refuse(413, f"request body over {self.limits.max_body_bytes} bytes", "request_too_large",
                    "request body", "Send a smaller body (the router's --max-body-bytes).")

    def refuse(self, status: int, what: str, kind: str, where: str, fix: str) -> None:
        """Answer with a typed error once the request in progress ends; it is the connection's last answer."""
        if self.refused:
            return
        self.refused = True
        body = refusal_body(what, kind, where, fix)
        self.pending.append(response_head(status, b"application/json", b"", len(body), False) + body)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.pending or self.closed or self.write_paused:
            return  # a backed-up caller gets its next answer once it reads the last one
        self.busy = True
        item = self.pending.popleft()
        if self.paused and len(self.pending) < self.limits.max_pipelined and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if isinstance(item, bytes):
            self._last_answer(item)
            return
        over = self.watchdog.over
        if over is not None:  # a global budget is passed: no new work until what holds it drains
            what, flag = over
            if flag == "--max-record-bytes":
                self.watchdog.requests_shed_records += 1
            else:
                self.watchdog.requests_shed += 1
            self.write(overloaded(what, flag, keep_alive=item.keep_alive))
            if not item.keep_alive:
                self.close_when_done = True
            self.request_done()
            return
        try:
            work = self.handler(self, item)
        except Exception:  # a defect in a handler must not take the connection's parser down with it
            log.exception("request handler failed")
            self.respond(500, SERVER_ERROR, keep_alive=False)
            self.request_done()
            return
        if work is not None:
            self.continue_in(work)

    def _last_answer(self, answer: bytes) -> None:
        """Write a refusal, half-close, and linger: input is drained, not reset, so the caller reads it."""
        self.pending.clear()
        self.phase, self.since = LINGER, self.watchdog.now
        transport = self.transport
        if transport is None:
            return
        if self.paused:
            self.paused = False
            transport.resume_reading()
        self.send_held()  # the answer in progress first
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        else:  # pragma: no cover - TCP transports can
            transport.close()

    def unsent(self) -> int:
        """Answer bytes written and not yet taken by the caller (for the router's global budget)."""
        transport = self.transport
        if transport is None or self.closed:
            return 0
        return transport.get_write_buffer_size() + self.out_bytes

    def kept(self) -> int:
        """Answer bytes the exchange in flight keeps for its record (for the router's global budget)."""
        exchange = self.exchange
        return exchange.held if exchange is not None else 0

    def expire(self, now: float) -> None:
        """Watchdog: close lingering and idle connections, answer 408 to slow heads and bodies."""
        phase, limits, transport = self.phase, self.limits, self.transport
        if transport is None:
            return
        if self.write_paused and now - self.write_paused_at >= limits.write_stall_timeout_s:
            self.watchdog.write_stalls += 1
            self.abort()  # the caller stopped reading: its answers will never be taken
            return
        elapsed = now - self.since
        if phase == LINGER:
            if elapsed >= limits.linger_s:
                self._close_now()
        elif self.busy or self.paused:
            return  # the request in progress has its own deadline
        elif phase == IDLE:
            if elapsed >= limits.idle_timeout_s:
                self._close_now()
        elif phase == HEAD:
            if elapsed >= limits.header_timeout_s:
                self.refuse(408, f"request headers not complete within {limits.header_timeout_s} s",
                            "request_timeout", "request headers", "Send the whole request head at once.")
        elif elapsed >= limits.body_timeout_s:
            self.refuse(408, f"request body not complete within {limits.body_timeout_s} s", "request_timeout",
                        "request body", "Send the body faster or make it smaller.")

    def _close_now(self) -> None:
        """Close; abort when answer bytes are still unsent (close would wait for a reader that may never read)."""
        if self.unsent():
            self.abort()
        else:
            self.close()

    def _done(self, task: asyncio.Task[None]) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("request task failed", exc_info=task.exception())
            self.abort()  # the answer may be half-written: it must not look complete
        self.request_done()

    def continue_in(self, work: Coroutine[Any, Any, None]) -> None:
        """The request in progress goes on as a task (cancelled if the caller leaves)."""
        self.on_lost = None
        self.task = asyncio.get_running_loop().create_task(work)
        self.task.add_done_callback(self._done)

    def request_done(self) -> None:
        """The request in progress ended: close if asked to, else start the next pipelined one."""
        self.busy, self.on_lost, self.upstream, self.upstream_sink = False, None, None, None
        self.exchange = None
        if self.close_when_done and self.transport is not None:
            self.close()
            return
        self.since = self.watchdog.now  # a partly read next request is timed from now
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        """The caller went away: cancel the request in progress (and with it the upstream exchange)."""
        self.closed = True
        self.watchdog.connections.discard(self)
        self.pending.clear()
        self.out.clear()
        self.out_bytes = 0
        if self.task is not None:
            self.task.cancel()
        elif self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost()

    def attach(self, upstream: Upstream, sink: Any) -> None:
        """The exchange in progress (``sink``) reads ``upstream``; it starts paused for a backed-up caller."""
        self.upstream, self.upstream_sink = upstream, sink
        if self.write_paused:
            upstream.pause(sink)

    def pause_writing(self) -> None:
        """The caller reads slower than the upstream writes: stop reading upstream."""
        self.write_paused, self.write_paused_at = True, self.watchdog.now
        self.watchdog.write_pauses += 1
        if self.upstream is not None:
            self.upstream.pause(self.upstream_sink)

    def resume_writing(self) -> None:
        """The caller caught up: the exchange reads on, or the next pipelined request starts."""
        self.write_paused = False
        if self.upstream is not None:
            self.upstream.resume(self.upstream_sink)
        if not self.busy:
            self._next()

    def write(self, data: bytes) -> None:
        """Write to the caller unless it has gone: held to the end of the loop's turn, then sent with the rest."""
        if self.transport is not None and not self.closed:
            if not self.out:
                self.writes.hold(self)
            self.out.append(data)
            self.out_bytes += len(data)
            if self.out_bytes >= SEND_AT_ONCE:
                self.send_held()  # a large answer goes now: a backed-up caller must pause its upstream at once

    def send_held(self) -> None:
        """Hand the held bytes to the transport; a caller holding too many unsent bytes is cut off."""
        out, transport = self.out, self.transport
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.out_bytes = 0
        if transport is None or self.closed or transport.is_closing():
            return
        transport.write(data)
        if transport.get_write_buffer_size() > self.limits.max_buffered_response_bytes:
            self.watchdog.buffer_overflows += 1
            transport.abort()

    def close(self) -> None:
        """Close once the bytes written so far are sent."""
        if self.transport is not None:
            self.send_held()
            self.transport.close()

    def abort(self) -> None:
        """Cut the connection (a reset) after handing over the bytes written so far, as a write would have."""
        if self.transport is not None:
            self.send_held()
            self.transport.abort()

    def finish(self, keep_alive: bool) -> None:
        """End a response: close (once the request ends) unless the connection is kept alive."""
        if keep_alive:
            return
        self.close_when_done = True
        if not self.busy:
            self.close()

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


def overloaded(what: str, flag: str, *, keep_alive: bool) -> bytes:
    """A whole 503 answer with Retry-After: the router is over one of its global budgets."""
    body = refusal_body(what, "overloaded", "router", f"Retry after a second; operators: see {flag} in docs/router.md.")
    return response_head(503, b"application/json", b"retry-after: 1\r\n", len(body), keep_alive) + body


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


async def serve(handler: Handler, host: str, port: int, limits: Limits) -> tuple[asyncio.Server, Watchdog]:
    """Listen on ``host:port``; each connection runs ``handler`` per request, within ``limits``."""
    loop = asyncio.get_running_loop()
    watchdog, writes = Watchdog(limits), HeldWrites()
    watchdog.start(loop)
    server = await loop.create_server(lambda: ServerConnection(handler, watchdog, writes), host, port, backlog=2048,
                                      reuse_address=True)
    return server, watchdog
