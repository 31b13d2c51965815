"""The router's front under hostile and broken clients, through a real router process on real sockets.

Each test sends what a careless or hostile client can send (half a header, a huge body, a huge
header, undecodable ids, a burst of pipelined requests, a forged id, a token without ``Bearer``)
and checks the typed answer, what the router's memory did, and that it serves on.
"""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from revgate.evaluation.records import RequestRecord
from revgate.serving.worker.engine import free_port
from revgate.shadow.records import PairedRecord
from tests.conftest import ROOT
from tests.integration.raw_http import RawConnection, completion, memory_kib, request
from tests.integration.router_harness import RouterProcess, UpstreamFarm, router_process, snapshot, wait_until

pytestmark = pytest.mark.servers

ROUTE = "chat"
MIB = 1024 * 1024
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, IDLE_TIMEOUT_S = 1.0, 1.0, 2.0
SLACK_S = 10.0  # scheduling on two shared, busy cores; the defects kept connections for ever


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["a1", "s1"]) as upstreams:
        yield upstreams


@pytest.fixture(scope="module")
def router(farm: UpstreamFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("router-limits")
    limits = ("--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
              "--idle-timeout", str(IDLE_TIMEOUT_S))
    with router_process(folder, ROUTE, snapshot(ROUTE, 1, [farm["a1"]]), extra=limits) as process:
        yield process


def served(router: RouterProcess) -> bool:
    """A well-formed request on a new connection gets its answer."""
    with RawConnection(router.port) as connection:
        connection.send(request("POST", "/v1/completions", completion()))
        answer = connection.answer()
    return answer.status == 200 and b"a1-0" in answer.body


def records_of(router: RouterProcess, caller_id: str, count: int) -> list[RequestRecord]:
    found: list[RequestRecord] = []

    def written() -> bool:
        found[:] = [record for record in map(RequestRecord.from_json, router.records_lines())
                    if record.caller_request_id == caller_id]
        return len(found) >= count

    wait_until(written, timeout=10)
    return found


def test_a_body_over_the_cap_is_refused_while_it_streams_in_and_memory_stays_flat(router: RouterProcess) -> None:
    before = memory_kib(router.process.pid)
    sent = 0
    with RawConnection(router.port) as connection:
        connection.send(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (MIB, b"x" * MIB)
        try:
            while sent < 256 * MIB and not select.select([connection.sock], [], [], 0)[0]:
                connection.send(piece)
                sent += MIB
        except OSError:
            pass  # the router stopped reading after its answer: the rest of the body is not wanted
        answer = connection.answer()
        assert connection.at_eof()  # the refusal is the connection's last answer
    grown_mib = (memory_kib(router.process.pid) - before) / 1024
    assert answer.status == 413 and answer.headers["connection"] == "close"
    error = answer.error()
    assert (error["type"], error["where"]) == ("request_too_large", "request body") and error["fix"]
    assert sent < 64 * MIB, f"answered only after {sent // MIB} MiB"
    assert grown_mib < 48, f"the router's peak memory grew by {grown_mib:.0f} MiB for a 256 MiB body"
    assert served(router)


def test_a_declared_length_over_the_cap_is_refused_before_the_body(router: RouterProcess) -> None:
    with RawConnection(router.port) as connection:
        connection.send(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-length: %d\r\n\r\n" % (256 * MIB))
        answer = connection.answer()  # no body byte sent
    assert answer.status == 413 and answer.error()["where"] == "request body"


@pytest.mark.parametrize(("what", "head", "status", "where"), [
    ("a 1 MiB header", b"GET /health HTTP/1.1\r\nx-big: " + b"a" * MIB + b"\r\n\r\n", 431, "request headers"),
    ("200 header fields", b"GET /health HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % n for n in range(200)) + b"\r\n",
     431, "request headers"),
    ("a 16 KiB URL", b"GET /health?" + b"q" * 16384 + b" HTTP/1.1\r\n\r\n", 414, "request line"),
    ("a malformed request line", b"GET / HTTP/9.9 nonsense\r\n\r\n", 400, "request"),
])
def test_an_oversized_or_malformed_head_gets_a_typed_answer(router: RouterProcess, what: str, head: bytes,
                                                             status: int, where: str) -> None:
    before = memory_kib(router.process.pid)
    with RawConnection(router.port) as connection:
        connection.send(head)
        answer = connection.answer()
        assert connection.at_eof()
    assert answer.status == status, what
    assert answer.error()["where"] == where and answer.error()["fix"]
    assert memory_kib(router.process.pid) - before < 8 * 1024, what
    assert served(router)


def test_half_header_clients_are_disconnected_after_the_header_timeout(router: RouterProcess) -> None:
    clients = []
    for _ in range(300):
        client = socket.create_connection(("127.0.0.1", router.port), timeout=10)
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-le")
        client.setblocking(False)
        clients.append(client)
    started = time.monotonic()
    still_open, answers = set(clients), {client: b"" for client in clients}
    try:
        while still_open and time.monotonic() < started + HEADER_TIMEOUT_S + SLACK_S:
            readable, _, _ = select.select(list(still_open), [], [], 0.2)
            for client in readable:
                try:
                    data = client.recv(65536)
                except ConnectionResetError:
                    data = b""
                answers[client] += data
                if not data:
                    still_open.discard(client)
        elapsed = time.monotonic() - started
        assert not still_open, f"{len(still_open)} of 300 half-header clients still connected after {elapsed:.1f} s"
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers.values())
        assert b'"where": "request headers"' in answers[clients[0]]
    finally:
        for client in clients:
            client.close()
    assert served(router)


def test_a_slow_body_gets_408_and_an_idle_connection_is_closed(router: RouterProcess) -> None:
    with RawConnection(router.port, timeout=BODY_TIMEOUT_S + SLACK_S) as connection:
        connection.send(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-length: 100\r\n\r\n{\"model\"")
        answer = connection.answer()
    assert answer.status == 408 and answer.error()["where"] == "request body"
    with RawConnection(router.port, timeout=IDLE_TIMEOUT_S + SLACK_S) as connection:
        connection.send(request("POST", "/v1/completions", completion()))
        assert connection.answer().status == 200
        started = time.monotonic()
        assert connection.at_eof()  # kept alive, then closed once idle
        assert time.monotonic() - started >= IDLE_TIMEOUT_S / 2


@pytest.mark.parametrize("header", ["x-request-id", "x-tenant-id"])
def test_an_undecodable_id_is_refused_and_the_connection_serves_on(router: RouterProcess, header: str) -> None:
    with RawConnection(router.port) as connection:
        connection.send(request("POST", "/v1/completions", completion(), {header: b"\xff\xfe-not-utf8"}))
        refused = connection.answer()
        connection.send(request("POST", "/v1/completions", completion(), {header: b"fine"}))
        following = connection.answer()
    assert refused.status == 400 and refused.error()["where"] == f"header {header}"
    assert following.status == 200 and b"a1-0" in following.body


def test_pipelined_requests_are_answered_in_order_while_reading_pauses(router: RouterProcess) -> None:
    before = memory_kib(router.process.pid)
    slow = request("POST", "/v1/completions", completion(4, user="delay-ms:250"), {"x-request-id": b"p-slow"})
    big = [request("POST", "/v1/completions", completion(1, prompt="x" * MIB), {"x-request-id": b"p-%d" % n})
           for n in range(64)]
    with RawConnection(router.port, timeout=60) as connection:
        sender = threading.Thread(target=connection.send, args=(slow + b"".join(big),))
        sender.start()
        answers = [connection.answer() for _ in range(65)]
        sender.join(60)
    assert [answer.status for answer in answers] == [200] * 65
    assert answers[0].body.count(b"a1-") == 4  # the slow one first, as sent
    assert [record.outcome for record in records_of(router, "p-63", 1)] == ["ok"]
    grown_mib = (memory_kib(router.process.pid) - before) / 1024
    assert grown_mib < 32, f"64 pipelined 1 MiB requests grew the router's peak memory by {grown_mib:.0f} MiB"


def test_the_router_names_requests_and_a_callers_id_cannot_collide(router: RouterProcess,
                                                                  farm: UpstreamFarm) -> None:
    answers = [httpx.post(f"{router.url}/v1/completions", content=completion(), headers={"x-request-id": "same"})
               for _ in range(2)]
    ids = [answer.headers["x-request-id"] for answer in answers]
    assert ids[0] != ids[1] and "same" not in ids and all(re.fullmatch("[0-9a-f]{24}", i) for i in ids)
    assert {record.request_id for record in records_of(router, "same", 2)} == set(ids)  # both kept, none overwritten
    # The shadow sample is keyed by the router's id: one caller id is not all-or-nothing mirrored.
    router.commit(lambda generation: snapshot(ROUTE, generation, [farm["a1"]], shadow=[farm["s1"]],
                                              sample_ppm=500_000))
    try:
        for _ in range(40):
            assert httpx.post(f"{router.url}/v1/completions", content=completion(),
                              headers={"x-request-id": "fixed"}).status_code == 200

        def mirrored() -> int:
            metrics = httpx.get(f"{router.admin_url}/metrics").text
            found = re.search(r'revgate_router_shadow_mirrored_total\{route="chat"\} (\d+)', metrics)
            return int(found.group(1)) if found else 0

        def paired() -> list[PairedRecord]:
            lines = router.paired.read_text().splitlines() if router.paired.exists() else []
            return [pair for pair in map(PairedRecord.from_json, lines) if pair.caller_request_id == "fixed"]

        wait_until(lambda: mirrored() == len(paired()), timeout=20)
        assert 0 < len(paired()) < 40
        assert len({pair.request_id for pair in paired()}) == len(paired())
    finally:
        router.commit(lambda generation: snapshot(ROUTE, generation, [farm["a1"]]))


def test_admin_actions_need_exactly_bearer_and_the_token(router: RouterProcess) -> None:
    notify = f"{router.admin_url}/admin/notify"
    for offered in (router.token, f"bearer {router.token}", f"Token {router.token}", f"Bearer {router.token}x",
                    "Bearer"):
        assert httpx.post(notify, headers={"Authorization": offered}).status_code == 401, offered
    assert httpx.post(notify, headers={"Authorization": f"Bearer {router.token}"}).status_code == 200


def test_a_token_file_others_can_read_is_refused_at_start(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    token.chmod(0o644)
    command = [sys.executable, "-m", "revgate.cli.main",
               "router", "--routes", str(tmp_path / "routes"), "--route", ROUTE,
               "--port", str(free_port()), "--admin-port", str(free_port()), "--admin-token-file", str(token)]
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                                env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("the router started with a token file readable by other users")
    assert result.returncode == 2
    assert "AdminTokenInvalid" in result.stderr and "chmod 600" in result.stderr
