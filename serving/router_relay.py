"""The relay: one upstream attempt's response, passed to the caller as it arrives.

A relay writes the response head when the upstream's headers arrive, unless the status is worth
a retry and a retry is still allowed (then it discards, and nothing has reached the caller).
Without a caller (shadow copies) it only collects.
"""

from __future__ import annotations

import asyncio
import time

from serving.router_http import LAST_CHUNK, ServerConnection, chunk, response_head
from serving.router_upstream import UpstreamError

RETRYABLE_STATUS = frozenset((502, 503, 504))


class Relay:
    """Implements the upstream Sink for one attempt."""

    __slots__ = (
        "caller", "chunked", "discard", "error", "extra_headers", "finished", "first_s", "headers_ready",
        "keep_alive", "last_s", "may_retry", "parts", "started", "status", "streamed",
    )

    def __init__(
        self, caller: ServerConnection | None, extra_headers: bytes, keep_alive: bool, may_retry: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        self.caller, self.extra_headers, self.keep_alive, self.may_retry = caller, extra_headers, keep_alive, may_retry
        self.headers_ready: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.chunked = self.streamed = self.discard = self.started = False
        self.parts: list[bytes] = []
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.error: UpstreamError | None = None

    def on_headers(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Decide retry or pass-through; write the head to the caller."""
        self.status = status
        content_type, length = b"application/json", None
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-type":
                content_type = value
            elif lowered == b"content-length":
                length = int(value)
        self.streamed = content_type.startswith(b"text/event-stream")
        self.chunked = length is None
        if self.may_retry and status in RETRYABLE_STATUS:
            self.discard = True
        elif self.caller is not None:
            self.caller.write(response_head(status, content_type, self.extra_headers, length, self.keep_alive))
            self.started = True
        self.headers_ready.set_result(None)

    def on_body(self, data: bytes) -> None:
        """Forward a body piece at once; keep it for the record."""
        if self.first_s is None:
            self.first_s = time.time()
        self.parts.append(data)
        if self.started and self.caller is not None:
            self.caller.write(chunk(data) if self.chunked else data)

    def on_complete(self) -> None:
        """End the caller's response."""
        self.last_s = time.time()
        if self.started and self.caller is not None:
            if self.chunked:
                self.caller.write(LAST_CHUNK)
            self.caller.finish(self.keep_alive)
        self._settle()

    def on_error(self, error: UpstreamError) -> None:
        """Remember the failure; the handler decides between retry and a truncated response."""
        self.error = error
        self.last_s = time.time()
        self._settle()

    def _settle(self) -> None:
        if not self.headers_ready.done():
            self.headers_ready.set_result(None)
        if not self.finished.done():
            self.finished.set_result(None)

    @property
    def complete(self) -> bool:
        """The whole response arrived (a cancelled wait leaves this False)."""
        return self.last_s is not None and self.error is None

    def body(self) -> bytes:
        """Everything received so far."""
        return b"".join(self.parts)
