"""Property tests of the router's front: whatever a client sends or does with its answers, the next is served.

A real router process, raw sockets. Hypothesis builds request lines, headers and bodies, from
plausible to garbage; each is sent on a fresh connection, then a well-formed request follows (on
the same connection if the router kept it open, else on a new one) and must be served.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httptools
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.integration.raw_http import Answer, PeerClosed, RawConnection, completion, request
from tests.integration.router_harness import RouterProcess, UpstreamFarm, router_process, snapshot

pytestmark = pytest.mark.servers

ROUTE = "chat"
# Short limits so that hostile sizes are cheap to generate; a short header timeout for garbage heads.
LIMITS = ("--write-stall-timeout", "3",
          "--max-body-bytes", "4096", "--max-header-bytes", "2048", "--max-headers", "20", "--max-url-bytes", "512",
          "--header-timeout", "2")
ROUTER_ERRORS = {400, 404, 408, 413, 414, 431, 500, 502, 503, 504}

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=24)
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=64).map(str.encode)
VALUE = st.one_of(
    PRINTABLE, PRINTABLE, PRINTABLE,
    st.binary(max_size=64).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")),
    st.text(max_size=64).map(lambda text: text.encode().replace(b"\r", b"").replace(b"\n", b"")),
    st.integers(1, 3000).map(lambda size: b"v" * size),
)
NOTABLE = st.sampled_from(["x-request-id", "x-tenant-id", "x-session-id", "x-revgate-slices",
                           "x-revgate-timeout-ms", "content-type", "connection", "upgrade", "expect",
                           "transfer-encoding", "authorization"])
HEADERS = st.one_of(st.lists(st.tuples(st.one_of(NOTABLE, TOKEN), VALUE), max_size=6),
                    st.lists(st.tuples(TOKEN, PRINTABLE), min_size=15, max_size=30))
METHOD = st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
                   st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8))
PATH = st.one_of(
    st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/admin/notify", "/"]),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789/?=&%._-", max_size=700).map(lambda tail: "/" + tail),
)
BODY = st.one_of(
    st.binary(max_size=256),
    st.builds(lambda tokens, stream: completion(tokens, stream=stream), st.integers(-5, 6), st.booleans()),
    st.binary(min_size=4000, max_size=6000),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                 max_leaves=12).map(lambda document: json.dumps(document).encode()),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A request: well framed (so the router never waits for more), arbitrary in content; or garbage."""
    shape = draw(st.integers(0, 19))
    if shape == 0:  # raw garbage, ended like a head so the router need not wait for more
        return draw(st.binary(max_size=300)) + b"\r\n\r\n"
    if shape < 8:  # a plausible request: a real endpoint and method, odd values in the headers that matter
        method, path = draw(st.sampled_from([("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                             ("GET", "/v1/models"), ("GET", "/health")]))
        body = draw(BODY) if method == "POST" else b""
    else:
        method, path, body = draw(METHOD), draw(PATH), draw(BODY)
    headers = [(name, value) for name, value in draw(HEADERS)
               if name not in ("content-length", "transfer-encoding", "expect")]
    head = [f"{method} {path} HTTP/1.1\r\nhost: router\r\n".encode()]
    head += [name.encode() + b": " + value + b"\r\n" for name, value in headers]
    if draw(st.booleans()):
        head.append(b"transfer-encoding: chunked\r\n\r\n")
        return b"".join(head) + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    head.append(b"content-length: %d\r\n\r\n" % len(body))
    return b"".join(head) + body


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["a1"]) as upstreams:
        yield upstreams


@pytest.fixture(scope="module")
def router(farm: UpstreamFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("router-properties")
    with router_process(folder, ROUTE, snapshot(ROUTE, 1, [farm["a1"]]), extra=LIMITS) as process:
        yield process


def check_typed(answer: Answer) -> None:
    """A router-made error is an OpenAI-shaped JSON error; answers relayed from upstream name their revision."""
    if answer.status < 400 or "x-revgate-revision" in answer.headers:
        return
    assert answer.status in ROUTER_ERRORS, answer
    error = json.loads(answer.body)["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


def served(connection: RawConnection) -> bool:
    connection.send(request("POST", "/v1/completions", completion(), {"x-request-id": b"after"}))
    answer = connection.answer()
    return answer.status == 200 and b"a1-0" in answer.body


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=requests())
def test_any_request_gets_a_typed_answer_and_the_router_serves_the_next(router: RouterProcess, raw: bytes) -> None:
    with RawConnection(router.port, timeout=15) as connection:
        connection.send(raw)
        try:
            answer: Answer | None = connection.answer()
        except PeerClosed:
            answer = None  # closed without an answer: only after a protocol upgrade request
        if answer is None:
            assert b"upgrade" in raw.lower() or raw.split(b" ", 1)[0] == b"CONNECT", raw[:200]
        else:
            event(f"answered {answer.status}")
            check_typed(answer)
        if answer is not None and answer.headers.get("connection") != "close" and b"HEAD " not in raw[:5]:
            try:
                assert served(connection)
                return
            except PeerClosed:
                assert b"upgrade" in raw.lower() or answer.status >= 400, raw[:200]
    with RawConnection(router.port, timeout=15) as fresh:
        assert served(fresh)


# --- answers: callers who read slowly, partly, never, or reset ---------------------------------

ANSWER_TOKENS = st.sampled_from([2, 300, 4000, 15_000])  # from a few bytes to about 100 KiB


@st.composite
def consumers(draw: st.DrawFn) -> tuple[list[bytes], bool, str, int]:
    """Pipelined requests for answers of any size, a receive buffer, how much is read, how it ends."""
    wire = [request("POST", "/v1/completions", completion(draw(ANSWER_TOKENS), stream=draw(st.booleans())),
                    {"x-request-id": b"consumer"})
            for _ in range(draw(st.integers(1, 4)))]
    return wire, draw(st.booleans()), draw(st.sampled_from(["all", "some", "none"])), draw(st.integers(1, 200_000))


class Answers:
    """Counts the complete answers a parser has seen."""

    complete = 0

    def on_message_complete(self) -> None:
        self.complete += 1


def in_flight(router: RouterProcess) -> list[int]:
    import httpx

    lines = httpx.get(f"{router.admin_url}/metrics", timeout=10).text.splitlines()
    return [int(float(line.rsplit(" ", 1)[1])) for line in lines if line.startswith("revgate_router_in_flight{")]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(behaviour=consumers(), reset=st.booleans())
def test_whatever_a_caller_does_with_its_answers_the_next_caller_is_served(
    router: RouterProcess, behaviour: tuple[list[bytes], bool, str, int], reset: bool
) -> None:
    import socket
    import struct
    import time

    from tests.integration.router_harness import wait_until

    wire, tiny, reading, budget = behaviour
    sock = socket.socket()
    if tiny:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", router.port))
    sock.settimeout(10)
    sock.sendall(b"".join(wire))
    wanted = {"all": 1 << 40, "some": budget, "none": 0}[reading]
    counted = Answers()
    parser = httptools.HttpResponseParser(counted)
    received = 0
    with contextlib.suppress(OSError):
        while received < wanted and counted.complete < len(wire) and (data := sock.recv(65536)):
            received += len(data)
            parser.feed_data(data)
    if reading == "all":
        assert counted.complete == len(wire), "a caller reading everything did not get every answer"
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    started = time.monotonic()
    with RawConnection(router.port, timeout=15) as fresh:
        assert served(fresh), "the next caller was not served"
    assert time.monotonic() - started < 10, "the next caller waited on another caller's answers"
    assert min(in_flight(router), default=0) >= 0
    wait_until(lambda: sum(in_flight(router)) == 0, timeout=15, describe=lambda: f"in flight {in_flight(router)}")
