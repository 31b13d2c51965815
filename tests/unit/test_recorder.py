"""Records made at the end of the loop's turn: in order, all of them, and one that fails costs no other."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from revgate.serving.router.evidence import RECORD_KEYS, Recorder
from revgate.serving.router.metrics import RouterMetrics


class Kept:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def append(self, record: Any) -> None:
        self.records.append(record)


def ended_call(request_id: str) -> Any:
    target = SimpleNamespace(fingerprint="sha256:" + "a" * 64, arm="stable", labels=(("route", "chat"),),
                             outcome_labels={})
    route = SimpleNamespace(snapshot=SimpleNamespace(route="chat", generation=3))
    return SimpleNamespace(relay=None, request_id=request_id, target=target, arrival_s=1.0, attempts=1, route=route,
                           tenant="t", slices={}, endpoint="http://e:1", caller_request_id="", fallback_from="")


def test_requests_that_end_in_a_turn_are_recorded_at_its_end_in_order_and_one_that_fails_costs_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept, metrics = Kept(), RouterMetrics()
    recorder = Recorder(kept, metrics, record_outputs=False)
    broken = ended_call("broken")
    broken.target = None  # a defect in what the record reads

    async def turn() -> int:
        for call in (ended_call("first"), broken, ended_call("last")):
            recorder.later(call, "error", "upstream reset")
        during = len(kept.records)
        await asyncio.sleep(0)  # the end of the turn
        return during

    with caplog.at_level(logging.ERROR, logger="revgate.router"):
        during = asyncio.run(turn())
    assert during == 0
    assert [record["request_id"] for record in kept.records] == ["first", "last"]
    assert all(tuple(record) == RECORD_KEYS and record["outcome"] == "error" for record in kept.records)
    assert all(record["last_token_s"] > 1.0 for record in kept.records)  # when it ended, not when recorded: set
    assert metrics.events[(("event", "record_failed"), ("route", "chat"))] == 1
    assert "recording request broken failed" in caplog.text
    assert sum(metrics.requests.values()) == 2
