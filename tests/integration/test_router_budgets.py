"""The router's global budgets through a real router: connections, bytes unsent to callers, bytes kept per answer.

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
SLACK_S = 15.0


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    with UpstreamFarm(["a1"]) as farm:
        flags = ("--max-connections", str(MAX_CONNECTIONS), "--max-buffered-bytes", str(BUFFERED_BUDGET),
                 "--record-keep-bytes", str(KEEP_BYTES), "--write-stall-timeout", "60")
        with router_process(tmp_path_factory.mktemp("budgets"), ROUTE, snapshot(ROUTE, 1, [farm["a1"]]),
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


def test_over_the_unsent_bytes_budget_new_requests_get_503_until_the_backlog_goes(router: RouterProcess) -> None:
    shed = counter(router, "requests_shed_total")
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(("127.0.0.1", router.port))
    hog.sendall(request("POST", "/v1/completions", completion(800_000), {"x-request-id": b"budget-hog"}))
    wait_until(lambda: counter(router, "unsent_bytes") > BUFFERED_BUDGET, timeout=SLACK_S,
               describe=lambda: f"unsent {counter(router, 'unsent_bytes')}")

    def shed_now() -> bool:
        with ask(router, "during-the-backlog") as connection:
            answer = connection.answer()
        return answer.status == 503 and answer.headers.get("retry-after") == "1"

    wait_until(shed_now, timeout=SLACK_S)  # within a watchdog tick of the budget passing
    assert counter(router, "requests_shed_total") > shed
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    hog.close()  # the backlog goes with its caller

    def served() -> bool:
        with ask(router, "after-the-backlog") as connection:
            return connection.answer().status == 200

    wait_until(served, timeout=SLACK_S)


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
