"""The router's global budgets through a real router: connections, bytes unsent to callers, bytes kept for records.

Each budget has its own answer, a 503 with Retry-After that names it, and a counter; the router
serves again as soon as the budget frees up.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import httpx
import pytest

from revgate.evaluation.records import RequestRecord
from tests.integration.raw_http import RawConnection, completion, request
from tests.integration.router_harness import RouterProcess, UpstreamFarm, router_process, snapshot, wait_until

pytestmark = pytest.mark.servers

ROUTE = "chat"
MAX_CONNECTIONS = 8
BUFFERED_BUDGET = 64 * 1024
KEEP_BYTES = 4096
RECORD_BUDGET = 2 * KEEP_BYTES  # three answers in flight, each kept to KEEP_BYTES, pass it
SLACK_S = 15.0


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    with UpstreamFarm(["a1"]) as farm:
        flags = ("--max-connections", str(MAX_CONNECTIONS), "--max-buffered-bytes", str(BUFFERED_BUDGET),
                 "--record-keep-bytes", str(KEEP_BYTES), "--write-stall-timeout", "60")
        with router_process(tmp_path_factory.mktemp("budgets"), ROUTE, snapshot(ROUTE, 1, [farm["a1"]]),
                            extra=flags) as process:
            yield process


@pytest.fixture(scope="module")
def recording_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    """A router whose record-bytes budget is the one a few answers in flight pass (its unsent budget is far)."""
    with UpstreamFarm(["a1"]) as farm:
        flags = ("--max-record-bytes", str(RECORD_BUDGET), "--record-keep-bytes", str(KEEP_BYTES),
                 "--max-buffered-bytes", str(1 << 30), "--write-stall-timeout", "60")
        with router_process(tmp_path_factory.mktemp("records"), ROUTE, snapshot(ROUTE, 1, [farm["a1"]]),
                            extra=flags) as process:
            yield process


def counter(router: RouterProcess, name: str) -> int:
    for line in httpx.get(f"{router.admin_url}/metrics").text.splitlines():
        if line.startswith(f"revgate_router_{name}"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def ask(router: RouterProcess, caller_id: str, max_tokens: int = 2) -> RawConnection:
    connection = RawConnection(router.port, timeout=SLACK_S)
    connection.send(request("POST", "/v1/completions", completion(max_tokens), {"x-request-id": caller_id.encode()}))
    return connection


def test_past_the_connection_cap_a_new_caller_gets_503_and_the_router_serves_once_one_closes(
    router: RouterProcess,
) -> None:
    wait_until(lambda: counter(router, "caller_connections") == 0, timeout=SLACK_S)
    refused = counter(router, "connections_refused_total")
    held = [RawConnection(router.port, timeout=SLACK_S) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_until(lambda: counter(router, "caller_connections") >= MAX_CONNECTIONS, timeout=SLACK_S)
        with ask(router, "over-the-cap") as extra:
            answer = extra.answer()
        assert answer.status == 503 and answer.headers["retry-after"] == "1"
        assert answer.error()["type"] == "overloaded" and "--max-connections" in answer.error()["fix"]
        assert counter(router, "connections_refused_total") == refused + 1
    finally:
        for connection in held:
            connection.close()
    wait_until(lambda: counter(router, "caller_connections") == 0, timeout=SLACK_S)
    with ask(router, "after-the-cap") as connection:
        assert connection.answer().status == 200


def hog(router: RouterProcess, caller_id: str) -> socket.socket:
    """A caller that asks for a long answer and reads none of it: the router holds its answer in flight."""
    connection = socket.socket()
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.connect(("127.0.0.1", router.port))
    connection.sendall(request("POST", "/v1/completions", completion(800_000), {"x-request-id": caller_id.encode()}))
    return connection


def reset(connection: socket.socket) -> None:
    """Leave as a client whose own timeout fired: a reset, not a close that waits."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


def shed_for(router: RouterProcess, flag: str) -> bool:
    """Whether a new request now gets the 503 with Retry-After that names ``flag``."""
    with ask(router, "during-the-backlog") as connection:
        answer = connection.answer()
    return answer.status == 503 and answer.headers.get("retry-after") == "1" and flag in answer.error()["fix"]


def served(router: RouterProcess) -> bool:
    with ask(router, "after-the-backlog") as connection:
        return connection.answer().status == 200


def test_over_the_unsent_bytes_budget_new_requests_get_503_until_the_backlog_goes(router: RouterProcess) -> None:
    shed = counter(router, "requests_shed_total")
    hogged = hog(router, "budget-hog")
    wait_until(lambda: counter(router, "unsent_bytes") > BUFFERED_BUDGET, timeout=SLACK_S,
               describe=lambda: f"unsent {counter(router, 'unsent_bytes')}")

    wait_until(lambda: shed_for(router, "--max-buffered-bytes"), timeout=SLACK_S)  # within a watchdog tick
    assert counter(router, "requests_shed_total") > shed
    reset(hogged)  # the backlog goes with its caller
    wait_until(lambda: served(router), timeout=SLACK_S)


def test_over_the_record_bytes_budget_new_requests_get_503_until_the_answers_in_flight_end(
    recording_router: RouterProcess,
) -> None:
    router = recording_router
    hogs = [hog(router, f"record-hog-{n}") for n in range(3)]
    try:
        wait_until(lambda: counter(router, "record_held_bytes") > RECORD_BUDGET, timeout=SLACK_S,
                   describe=lambda: f"kept {counter(router, 'record_held_bytes')}")
        assert counter(router, "unsent_bytes") < 1 << 30  # the other budget is nowhere near
        wait_until(lambda: shed_for(router, "--max-record-bytes"), timeout=SLACK_S)
        assert counter(router, "requests_shed_records_total") > 0 and counter(router, "requests_shed_total") == 0
    finally:
        for connection in hogs:
            reset(connection)
    wait_until(lambda: counter(router, "record_held_bytes") == 0, timeout=SLACK_S)
    wait_until(lambda: served(router), timeout=SLACK_S)


def test_an_answer_past_the_kept_bytes_is_relayed_whole_and_recorded_from_its_two_ends(router: RouterProcess) -> None:
    tokens = 3000  # about 20 KiB of answer, five times what a record may keep of it
    with ask(router, "kept-ends", tokens) as connection:
        answer = connection.answer()
    assert answer.status == 200 and answer.body.count(b"a1-") == tokens  # the caller got all of it

    def recorded() -> list[RequestRecord]:
        return [r for r in map(RequestRecord.from_json, router.records_lines()) if r.caller_request_id == "kept-ends"]

    wait_until(recorded, timeout=SLACK_S)
    record = recorded()[0]
    assert record.outcome == "ok" and record.output_tokens == tokens and record.finish_reason == "length"
