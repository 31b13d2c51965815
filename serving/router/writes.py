"""Bytes written during one turn of the event loop, handed to the kernel together after it.

A write to a peer asleep in ``epoll`` (a caller's client, an engine's HTTP server) wakes that
peer, and the writer pays for the wake in its system call: on another core an inter-processor
interrupt, in a virtual machine an exit to the host. Written as the turn's Python work goes, each
write finds its peer asleep again; written back to back at the end of the turn, one wake serves
the whole batch, and several writes to one connection (a head and a body) go out as one. On the
router bench this took about a quarter off the CPU per request (docs/benchmarks.md). At moderate
load a turn holds one request, so an answer leaves one callback later than it would have:
microseconds.

A connection holds its bytes (``hold``) and sends them when its HeldWrites says so (``send_held``),
and also before anything that ends or measures its transport (close, abort, half-close, the
buffered-bytes checks), so the order of bytes and ends on the wire is the order they were asked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("revgate.router")

# Held bytes past this go to the transport at once, not at the end of the turn. An answer: the event
# loop reads up to 32 pieces from one upstream in a turn, and only a write tells a backed-up caller's
# exchange to stop reading. A request: a long prompt should not wait for the rest of the turn's work.
# (asyncio's default high-water mark; small answers and requests, the common case, still go together.)
SEND_AT_ONCE = 64 * 1024


class Holder(Protocol):
    """A connection with bytes held for the end of the turn."""

    def send_held(self) -> None:
        """Hand the held bytes to the transport (a no-op when none are held or it has gone)."""


class HeldWrites:
    """The connections with bytes held in this turn; one callback per turn sends them all."""

    __slots__ = ("due",)

    def __init__(self) -> None:
        self.due: list[Holder] = []

    def hold(self, connection: Holder) -> None:
        """``connection`` now holds bytes: have them sent once the turn's callbacks are done."""
        if not self.due:
            asyncio.get_running_loop().call_soon(self.send)
        self.due.append(connection)

    def send(self) -> None:
        """Send what every connection holds (one sent early, before its close, is a no-op here)."""
        due, self.due = self.due, []
        for connection in due:
            try:
                connection.send_held()
            except Exception:  # one connection's defect must not keep the others' bytes
                log.exception("sending held bytes failed")
