"""Passive health of upstream endpoints: one that refuses or resets before answering is ejected.

An ejected endpoint gets no new requests until its backoff passes (1 s, doubling per failure in a
row, at most 30 s); the first request after that is its probe, and a success ends the ejection.
A probe whose connection is refused costs its caller nothing: no byte was sent, so the router
sends the request on to another live replica (or stable) without spending a retry.
Without this the router kept sending new requests to a replica that had died until the flow's
next replica watch removed it from the route (one lease renewal, minutes on the default plan).
Pure bookkeeping over loop time; the router calls it from the request path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Address = tuple[str, int]
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


@dataclass(slots=True)
class _Ejected:
    until: float
    backoff: float


class Ejections:
    """Ejected endpoints by address; empty (one dict lookup per request) while every replica answers."""

    def __init__(self) -> None:
        self.ejected: dict[Address, _Ejected] = {}
        self.count = 0  # ejections so far, for the metrics

    def live(self, address: Address, now: float) -> bool:
        """Whether ``address`` may get a new request (never ejected, or its backoff has passed: a probe)."""
        entry = self.ejected.get(address)
        return entry is None or now >= entry.until

    def any_live(self, endpoints: Sequence[Address], now: float) -> bool:
        """Whether one of ``endpoints`` may get a new request."""
        return not self.ejected or any(self.live(address, now) for address in endpoints)

    def failed(self, address: Address, now: float) -> None:
        """``address`` refused or reset before answering: eject it, for twice as long as last time."""
        entry = self.ejected.get(address)
        backoff = FIRST_BACKOFF_S if entry is None else min(entry.backoff * 2, MAX_BACKOFF_S)
        self.ejected[address] = _Ejected(now + backoff, backoff)
        self.count += 1

    def answered(self, address: Address) -> None:
        """``address`` answered: no longer ejected."""
        if self.ejected:
            self.ejected.pop(address, None)

    def first_live(self, endpoints: Sequence[Address], start: int, now: float) -> int:
        """The first index from ``start`` (round robin) whose endpoint is live; ``start`` if none is."""
        if not self.ejected:
            return start
        count = len(endpoints)
        for step in range(count):
            index = (start + step) % count
            if self.live(endpoints[index], now):
                return index
        return start
