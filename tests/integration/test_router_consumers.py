"""The router's answers to callers who read slowly, reset, or never read; bodies of every JSON shape.

Each test is a reproduction through a real router process on real sockets: a caller with a tiny
receive buffer, one that resets its connection as a client whose own timeout fired would, one that
pipelines large answers and never reads, and bodies whose JSON the shadow check must survive. The
users who rely on it are the other callers: one careless client must never cost them an answer.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from revgate.evaluation.records import RequestRecord
from tests.integration.raw_http import RawConnection, completion, memory_kib, request
from tests.integration.router_harness import RouterProcess, UpstreamFarm, router_process, snapshot, wait_until

pytestmark = pytest.mark.servers

ROUTE = "chat"
SMALL_TOKENS = 4_000  # about 28 KiB of answer: one read from the upstream
BIG_TOKENS = 15_000  # about 100 KiB of answer: well past the transport's 64 KiB high-water mark
DEADLINE_MS = b"8000"  # the well-behaved caller's own deadline: the defect made it wait this out
IDLE_TIMEOUT_S, WRITE_STALL_S = 2.0, 2.0
HEADER_CAP = 16 * 1024
SLACK_S = 30.0  # scheduling on two shared, busy cores (a run beside whole rollouts took past 15 s once)


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["a1", "b1", "sh1"]) as upstreams:
        yield upstreams


@pytest.fixture(scope="module")
def router(farm: UpstreamFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("router-consumers")
    flags = ("--idle-timeout", str(IDLE_TIMEOUT_S), "--write-stall-timeout", str(WRITE_STALL_S),
             "--max-header-bytes", str(HEADER_CAP))
    with router_process(folder, ROUTE, snapshot(ROUTE, 1, [farm["a1"]]), extra=flags) as process:
        yield process


def tiny_reader(port: int) -> socket.socket:
    """A caller whose receive buffer holds 4 KiB: the router's writes to it back up at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a reset, as a client whose own timeout fired does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def big(caller_id: str) -> bytes:
    return request("POST", "/v1/completions", completion(BIG_TOKENS), {"x-request-id": caller_id.encode()})


def records_of(router: RouterProcess, caller_id: str) -> list[RequestRecord]:
    return [record for record in map(RequestRecord.from_json, router.records_lines())
            if record.caller_request_id == caller_id]


def served_promptly(router: RouterProcess, caller_id: str) -> tuple[int, float]:
    """A small request on a new connection, with the caller's own deadline: its status and seconds."""
    started = time.monotonic()
    with RawConnection(router.port, timeout=30) as connection:
        connection.send(request("POST", "/v1/completions", completion(),
                                {"x-request-id": caller_id.encode(), "x-revgate-timeout-ms": DEADLINE_MS}))
        answer = connection.answer()
    return answer.status, time.monotonic() - started


