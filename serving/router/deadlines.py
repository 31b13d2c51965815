"""Deadlines of the requests served from callbacks, on one loop timer per slot of time, not one per request.

A loop timer per request (started at entry, cancelled at the end) was the largest single cost of the
router's own bookkeeping on its bench; uvloop makes each one a handle to start, stop and close. The
requests whose deadlines fall in one slot share its timer, a request that ends leaves its slot in
constant time, and the last to leave cancels the slot's timer, so an idle router is not woken for
deadlines nobody waits on. A deadline fires at most one slot (10 ms) late: nothing next to a route's
seconds-long deadlines. A deadline under a second away (a caller's own ``x-revgate-timeout-ms``)
gets a timer at its exact time instead: fired at the end of its slot, a caller's 1 ms deadline let a
real engine's answer through with a 200 where the caller had asked for a 504.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

SLOTS_PER_S = 100
EXACT_BELOW_S = 1.0  # deadlines nearer than this fire on time, not at the end of their slot


class Slot:
    """The calls whose deadlines fall in one slot, and the timer that expires them."""

    __slots__ = ("calls", "key", "timer")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.calls: dict[int, Any] = {}
        self.timer: asyncio.TimerHandle | None = None


class Deadlines:
    """Calls by the slot their deadline falls in; ``expire`` runs for each one still there when its slot is due."""

    __slots__ = ("expire", "loop", "slots")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[Any], None]) -> None:
        self.loop, self.expire = loop, expire
        self.slots: dict[int, Slot] = {}

    def add(self, call: Any, deadline: float) -> Slot:
        """Watch ``call`` until ``deadline`` (loop time); the slot returned is where it leaves from (``leave``)."""
        exact = deadline - self.loop.time() < EXACT_BELOW_S
        # The first slot boundary at or after the deadline, or the deadline itself (a key no boundary has).
        key: Any = ("at", deadline) if exact else int(deadline * SLOTS_PER_S) + 1
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = Slot(key)
            slot.timer = self.loop.call_at(deadline if exact else key / SLOTS_PER_S, self._due, slot)
        slot.calls[id(call)] = call
        return slot

    def leave(self, slot: Slot, call: Any) -> None:
        """``call`` ended before its deadline; the last call to leave a slot cancels its timer."""
        calls = slot.calls
        calls.pop(id(call), None)
        if not calls and slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
            self.slots.pop(slot.key, None)

    def _due(self, slot: Slot) -> None:
        slot.timer = None
        self.slots.pop(slot.key, None)
        calls = slot.calls
        while calls:  # one at a time: a call that ends while another expires has left the slot, and is skipped
            _, call = calls.popitem()
            self.expire(call)
