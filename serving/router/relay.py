"""The relay: one upstream attempt's response, passed to the caller as it arrives.

A relay writes the response head when the upstream's headers arrive, unless the status is worth
a retry and a retry is still allowed (then it discards, and nothing has reached the caller).
Without a caller (shadow copies) it only collects.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from revgate.serving.router.http import LAST_CHUNK, ServerConnection, chunk, response_head
from revgate.serving.router.upstream import UpstreamError

RETRYABLE_STATUS = frozenset((502, 503, 504))


class Relay:
    """Implements the upstream Sink for one attempt.

    The end of the exchange is signalled to ``on_settled`` when given (the task-free path), else
    through the ``finished`` future (created only then). A response with a content length has
    its head written together with the first body piece: one write to the caller, not two.
    """

    __slots__ = (
        "caller", "chunked", "context", "discard", "error", "extra_headers", "finished", "first_s", "head",
        "keep_alive", "kept", "last_s", "may_retry", "on_settled", "parts", "settled", "started", "status", "streamed",
        "tail", "tail_bytes", "truncated",
    )
    # Bytes of one answer kept for its record (usage, output text, the shadow's pair): the first
    # half and the last half of this. An answer larger than that is relayed whole but recorded
    # from its two ends (the usage block and finish reason are at the end; the text is then cut).
    keep_bytes = 1024 * 1024

    def __init__(
        self, caller: ServerConnection | None, extra_headers: bytes, keep_alive: bool, may_retry: bool, *,
        on_settled: Callable[[Relay], None] | None = None, context: Any = None,
    ) -> None:
        self.caller, self.extra_headers, self.keep_alive, self.may_retry = caller, extra_headers, keep_alive, may_retry
        self.on_settled, self.context = on_settled, context  # context: the owner's, for on_settled
        self.finished: asyncio.Future[None] | None = (
            None if on_settled is not None else asyncio.get_running_loop().create_future()
        )
        self.status = 0
        self.chunked = self.streamed = self.discard = self.started = self.settled = False
        self.head = b""  # a head not yet written (content-length responses)
        self.parts: list[bytes] = []
        self.kept = self.tail_bytes = 0
        self.tail: deque[bytes] | None = None  # past keep_bytes / 2: the answer's last pieces
        self.truncated = False
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.error: UpstreamError | None = None

    def on_headers(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Decide retry or pass-through; write the head to the caller (or hold it for the body)."""
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
            head = response_head(status, content_type, self.extra_headers, length, self.keep_alive)
            if self.chunked:
                self.caller.write(head)  # a stream's head goes at once
            else:
                self.head = head
            self.started = True

    def on_body(self, data: bytes) -> None:
        """Forward a body piece at once; keep it for the record."""
        if self.first_s is None:
            self.first_s = time.time()
        if self.kept < self.keep_bytes >> 1:
            self.parts.append(data)
            self.kept += len(data)
        else:
            self._keep_tail(data)
        if self.started and self.caller is not None:
            if self.chunked:
                self.caller.write(chunk(data))
            elif self.head:
                self.caller.write(self.head + data)
                self.head = b""
            else:
                self.caller.write(data)

    def on_complete(self) -> None:
        """End the caller's response."""
        self.last_s = time.time()
        if self.started and self.caller is not None:
            if self.chunked:
                self.caller.write(LAST_CHUNK)
            elif self.head:
                self.caller.write(self.head)
                self.head = b""
            self.caller.finish(self.keep_alive)
        self._settle()

    def on_error(self, error: UpstreamError) -> None:
        """Remember the failure; the handler decides between retry and a truncated response."""
        self.error = error
        self.last_s = time.time()
        if self.head and self.caller is not None:
            self.caller.write(self.head)  # as before: the head went out, then the connection is cut
            self.head = b""
        self._settle()

    def _keep_tail(self, data: bytes) -> None:
        tail = self.tail
        if tail is None:
            tail = self.tail = deque()
        tail.append(data)
        self.tail_bytes += len(data)
        while self.tail_bytes > self.keep_bytes >> 1 and len(tail) > 1:
            self.tail_bytes -= len(tail.popleft())
            self.truncated = True

    def _settle(self) -> None:
        if self.settled:
            return
        self.settled = True
        if self.on_settled is not None:
            self.on_settled(self)
        elif self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    @property
    def held(self) -> int:
        """Answer bytes kept for the record now (the router's record-bytes budget sums these)."""
        return self.kept + self.tail_bytes

    async def wait(self) -> None:
        """Until the exchange ends (the future-based mode)."""
        if self.finished is not None:
            await self.finished

    @property
    def complete(self) -> bool:
        """The whole response arrived (a cancelled wait leaves this False)."""
        return self.last_s is not None and self.error is None

    @property
    def stream_done(self) -> bool:
        """An event stream whose ``[DONE]`` event was relayed: the answer is whole.

        The OpenAI SDK closes its connection as soon as it reads ``[DONE]``, often before the
        engine ends the body; such a caller was served, not one who walked away.
        """
        if not (self.started and self.streamed and self.parts):
            return False
        last = list(self.tail)[-2:] if self.tail else self.parts[-2:]
        return b"".join(last).rstrip().endswith(b"data: [DONE]")

    def body(self) -> bytes:
        """What was kept of the answer: all of it, or its two ends when it passed ``keep_bytes``."""
        parts = self.parts
        if self.tail:
            return b"".join((*parts, *self.tail))
        return parts[0] if len(parts) == 1 else b"".join(parts)
