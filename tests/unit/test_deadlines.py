"""Deadlines in slots: each call expires once, at or after its deadline; a call that ended never expires."""

from __future__ import annotations

import asyncio

from revgate.serving.router.deadlines import SLOTS_PER_S, Deadlines


class Call:
    def __init__(self, name: str) -> None:
        self.name = name


def test_calls_expire_at_or_after_their_deadline_and_one_that_ended_never_does() -> None:
    async def run() -> list[tuple[str, float, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float, float]] = []
        due: dict[str, float] = {}
        deadlines = Deadlines(loop, lambda call: fired.append((call.name, loop.time(), due[call.name])))
        now = loop.time()
        for name, after in (("a", 0.02), ("b", 0.021), ("c", 0.05)):
            due[name] = now + after
            deadlines.add(Call(name), due[name])
        ended = Call("ended")
        deadlines.leave(deadlines.add(ended, now + 0.02), ended)
        while deadlines.slots:
            await asyncio.sleep(1 / SLOTS_PER_S)
        return fired

    fired = asyncio.run(run())
    assert sorted(name for name, _, _ in fired) == ["a", "b", "c"]
    assert all(deadline <= at for _, at, deadline in fired)  # never early


def test_the_last_call_to_leave_a_slot_cancels_its_timer() -> None:
    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop, lambda call: None)
        calls = [Call(str(n)) for n in range(3)]
        slots = [deadlines.add(call, loop.time() + 60) for call in calls]
        held = len(deadlines.slots)
        for slot, call in zip(slots, calls, strict=True):
            deadlines.leave(slot, call)
        return held, len(deadlines.slots)

    held, left = asyncio.run(run())
    assert held >= 1 and left == 0  # no timer is left to wake an idle router a minute later


def test_a_call_that_ends_while_another_of_its_slot_expires_is_not_expired() -> None:
    async def run() -> list[str]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        calls = [Call("first"), Call("second")]
        slots = []

        def expire(call: Call) -> None:
            fired.append(call.name)
            for slot, other in zip(slots, calls, strict=True):  # the first to expire ends the other
                deadlines.leave(slot, other)

        deadlines = Deadlines(loop, expire)
        at = loop.time() + 0.01
        slots.extend(deadlines.add(call, at) for call in calls)
        while deadlines.slots:
            await asyncio.sleep(0.01)
        return fired

    assert len(asyncio.run(run())) == 1


def test_a_deadline_under_a_second_away_fires_at_its_time_not_at_the_end_of_its_slot() -> None:
    # A caller's 1 ms deadline, rounded up to a 10 ms slot, let an engine answer 200 after 5 ms.
    async def run() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop, lambda call: None)
        now = loop.time()
        short, long = now + 0.0013, now + 30.0013
        short_slot, long_slot = deadlines.add(Call("short"), short), deadlines.add(Call("long"), long)
        assert short_slot.timer is not None and long_slot.timer is not None
        return short_slot.timer.when() - short, long_slot.timer.when() - long, 1 / SLOTS_PER_S

    short_late, long_late, slot = asyncio.run(run())
    assert short_late == 0
    assert 0 < long_late <= slot  # a route's seconds-long deadline still shares its slot's timer
