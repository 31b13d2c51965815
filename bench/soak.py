"""Router soak: mixed, partly hostile traffic for a long run with route swaps; does anything grow or get lost?

One command: ``.venv/bin/python bench/soak.py [--minutes 30]`` (on demand; not part of ``make test``).
A revgate router runs in front of two cheap upstreams (revisions alpha and beta, each naming itself
in every token); the stable revision swaps between them every ``--swap-every`` seconds. Clients
send a steady mix: plain completions, streams, streams cancelled by the caller, slow readers,
callers that reset their connection mid-stream, callers that leave a 230 KB answer unread on a
4 KiB buffer for 3 s, oversized bodies, malformed requests, half headers and undecodable ids. Before
the mix, 200 plain requests are sent alone: during the soak no plain request may take longer than
that baseline's p99 plus ``SLOWER_BOUND_MS`` (500 ms); how many did is ``plain_over_bound``. Every ``--sample-every``
seconds the router's RSS and open descriptors (from /proc) and its asyncio tasks and connections
(its /metrics) are sampled.

Checked per answer: the revision in the ``x-revgate-revision`` header is the one whose tokens the
body carries, every token of a stream comes from one revision (``mixed``), and each hostile request
gets its typed answer. ``lost``: a request that got no complete answer although its caller waited.
Writes bench/results/soak.json and docs/img/soak.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.router import started, wait_for  # noqa: E402 - after the path set-up, as a script
from revgate.serving.worker.engine import free_port  # noqa: E402

NAMES = ("alpha", "beta")
FINGERPRINT = {"alpha": "sha256:" + "a" * 64, "beta": "sha256:" + "b" * 64}
BY_FINGERPRINT = {value: key for key, value in FINGERPRINT.items()}
# (kind, weight): the mix each client draws from.
MIX = (("plain", 30), ("stream", 25), ("cancel", 10), ("slow_reader", 5), ("oversized", 5), ("malformed", 5),
       ("half_header", 2), ("bad_id", 8), ("pipelined", 10), ("reset", 5), ("stalled", 3))
WARM_UP_FRACTION = 0.2
# A well-behaved caller's request (``plain``) during the soak may be slower than the same request sent alone
# (BASELINE_REQUESTS of them, one after another, before the mix begins) by at most this much: other callers
# share the router's one event loop, but no caller's slow read, reset or stall may hold another's answer.
BASELINE_REQUESTS = 200
SLOWER_BOUND_MS = 500.0
STALL_S = 3.0  # how long a ``stalled`` caller leaves its answer unread (a 4 KiB receive buffer) before it closes


# --- the upstream (run as a subprocess: bench/soak.py --upstream NAME PORT) -----------------------

def serve_upstream(name: str, port: int) -> None:
    """An OpenAI-shaped HTTP/1.1 server naming itself in every token; SSE with 5 ms between tokens."""
    import httptools
    import uvloop

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []
            self.transport: Any = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            found = re.search(rb'"max_tokens":\s*(\d+)', body)
            tokens = int(found.group(1)) if found else 4
            if b'"stream":true' in body or b'"stream": true' in body:
                asyncio.get_running_loop().create_task(self.stream(min(tokens, 200)))
                return
            tokens = min(tokens, 20_000)  # a stalled caller's answer, about 230 KB: more than the buffers between
            text = " ".join(f"{name}-{index}" for index in range(tokens))
            answer = json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(answer), answer))

        async def stream(self, tokens: int) -> None:
            transport = self.transport
            transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for index in range(tokens):
                if transport.is_closing():
                    return  # the router cancelled: the caller left
                event = b'data: {"choices":[{"index":0,"text":" %s-%d","finish_reason":null}]}\n\n' % (
                    name.encode(), index)
                transport.write(b"%x\r\n%s\r\n" % (len(event), event))
                await asyncio.sleep(0.005)
            done = b"data: [DONE]\n\n"
            transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    uvloop.run(main())


# --- one client exchange ------------------------------------------------------------------------

class Tally:
    """Counts per kind: sent, answered as expected, lost, mixed-revision, unexpected answers."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.good: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        self.wrong: Counter[str] = Counter()
        self.mixed = 0
        self.examples: list[str] = []
        self.plain_ms: list[float] = []  # each answered plain request's latency, connect to its last byte
        self.baseline_ms: list[float] = []  # the same, sent alone before the mix

    def bad(self, counter: Counter[str], kind: str, detail: str) -> None:
        counter[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {detail}")


async def read_answer(reader: asyncio.StreamReader, *, slow: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One response (status, headers, de-chunked body); raises on a cut connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {key.lower(): value.strip() for key, _, value in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        piece = await reader.readexactly(size + 2)
        body += piece[:-2]
        if slow:
            await asyncio.sleep(0.02)
        if size == 0:
            return status, headers, body


def request_bytes(body: bytes, headers: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n%s" % (len(body), headers, body))


def check_revision(tally: Tally, kind: str, headers: dict[str, str], body: bytes) -> bool:
    """The header's revision is the one whose tokens the body carries, and only that one."""
    named = BY_FINGERPRINT.get(headers.get("x-revgate-revision", ""))
    present = {name for name in NAMES if name.encode() + b"-" in body}
    if named is None or present != {named}:
        tally.mixed += 1
        tally.bad(tally.wrong, kind, f"header {named}, tokens from {sorted(present)}")
        return False
    return True


async def connect(port: int, receive_buffer: int = 0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the router; with ``receive_buffer``, that small a receive buffer, the kernel's set before
    connecting and the reader's own as its limit (it stops reading past twice that)."""
    if not receive_buffer:
        return await asyncio.open_connection("127.0.0.1", port)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=receive_buffer)


async def exchange(kind: str, port: int, tally: Tally) -> None:
    """One request of ``kind``, with its check."""
    tally.sent[kind] += 1
    began = time.perf_counter()
    reader, writer = await connect(port, 4096 if kind == "stalled" else 0)
    try:
        if kind in ("plain", "stream", "slow_reader", "cancel"):
            stream = kind != "plain"
            tokens = {"plain": 8, "stream": 16, "slow_reader": 64, "cancel": 100}[kind]
            writer.write(request_bytes(json.dumps({"model": "m", "prompt": "p", "max_tokens": tokens,
                                                   "stream": stream}).encode()))
            if kind == "cancel":
                await reader.readuntil(b"\r\n\r\n")
                await reader.read(200)  # a token or two, then the caller walks away
                tally.good[kind] += 1
                return
            status, headers, body = await read_answer(reader, slow=kind == "slow_reader")
            complete = status == 200 and (not stream or b"[DONE]" in body)
            if not complete:
                tally.bad(tally.lost, kind, f"status {status}, {len(body)} bytes")
            elif check_revision(tally, kind, headers, body):
                tally.good[kind] += 1
                if kind == "plain":
                    tally.plain_ms.append((time.perf_counter() - began) * 1000)
        elif kind in ("reset", "stalled"):
            await walk_away(kind, reader, writer, tally)
        elif kind == "pipelined":
            one = request_bytes(json.dumps({"model": "m", "prompt": "p", "max_tokens": 4}).encode())
            writer.write(one * 3)
            answers = [await read_answer(reader) for _ in range(3)]
            if all(status == 200 and check_revision(tally, kind, headers, body) for status, headers, body in answers):
                tally.good[kind] += 1
        else:
            await hostile(kind, reader, writer, tally)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as error:
        tally.bad(tally.lost, kind, f"{type(error).__name__}: {error}")
    finally:
        writer.close()


async def walk_away(kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tally: Tally) -> None:
    """``reset``: a stream's head read, then the connection reset (RST), as a client whose own timeout fired.
    ``stalled``: a long answer asked for and left unread for STALL_S on a 4 KiB buffer, then the connection closed."""
    tokens = 200 if kind == "reset" else 20_000
    writer.write(request_bytes(json.dumps({"model": "m", "prompt": "p", "max_tokens": tokens,
                                           "stream": kind == "reset"}).encode()))
    if kind == "reset":
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        writer.transport.abort()
    else:
        await asyncio.sleep(STALL_S)
    tally.good[kind] += 1


async def baseline(port: int) -> list[float]:
    """Milliseconds of BASELINE_REQUESTS plain requests sent alone, one after another (each a new connection)."""
    tally = Tally()
    for _ in range(BASELINE_REQUESTS):
        await exchange("plain", port, tally)
    return tally.plain_ms


async def hostile(kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tally: Tally) -> None:
    """Oversized, malformed, half-header and bad-id requests: each must get its typed answer."""
    if kind == "oversized":
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: soak\r\ncontent-length: %d\r\n\r\n" % (64 << 20))
        writer.write(b"x" * 65536)
        expected = 413
    elif kind == "malformed":
        writer.write(b"GET /v1/models HTTP/1.1\r\nbad header line\r\n\r\n")
        expected = 400
    elif kind == "half_header":
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: soak\r\ncontent-len")
        expected = 408
    else:
        writer.write(request_bytes(b'{"model":"m","prompt":"p","max_tokens":2}', b"x-request-id: \xff\xfe\r\n"))
        expected = 400
    status, headers, body = await read_answer(reader)
    if status != expected or b'"where"' not in body:
        tally.bad(tally.wrong, kind, f"status {status}, expected {expected}")
        return
    if kind == "bad_id":  # the same connection serves on
        writer.write(request_bytes(b'{"model":"m","prompt":"p","max_tokens":2}'))
        status, headers, body = await read_answer(reader)
        if status != 200 or not check_revision(tally, kind, headers, body):
            tally.bad(tally.wrong, kind, f"after the 400: status {status}")
            return
    tally.good[kind] += 1


async def client(port: int, tally: Tally, stop_at: float, pace_s: float) -> None:
    kinds, weights = zip(*MIX, strict=True)
    rng = random.Random()
    while time.monotonic() < stop_at:
        await exchange(rng.choices(kinds, weights)[0], port, tally)
        await asyncio.sleep(rng.expovariate(1 / pace_s))


# --- the run ------------------------------------------------------------------------------------

def snapshot(generation: int, stable: str, ports: dict[str, int]) -> Any:
    from revgate.manifests.route import RouteSnapshot

    return RouteSnapshot.build(
        route="soak", generation=generation, created_by="soak", created_at=datetime.now(UTC).isoformat(),
        reveal_revision=True,  # the soak checks each answer's revision against its tokens
        stable={"fingerprint": FINGERPRINT[stable], "endpoints": [f"http://127.0.0.1:{ports[stable]}"]},
    )


def sample(pid: int, admin: int, started_at: float) -> dict[str, float]:
    import httpx

    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    metrics = httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=10).text
    gauges = dict(re.findall(r"^revgate_router_(tasks|open_connections) (\d+)$", metrics, re.MULTILINE))
    return {"t_s": round(time.monotonic() - started_at, 1), "rss_mib": round(rss / 1024, 2),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "tasks": int(gauges.get("tasks", -1)),
            "connections": int(gauges.get("open_connections", -1))}


async def drive(args: argparse.Namespace, *, port: int, admin: int, pid: int, store: Any, ports: dict[str, int],
                token: str) -> tuple[Tally, list[dict[str, float]], int]:
    import httpx

    tally, samples, swaps = Tally(), [], 0
    tally.baseline_ms = await baseline(port)
    started_at = time.monotonic()
    stop_at = started_at + args.minutes * 60
    clients = [asyncio.create_task(client(port, tally, stop_at, args.pace)) for _ in range(args.clients)]
    next_swap, next_sample = started_at + args.swap_every, started_at
    # A new connection per notify: a kept-alive one may meet the admin port's idle timeout mid-request.
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while time.monotonic() < stop_at:
            now = time.monotonic()
            if now >= next_sample:
                samples.append(await asyncio.to_thread(sample, pid, admin, started_at))
                print(json.dumps(samples[-1] | {"sent": sum(tally.sent.values())}), flush=True)
                next_sample += args.sample_every
            if now >= next_swap:
                swaps += 1
                store.write(snapshot(swaps + 1, NAMES[swaps % 2], ports))
                await http.post(f"http://127.0.0.1:{admin}/admin/notify", headers={"Authorization": f"Bearer {token}"})
                next_swap += args.swap_every
            await asyncio.sleep(0.2)
    await asyncio.gather(*clients)
    await asyncio.sleep(3)  # lingering refusals close, idle connections time out
    samples.append(await asyncio.to_thread(sample, pid, admin, started_at))
    return tally, samples, swaps


def growth(samples: list[dict[str, float]], key: str) -> float:
    """Relative growth of ``key`` from the end of warm-up to the end (medians of the first and last fifth)."""
    warm = [item[key] for item in samples if item["t_s"] >= samples[-1]["t_s"] * WARM_UP_FRACTION]
    if len(warm) < 4:
        return 0.0
    fifth = max(1, len(warm) // 5)
    first, last = sorted(warm[:fifth])[fifth // 2], sorted(warm[-fifth:])[fifth // 2]
    return (last - first) / first if first else 0.0


def plot(samples: list[dict[str, float]], path: Path, minutes: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    minutes_axis = [item["t_s"] / 60 for item in samples]
    for axis, key, label in zip(axes, ("rss_mib", "fds", "tasks"), ("RSS (MiB)", "open descriptors",
                                                                     "asyncio tasks"), strict=True):
        axis.plot(minutes_axis, [item[key] for item in samples], lw=1.2)
        axis.set_xlabel("minutes")
        axis.set_title(label)
        axis.set_ylim(bottom=0)
        axis.axvline(minutes * WARM_UP_FRACTION, color="grey", ls=":", lw=1)
    figure.suptitle(f"router soak, {minutes:g} min of mixed traffic with route swaps (dotted: end of warm-up)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", nargs=2, metavar=("NAME", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--clients", type=int, default=24, help="concurrent clients (default 24)")
    parser.add_argument("--pace", type=float, default=0.05, help="mean pause of a client between requests, s")
    parser.add_argument("--swap-every", type=float, default=5.0, help="seconds between route swaps")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/soak.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs/img/soak.png")
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream[0], int(args.upstream[1]))
        return
    from revgate.registry.route_store import FileRouteStore

    workdir = Path(tempfile.mkdtemp(prefix="revgate-soak-"))
    ports = {name: free_port() for name in NAMES}
    store = FileRouteStore(workdir / "routes")
    store.write(snapshot(1, NAMES[0], ports))
    token = secrets.token_hex(16)
    (workdir / "token").write_text(token)
    (workdir / "token").chmod(0o600)
    port, admin = free_port(), free_port()
    command = [sys.executable, "-m", "revgate.cli.main",
               "router", "--routes", str(workdir / "routes"), "--route", "soak",
               "--port", str(port), "--admin-port", str(admin), "--admin-token-file", str(workdir / "token"),
               "--records", str(workdir / "records.jsonl"), "--header-timeout", "2", "--idle-timeout", "5"]
    upstreams = [subprocess.Popen([sys.executable, __file__, "--upstream", name, str(ports[name])]) for name in NAMES]
    try:
        for name in NAMES:
            wait_for(ports[name])
        with started(command, port, core=None, log=workdir / "router.log") as router:
            tally, samples, swaps = asyncio.run(drive(args, port=port, admin=admin, pid=router.pid, store=store,
                                                      ports=ports, token=token))
    finally:
        for upstream in upstreams:
            upstream.terminate()
            upstream.wait(10)
    report(args, tally, samples, swaps)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


def well_behaved(tally: Tally) -> dict[str, Any]:
    """Plain requests during the soak against the same requests sent alone: how much slower, at worst."""
    alone = tally.baseline_ms
    p99_alone = percentile(alone, 0.99)
    over = [ms for ms in tally.plain_ms if ms > p99_alone + SLOWER_BOUND_MS]
    return {"plain_alone_p50_ms": round(percentile(alone, 0.5), 2), "plain_alone_p99_ms": round(p99_alone, 2),
            "plain_soak_p50_ms": round(percentile(tally.plain_ms, 0.5), 2),
            "plain_soak_p99_ms": round(percentile(tally.plain_ms, 0.99), 2),
            "plain_soak_max_ms": round(max(tally.plain_ms, default=0.0), 2),
            "slower_bound_ms": SLOWER_BOUND_MS,
            "plain_over_bound": len(over), "plain_answered": len(tally.plain_ms)}


def report(args: argparse.Namespace, tally: Tally, samples: list[dict[str, float]], swaps: int) -> None:
    figures = {
        "rss_growth_after_warm_up": round(growth(samples, "rss_mib"), 4),
        "rss_mib_first": samples[0]["rss_mib"], "rss_mib_last": samples[-1]["rss_mib"],
        "rss_mib_max": max(item["rss_mib"] for item in samples),
        "fds_range": [min(item["fds"] for item in samples), max(item["fds"] for item in samples)],
        "tasks_range": [min(item["tasks"] for item in samples), max(item["tasks"] for item in samples)],
        "fds_last": samples[-1]["fds"], "tasks_last": samples[-1]["tasks"],
        "requests": sum(tally.sent.values()), "lost": sum(tally.lost.values()),
        "mixed_revision_answers": tally.mixed, "unexpected_answers": sum(tally.wrong.values()) - tally.mixed,
        "cancelled_by_callers": tally.sent["cancel"], "route_swaps": swaps,
        **well_behaved(tally),
    }
    result = {
        "command": "python bench/soak.py " + " ".join(sys.argv[1:]), "date": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "minutes": args.minutes, "clients": args.clients, "swap_every_s": args.swap_every,
        "figures": figures, "by_kind": {kind: {"sent": tally.sent[kind], "good": tally.good[kind],
                                               "lost": tally.lost[kind], "wrong": tally.wrong[kind]}
                                        for kind, _ in MIX},
        "examples": tally.examples, "samples": samples,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(samples, args.figure, args.minutes)
    print(f"\n{'kind':<12} {'sent':>8} {'good':>8} {'lost':>6} {'wrong':>6}")
    for kind, _ in MIX:
        print(f"{kind:<12} {tally.sent[kind]:>8} {tally.good[kind]:>8} {tally.lost[kind]:>6} {tally.wrong[kind]:>6}")
    for key, value in figures.items():
        print(f"{key:<28} {value}")
    print(f"wrote {args.out} and {args.figure}")


if __name__ == "__main__":
    main()