def counter(router: RouterProcess, name: str) -> int:
    """One of the router's counters, from its metrics."""
    for line in httpx.get(f"{router.admin_url}/metrics").text.splitlines():
        if line.startswith(f"revgate_router_{name}_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_a_caller_who_resets_mid_answer_costs_the_next_caller_nothing(router: RouterProcess) -> None:
    # The defect: when a caller's socket backed up on the last piece of an answer, the upstream
    # connection, paused for it, went back to the pool still paused; the next request on it, from
    # anyone, was never read and was answered 504 at its deadline. Answers of ~28 KiB arrive in one
    # read each, so the backing-up happens on an answer's last piece once the kernel's buffers fill.
    slow = tiny_reader(router.port)
    paused_before = counter(router, "caller_write_paused")
    for index in range(600):
        slow.sendall(request("POST", "/v1/completions", completion(SMALL_TOKENS),
                             {"x-request-id": f"slow-{index}".encode()}))
        wait_until(lambda i=index: bool(records_of(router, f"slow-{i}"))
                   or counter(router, "caller_write_paused") > paused_before,
                   timeout=SLACK_S, describe=lambda: "the slow caller's answer was neither recorded nor held")
        status, seconds = served_promptly(router, f"meanwhile-{index}")
        assert status == 200, f"a well-behaved caller got {status} in {seconds:.1f} s while another read nothing"
        if counter(router, "caller_write_paused") > paused_before:
            break
    assert counter(router, "caller_write_paused") > paused_before, "the slow caller never backed up: no test"
    reset(slow)
    for index in range(3):
        status, seconds = served_promptly(router, f"after-reset-{index}")
        assert status == 200, f"a well-behaved caller got {status} after a slow caller reset ({seconds:.1f} s)"


def test_a_slow_reader_is_served_whole_and_others_are_served_meanwhile(router: RouterProcess) -> None:
    slow = tiny_reader(router.port)
    slow.settimeout(30)
    for index in range(3):  # answers one by one, read 4 KiB at a time with pauses
        slow.sendall(big(f"trickle-{index}"))
        received = b""
        while b"a1-%d " % (BIG_TOKENS - 1) not in received:
            received += slow.recv(4096)
            if len(received) % (32 * 1024) < 4096:
                status, _ = served_promptly(router, f"meanwhile-{index}-{len(received)}")
                assert status == 200
        assert received.startswith(b"HTTP/1.1 200")
    slow.close()


def test_a_caller_who_never_reads_is_cut_off_and_the_router_stays_small(router: RouterProcess) -> None:
    # The defect: answers to a write-paused caller kept being appended to its buffer, the idle
    # timeout's close() waited for a flush that never came: the socket stayed open, the router grew.
    before = memory_kib(router.process.pid, "VmRSS")
    stalled = counter(router, "caller_write_stalled")
    hog = tiny_reader(router.port)
    wire = b"".join(big(f"hog-{index}") for index in range(100))  # about 10 MB of answers asked for
    sender = threading.Thread(target=send_until_cut, args=(hog, wire), daemon=True)
    sender.start()  # blocks once the router stops reading the pipeline; ends when the router cuts it off
    wait_until(lambda: counter(router, "caller_write_stalled") > stalled, timeout=WRITE_STALL_S + SLACK_S,
               describe=lambda: "the router kept a connection whose caller never read")
    sender.join(SLACK_S)
    assert not sender.is_alive(), "the router still reads a pipeline from a caller it cut off"
    received = drain(hog)
    assert received.count(b"HTTP/1.1 200") < 100, "the router answered a whole pipeline nobody read"
    grown_kib = memory_kib(router.process.pid, "VmRSS") - before
    assert grown_kib < 32 * 1024, f"the router grew by {grown_kib} KiB for one caller who never read"
    assert served_promptly(router, "after-hog")[0] == 200


def send_until_cut(sock: socket.socket, wire: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(wire)


def drain(sock: socket.socket) -> bytes:
    """Everything the caller had been sent, up to the end of the connection (EOF or reset)."""
    sock.settimeout(SLACK_S)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while data := sock.recv(1 << 16):
            received += data
    sock.close()
    return received


@pytest.mark.parametrize("body", [
    {"tools": 1}, {"tools": "x"}, {"tools": [1, None, "a"]}, {"tools": [{"function": 3}]},
    {"tools": [{"function": {"name": ["x"]}}]}, {"messages": 5}, {"messages": [{"tool_calls": 7}]},
    {"messages": [{"tool_calls": [{"function": "f"}]}]}, {"functions": {"name": "x"}}, {"functions": 2},
])
def test_any_json_shape_gets_one_answer_and_one_record(router: RouterProcess, farm: UpstreamFarm,
                                                       body: dict[str, object]) -> None:
    # The defect: {"tools": 1} (which vLLM answers) crashed the shadow check after the answer; the
    # keep-alive connection then got no answer to its next request, and the record was written twice.
    router.commit(lambda g: snapshot(ROUTE, g, [farm["a1"]], shadow=[farm["sh1"]], sample_ppm=1_000_000,
                                     side_effecting_tools=("charge_card",)))
    caller_id = "shape-" + json.dumps(body, sort_keys=True)
    with RawConnection(router.port, timeout=20) as connection:
        payload = json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2, **body}).encode()
        connection.send(request("POST", "/v1/completions", payload, {"x-request-id": caller_id.encode()}))
        assert connection.answer().status == 200
        connection.send(request("POST", "/v1/completions", completion(),
                                {"x-request-id": b"after-" + caller_id.encode()}))
        assert connection.answer().status == 200, "the connection stopped answering after an odd body"
    wait_until(lambda: records_of(router, "after-" + caller_id), timeout=SLACK_S)
    assert [record.arm for record in records_of(router, caller_id)].count("stable") == 1


def test_an_escaped_tool_name_is_read_as_the_shadow_would_read_it(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(lambda g: snapshot(ROUTE, g, [farm["a1"]], shadow=[farm["sh1"]], sample_ppm=1_000_000,
                                     side_effecting_tools=("charge_card",)))
    skipped = counter(router, "shadow_skipped_side_effecting")
    # "\u0074ools" is "tools" once decoded: the shadow would receive a charge_card tool.
    payload = (b'{"model": "chat", "prompt": "hi", "max_tokens": 2, '
               b'"\\u0074ools": [{"type": "function", "function": {"name": "charge_card"}}]}')
    assert json.loads(payload)["tools"][0]["function"]["name"] == "charge_card"
    with RawConnection(router.port, timeout=20) as connection:
        connection.send(request("POST", "/v1/completions", payload, {"x-request-id": b"escaped-tool"}))
        assert connection.answer().status == 200
    wait_until(lambda: records_of(router, "escaped-tool"), timeout=SLACK_S)
    assert counter(router, "shadow_skipped_side_effecting") == skipped + 1, "a side-effecting tool reached the shadow"


@pytest.mark.parametrize("value", [b"9" * 5000, b"1" + b"0" * 40, b"-5", b"12ms", b"0"])
def test_an_unreadable_timeout_header_gets_a_typed_400_and_the_connection_serves_on(router: RouterProcess,
                                                                                     value: bytes) -> None:
    # The defect: 4,300 digits or more answered 500 with a stack trace per request.
    with RawConnection(router.port, timeout=20) as connection:
        connection.send(request("POST", "/v1/completions", completion(), {"x-revgate-timeout-ms": value}))
        answer = connection.answer()
        assert answer.status == 400, answer.body[:200]
        assert answer.error()["where"] == "header x-revgate-timeout-ms"
        connection.send(request("POST", "/v1/completions", completion(), {"x-revgate-timeout-ms": b"30000"}))
        assert connection.answer().status == 200


def test_a_head_that_begins_in_the_same_read_as_a_body_ends_is_held_to_the_cap(router: RouterProcess) -> None:
    # The defect: the bytes of a read in which a body ended were not counted toward the next
    # request's head, so a pipelined head of any size up to the next read passed the cap.
    oversized = {f"x-filler-{index}": b"f" * 1000 for index in range(24)}  # 24 KiB of fields, cap 16 KiB
    with RawConnection(router.port, timeout=20) as connection:
        connection.send(request("POST", "/v1/completions", completion(), {"x-request-id": b"before-big-head"})
                        + request("POST", "/v1/completions", completion(), oversized))  # one write, one read
        assert connection.answer().status == 200
        refused = connection.answer()
    assert refused.status == 431 and refused.error()["where"] == "request headers"
