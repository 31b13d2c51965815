"""Writes held to the end of the event loop's turn: one callback a turn, every holder sent, in order."""

from __future__ import annotations

import asyncio

from revgate.serving.router.writes import HeldWrites


class Holder:
    """A connection's far side: what it was told to send, in order, into one shared log."""

    def __init__(self, name: str, log: list[str], *, broken: bool = False) -> None:
        self.name, self.log, self.broken = name, log, broken

    def send_held(self) -> None:
        if self.broken:
            raise RuntimeError("a defect in one connection")
        self.log.append(self.name)


def test_holders_of_one_turn_are_sent_together_after_it_in_the_order_they_held() -> None:
    async def turn() -> tuple[list[str], list[str]]:
        log: list[str] = []
        writes = HeldWrites()
        for name in ("a", "b", "c"):
            writes.hold(Holder(name, log))
        during = list(log)  # nothing goes while the turn's callbacks run
        await asyncio.sleep(0)
        return during, log

    during, after = asyncio.run(turn())
    assert during == [] and after == ["a", "b", "c"]


def test_a_failing_holder_is_logged_and_the_others_are_still_sent() -> None:
    async def turn() -> list[str]:
        log: list[str] = []
        writes = HeldWrites()
        writes.hold(Holder("a", log))
        writes.hold(Holder("broken", log, broken=True))
        writes.hold(Holder("c", log))
        await asyncio.sleep(0)
        return log

    assert asyncio.run(turn()) == ["a", "c"]


def test_a_later_turn_schedules_its_own_send() -> None:
    async def turns() -> list[str]:
        log: list[str] = []
        writes = HeldWrites()
        writes.hold(Holder("first", log))
        await asyncio.sleep(0)
        writes.hold(Holder("second", log))
        await asyncio.sleep(0)
        return log

    assert asyncio.run(turns()) == ["first", "second"]
