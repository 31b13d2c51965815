"""Deadlines of the requests served from callbacks, on one loop timer per slot of time, not one per request.

A loop timer per request (started at entry, cancelled at the end) was the largest single cost of the
router's own bookkeeping on its bench; uvloop makes each one a handle to start, stop and close. The
requests whose deadlines fall in one slot share its timer, a request that ends leaves its slot in
constant time, and a deadline fires at most one slot (10 ms) late: nothing next to a route's
seconds-long deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

SLOTS_PER_S = 100


class Deadlines:
    """Calls by the slot their deadline falls in; ``expire`` runs for each one still there when its slot is due."""

    __slots__ = ("expire", "loop", "slots")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[Any], None]) -> None:
        self.loop, self.expire = loop, expire
        self.slots: dict[int, dict[int, Any]] = {}

    def add(self, call: Any, deadline: float) -> dict[int, Any]:
        """Watch ``call`` until ``deadline`` (loop time); the slot returned is where it leaves from (``leave``)."""
        key = int(deadline * SLOTS_PER_S) + 1  # the first slot boundary at or after the deadline
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = {}
            self.loop.call_at(key / SLOTS_PER_S, self._due, key)
        slot[id(call)] = call
        return slot

    def _due(self, key: int) -> None:
        slot = self.slots.pop(key)
        while slot:  # one at a time: a call that ends while another expires has left the slot, and is skipped
            _, call = slot.popitem()
            self.expire(call)


def leave(slot: dict[int, Any], call: Any) -> None:
    """``call`` ended before its deadline."""
    slot.pop(id(call), None)
