"""What one caller connection may send, and how long it may take: the front's limits and its watchdog.

Every limit is answered with a typed JSON error (what, where, fix) and the connection closed once
the answer is written; nothing over a limit is buffered. Timeouts are enforced by one periodic
timer over all connections (a watchdog), not by a timer per request: the request path only
stores a phase and the watchdog's clock.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Protocol

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps and timeouts of the router's HTTP front (documented in docs/router.md)."""

    max_body_bytes: int = 4 * MIB  # a request body (JSON: parsed once per request); over it: 413, as it streams in
    max_header_bytes: int = 64 * 1024  # request line and headers together; over it: 431
    max_headers: int = 100  # header fields; over it: 431
    max_url_bytes: int = 8 * 1024  # the request target; over it: 414
    header_timeout_s: float = 10.0  # first byte of a request to the end of its headers; then 408
    body_timeout_s: float = 60.0  # end of the headers to the end of the body; then 408
    idle_timeout_s: float = 60.0  # a kept-alive connection with no request; then closed
    max_pipelined: int = 4  # requests queued behind the one in progress; then reading pauses
    linger_s: float = 2.0  # after a refusal: input read and dropped this long, so the answer is not reset
    write_stall_timeout_s: float = 30.0  # answers to a caller that reads nothing for this long: connection aborted
    max_buffered_response_bytes: int = 4 * MIB  # answer bytes the router holds for one caller; over it: aborted
    max_connections: int = 10_000  # open caller connections; past it a new one gets 503 and is closed
    max_buffered_bytes: int = 256 * MIB  # answer bytes unsent to all callers together; over it: new requests 503
    max_record_bytes: int = 256 * MIB  # answer bytes kept for the records of every exchange in flight; over it: 503

    @property
    def tick_s(self) -> float:
        """The watchdog's period: a quarter of the shortest timeout, at most half a second."""
        return min(0.5, self.header_timeout_s / 4, self.body_timeout_s / 4, self.idle_timeout_s / 4,
                   self.linger_s / 4, self.write_stall_timeout_s / 4)


def refusal_body(what: str, kind: str, where: str, fix: str) -> bytes:
    """An OpenAI-shaped error object that also says where the problem is and how to fix it."""
    return json.dumps({"error": {"message": what, "type": kind, "where": where, "fix": fix}}).encode()


def over_budget(limits: Limits, buffered: int, kept: int) -> tuple[str, str] | None:
    """The global budget these totals pass, as the 503's message and the flag that sets it; None within both."""
    if buffered > limits.max_buffered_bytes:
        return f"answers unsent to callers passed {limits.max_buffered_bytes} bytes", "--max-buffered-bytes"
    if kept > limits.max_record_bytes:
        return (f"answer bytes kept for the records of requests in flight passed {limits.max_record_bytes}",
                "--max-record-bytes")
    return None


class Watched(Protocol):
    """A connection the watchdog checks."""

    def expire(self, now: float) -> None:
        """Time the connection out if its phase has lasted too long."""

    def unsent(self) -> int:
        """Answer bytes written to the connection and not yet taken by its peer."""

    def kept(self) -> int:
        """Answer bytes its exchange in flight keeps for the record."""


class Watchdog:
    """One timer for every connection of a server: a coarse clock and a periodic sweep."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: set[Watched] = set()
        self.now = 0.0  # loop time at the last tick: what connections stamp their phases with
        # Callers who read slower than their answers arrive, and those cut off for it (exported as counters).
        self.write_pauses = self.write_stalls = self.buffer_overflows = 0
        # Global budgets: bytes unsent to all callers and bytes kept for records (summed each tick), the
        # budget passed now (its message and flag, or None), and what was refused over each.
        self.buffered = self.kept = 0
        self.over: tuple[str, str] | None = None
        self.connections_refused = self.requests_shed = self.requests_shed_records = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start ticking on ``loop``."""
        self._loop = loop
        self.now = loop.time()
        self._handle = loop.call_later(self.limits.tick_s, self._tick)

    def stop(self) -> None:
        """Stop ticking."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        assert self._loop is not None
        self.now = now = self._loop.time()
        buffered = kept = 0
        for connection in list(self.connections):
            connection.expire(now)
            buffered += connection.unsent()
            kept += connection.kept()
        self.buffered, self.kept = buffered, kept
        self.over = over_budget(self.limits, buffered, kept)
        self._handle = self._loop.call_later(self.limits.tick_s, self._tick)
