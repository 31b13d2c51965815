"""The evidence outbox: straight through before a decision, held in order while the ledger is away after it."""

from __future__ import annotations

import threading

import pytest

from revgate.registry.outbox import BROKEN_TRIES, EvidenceOutbox


class Ledger:
    """The far side: a ledger that can be taken away and brought back, and that records what it took."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.taken: list[str] = []
        self.tries: dict[str, int] = {}

    def reachable(self) -> bool:
        if not self.up.is_set():
            raise ConnectionError("ledger down")
        return True

    def write(self, name: str, *, broken: bool = False) -> None:
        self.tries[name] = self.tries.get(name, 0) + 1
        self.reachable()
        if broken:
            raise ValueError(f"{name} refused")
        self.taken.append(name)


def outbox_for(ledger: Ledger, said: list[str]) -> EvidenceOutbox:
    return EvidenceOutbox(ledger.reachable, say=said.append, backoff_s=(0.01, 0.05))


def test_before_the_decision_a_write_is_made_at_once_and_its_error_is_the_callers() -> None:
    ledger, said = Ledger(), []
    outbox = outbox_for(ledger, said)
    outbox.write("plan", lambda: ledger.write("plan"))
    assert ledger.taken == ["plan"]
    ledger.up.clear()
    with pytest.raises(ConnectionError):
        outbox.write("gate report", lambda: ledger.write("gate report"))
    assert outbox.pending() == ()


def test_after_the_decision_writes_wait_out_an_outage_and_land_in_their_order() -> None:
    ledger, said = Ledger(), []
    outbox = outbox_for(ledger, said)
    ledger.up.clear()
    outbox.defer()
    for name in ("route generation 7", "window's end", "decision", "close"):
        outbox.write(name, lambda name=name: ledger.write(name))  # returns at once: nothing waits for the ledger
    assert ledger.taken == []
    assert outbox.flush(0.2) == ("route generation 7", "window's end", "decision", "close")

    outbox = outbox_for(ledger, said)
    outbox.defer()
    for name in ("route generation 7", "window's end", "decision", "close"):
        outbox.write(name, lambda name=name: ledger.write(name))
    threading.Timer(0.2, ledger.up.set).start()
    assert outbox.flush(30) == ()
    assert ledger.taken == ["route generation 7", "window's end", "decision", "close"]
    assert outbox.outages == 1
    assert any("unreachable" in line for line in said) and any("is back" in line for line in said)


def test_a_write_the_answering_ledger_refuses_is_dropped_by_name_and_the_rest_still_lands() -> None:
    ledger, said = Ledger(), []
    outbox = outbox_for(ledger, said)
    outbox.defer()
    outbox.write("registry", lambda: ledger.write("registry", broken=True))
    outbox.write("close", lambda: ledger.write("close"))
    assert outbox.flush(30) == ()
    assert ledger.taken == ["close"]
    assert ledger.tries["registry"] == BROKEN_TRIES
    assert outbox.dropped == ["registry"]
    assert any("'registry'" in line and "dropped" in line for line in said)
