"""Router benchmark: revgate's router against the upstream directly, nginx, vllm-router and LiteLLM, in one run.

One command: ``.venv/bin/python bench/router.py``. Each proxy runs pinned to core 0; the fast upstream
and the load generators share core 1. For each system:
- closed loop (wrk, 32 connections): maximum requests/s and CPU per request from /proc/<pid>/stat;
- open loop at 500 requests/s (latency timed from the intended send time): added p50 and p99
  against the upstream alone;
- streaming at 100 requests/s: time to the first SSE chunk, added p50;
- 220 KB prompts from 20, 100 and 150 callers at once (each sending 4, one after another, streamed): time
  to the first chunk, added median against the upstream alone.
revgate runs with every feature on: request records, metrics, a 10% canary split, snapshot pinning.
Swap propagation: commit a generation, notify, until a new request is served on it (p99 over 50 swaps).
The systems are measured in rounds (three by default), one after another within each round, so a
slow patch of the machine falls on every system alike; each figure is the median over the rounds,
and each ratio the median of the rounds' ratios. vllm-router is installed into a venv of its own
(.cache/bench/vllm-router-venv) on first use, and LiteLLM's proxy likewise (.cache/bench/litellm-venv, one
worker, no database). Writes bench/results/router.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from revgate.registry.route_store import FileRouteStore
from revgate.serving.worker.engine import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROXY_CORE, LOAD_CORE = "0", "1"
COMPLETION = json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "text": " four five six seven", "finish_reason": "length", "logprobs": None}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8},
}).encode()
REQUEST = json.dumps({"model": "bench", "prompt": "one two three", "max_tokens": 4}).encode()
STREAM_REQUEST = json.dumps({"model": "bench", "prompt": "one two three", "max_tokens": 4, "stream": True}).encode()
# Long prompts, many callers at once: the Gateway API Inference Extension's endpoint picker was measured adding
# 154 ms to the first token at 20 concurrent 220 KB prompts and 1.1 s at 150, with an instant backend.
LARGE_PROMPT_BYTES = 220 * 1024
LARGE_REQUEST = json.dumps({"model": "bench", "prompt": "word " * (LARGE_PROMPT_BYTES // 5), "max_tokens": 4,
                            "stream": True}).encode()
CONCURRENCY = (20, 100, 150)
OPEN_WARM_UP = 16  # requests that open the open loop's keep-alive connections before the timed ones
LARGE_PER_CALLER = 4  # requests each caller sends, one after another
# Whole OpenAI stream chunks (id, object, model): LiteLLM's proxy parses each one.
SSE_EVENTS = [b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
              b'"choices":[{"index":0,"text":" t%d","finish_reason":null,"logprobs":null}]}\n\n' % index
              for index in range(4)]


# --- the fast upstream (run as a subprocess: bench/router.py --upstream PORT PORT) -------------

def serve_upstream(ports: list[int]) -> None:
    """A minimal OpenAI-shaped HTTP/1.1 server on uvloop: fixed answers, keep-alive, SSE when asked."""
    import httptools
    import uvloop

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            if b'"stream": true' in body or b'"stream":true' in body:
                asyncio.get_running_loop().create_task(self.stream())
                return
            answer = COMPLETION if body else b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(answer), answer))

        async def stream(self) -> None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for event in [*SSE_EVENTS, b"data: [DONE]\n\n"]:
                self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
                await asyncio.sleep(0.002)
            self.transport.write(b"0\r\n\r\n")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for port in ports:
            await loop.create_server(Upstream, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    uvloop.run(main())


# --- helpers -------------------------------------------------------------------------------------

def wait_for(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def _tree(pid: int) -> Iterator[tuple[Path, list[str]]]:
    """``pid`` and its children (nginx's worker, for one): each one's /proc folder and its stat fields after the
    command name."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            yield entry, fields


def process_tree_cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of ``pid``'s tree, every thread (scheduler statistics: exact, where the tick counts
    of /proc/<pid>/stat are 10 ms coarse, too coarse for a few thousand requests)."""
    total = 0
    for entry, _ in _tree(pid):
        try:
            total += sum(int((task / "schedstat").read_text().split()[0]) for task in (entry / "task").iterdir())
        except (OSError, ValueError, IndexError):
            continue
    return total


def process_tree_cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid``'s tree (ticks: enough for a closed loop's tens of thousands)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = [fields for _, fields in _tree(pid)]
    return sum(int(f[11]) for f in stats) / ticks, sum(int(f[12]) for f in stats) / ticks


@contextmanager
def started(command: list[str], port: int, *, core: str | None, env: dict[str, str] | None = None,
            log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    prefix = ["taskset", "-c", core] if core is not None else []
    out = log.open("wb") if log else subprocess.DEVNULL
    process = subprocess.Popen(prefix + command, stdout=out, stderr=subprocess.STDOUT, env=env or dict(os.environ))
    try:
        wait_for(port)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# --- load generators -----------------------------------------------------------------------------

def wrk_max_rps(port: int, pid: int, seconds: int, workdir: Path) -> dict[str, float]:
    """Closed loop with wrk: requests/s and CPU microseconds per request of ``pid``'s process tree."""
    script = workdir / "post.lua"
    script.write_text('wrk.method = "POST"\nwrk.body = ' + json.dumps(REQUEST.decode())
                      + '\nwrk.headers["Content-Type"] = "application/json"\n')
    url = f"http://127.0.0.1:{port}/v1/completions"
    subprocess.run(["taskset", "-c", LOAD_CORE, "wrk", "-t1", "-c16", "-d1s", "-s", str(script), url],
                   capture_output=True, check=True)  # warm-up: connections, pools, caches
    user, system = process_tree_cpu_s(pid)
    result = subprocess.run(["taskset", "-c", LOAD_CORE, "wrk", "-t1", "-c32", f"-d{seconds}s", "-s", str(script),
                             url], capture_output=True, text=True, check=True)
    user_after, system_after = process_tree_cpu_s(pid)
    requests = max(1, int(next(line for line in result.stdout.splitlines() if "requests in" in line).split()[0]))
    errors = sum(int(word) for line in result.stdout.splitlines() if "Non-2xx" in line for word in line.split()[-1:])
    # User and system apart: the system part is the four socket calls and, for the proxy that is the bottleneck,
    # waking its idle peers on every write (see docs/benchmarks.md).
    user_us, system_us = (user_after - user) / requests * 1e6, (system_after - system) / requests * 1e6
    return {"max_rps": requests / seconds, "cpu_us_per_req": user_us + system_us, "cpu_user_us_per_req": user_us,
            "cpu_system_us_per_req": system_us, "errors": errors}


async def _head(port: int, body: bytes, pool: list[Any]) -> tuple[Any, Any, bytes]:
    """Send the request on a pooled keep-alive connection and read the answer's head.

    A server may close an idle keep-alive connection at any time (nginx after keepalive_requests):
    as any HTTP client does, the request goes again once on a new connection when the pooled one
    was closed before an answer began.
    """
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    if pool:
        reader, writer = pool.pop()
        writer.write(request)
        try:
            return reader, writer, await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    return reader, writer, await reader.readuntil(b"\r\n\r\n")


async def _one(port: int, body: bytes, intended: float, stream: bool, pool: list[Any]) -> tuple[float, float]:
    """One request on a pooled keep-alive connection; (seconds to first body byte, to the end)."""
    reader, writer, head = await _head(port, body, pool)
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.decode(errors="replace"))
    lowered = head.lower()
    if b"content-length:" in lowered:
        length = int(lowered.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        first = time.perf_counter()
    else:
        size_line = await reader.readuntil(b"\r\n")
        first = time.perf_counter()
        await reader.readexactly(int(size_line.strip(), 16) + 2)
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    end = time.perf_counter()
    pool.append((reader, writer))
    return first - intended, end - intended


async def _open_loop(port: int, rate: int, seconds: float, stream: bool) -> list[tuple[float, float]]:
    body = STREAM_REQUEST if stream else REQUEST
    pool: list[Any] = []
    # Warm-up: open a pool of keep-alive connections first, so connects are not timed.
    await asyncio.gather(*(_one(port, body, time.perf_counter(), stream, pool) for _ in range(OPEN_WARM_UP)))
    start = time.perf_counter() + 0.05
    tasks = []
    for index in range(int(rate * seconds)):
        intended = start + index / rate
        delay = intended - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(port, body, intended, stream, pool)))
    return await asyncio.gather(*tasks)


def open_loop(port: int, rate: int, seconds: float, stream: bool) -> dict[str, float]:
    """Latency at a fixed arrival rate, measured from each request's intended send time (milliseconds)."""
    import uvloop

    samples = uvloop.run(_open_loop(port, rate, seconds, stream))
    firsts = sorted(first * 1000 for first, _ in samples)
    ends = sorted(end * 1000 for _, end in samples)
    return {"p50_ms": statistics.median(ends), "p99_ms": ends[int(len(ends) * 0.99) - 1],
            "first_chunk_p50_ms": statistics.median(firsts)}


async def _large_prompts(port: int, concurrency: int) -> list[float]:
    firsts: list[float] = []

    async def caller() -> None:
        pool: list[Any] = []
        for _ in range(LARGE_PER_CALLER):
            first, _ = await _one(port, LARGE_REQUEST, time.perf_counter(), True, pool)
            firsts.append(first)
        for _, writer in pool:
            writer.close()

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return firsts


def large_prompts(port: int, concurrency: int) -> float:
    """Median milliseconds to the first streamed chunk of a 220 KB prompt, ``concurrency`` callers at once,
    each sending LARGE_PER_CALLER one after another (closed loop: what the proxy adds is queued behind)."""
    import uvloop

    return statistics.median(uvloop.run(_large_prompts(port, concurrency))) * 1000


def measure_load(name: str, port: int, pid: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    """Open loop first (latency), then streaming, then long prompts, then closed loop (saturation)."""
    os.sched_setaffinity(0, {int(LOAD_CORE)})
    before = process_tree_cpu_ns(pid)
    latency = open_loop(port, args.rate, args.open_seconds, stream=False)
    # CPU per request at a rate every system keeps up with, as a router serving LLM traffic runs (hundreds of
    # requests a second, not tens of thousands): at saturation a proxy that is the bottleneck also pays for
    # waking its idle peers on every write, and the one that is not, batches.
    latency["cpu_us_per_req_at_rate"] = (process_tree_cpu_ns(pid) - before) / 1000 / (
        int(args.rate * args.open_seconds) + OPEN_WARM_UP)
    streaming = open_loop(port, args.stream_rate, args.open_seconds, stream=True)
    large = {f"large_prompt_ttft_ms_c{c}": large_prompts(port, c) for c in CONCURRENCY}
    saturation = wrk_max_rps(port, pid, args.closed_seconds, workdir)
    print(f"  {name}: {saturation['max_rps']:.0f} req/s, {saturation['cpu_us_per_req']:.0f} us/req "
          f"({latency['cpu_us_per_req_at_rate']:.0f} at {args.rate}/s), "
          f"p50 {latency['p50_ms']:.2f} ms, p99 {latency['p99_ms']:.2f} ms, 220 KB prompts at "
          + ", ".join(f"c{c} {large[f'large_prompt_ttft_ms_c{c}']:.1f} ms" for c in CONCURRENCY), flush=True)
    return {**saturation, **latency, **large, "stream_first_chunk_p50_ms": streaming["first_chunk_p50_ms"]}


# --- systems -------------------------------------------------------------------------------------

def nginx_config(workdir: Path, port: int, upstream: int) -> Path:
    config = workdir / "nginx.conf"
    config.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000000;  # the default (1000) closes a client's connection mid-benchmark
  # Bodies in memory, streamed on: a 220 KB prompt would otherwise go to a temporary file, which the
  # worker (another user when nginx starts as root) cannot create in the bench's private folder.
  client_body_buffer_size 1m; client_max_body_size 16m; proxy_request_buffering off;
  client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
  upstream backend {{ server 127.0.0.1:{upstream}; keepalive 64; keepalive_requests 100000000; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
    return config


def route_snapshot(generation: int, stable: int, candidate: int) -> Any:
    from revgate.manifests.route import RouteSnapshot

    now = datetime.now(UTC)
    return RouteSnapshot.build(
        route="bench", generation=generation, created_by="bench", created_at=now.isoformat(),
        reveal_revision=True,  # the swap check reads the generation from the answers
        stable={"fingerprint": "sha256:" + "a" * 64, "endpoints": [f"http://127.0.0.1:{stable}"]},
        candidate={"fingerprint": "sha256:" + "b" * 64, "endpoints": [f"http://127.0.0.1:{candidate}"],
                   "weight_ppm": 100_000, "lease_expires_at": (now + timedelta(hours=1)).isoformat()},
    )


def swap_propagation(store: Any, admin_port: int, port: int, token: str, swaps: int) -> list[float]:
    """Milliseconds from a committed generation until a new request is served on it, with notify."""
    import http.client

    admin = http.client.HTTPConnection("127.0.0.1", admin_port)
    public = http.client.HTTPConnection("127.0.0.1", port)
    current = store.read("bench")
    stable, candidate = (int(url.rsplit(":", 1)[1]) for url in (current.stable.endpoints[0],
                                                                  current.candidate.endpoints[0]))
    samples = []
    for _ in range(swaps):
        generation = store.read("bench").generation + 1
        store.write(route_snapshot(generation, stable, candidate))
        committed = time.perf_counter()
        admin.request("POST", "/admin/notify", headers={"Authorization": f"Bearer {token}"})
        admin.getresponse().read()
        while True:
            public.request("POST", "/v1/completions", body=REQUEST, headers={"Content-Type": "application/json"})
            response = public.getresponse()
            response.read()
            if response.getheader("x-revgate-generation") == str(generation):
                break
        samples.append((time.perf_counter() - committed) * 1000)
    return samples


def peer_binary(command: str, requirement: str) -> Path:
    """A peer's ``command`` from a venv of its own under .cache/bench, ``requirement`` installed there on first use
    (peers are measured beside revgate, never its dependencies)."""
    venv = ROOT / ".cache" / "bench" / f"{command}-venv"
    binary = venv / "bin" / command
    if not binary.exists():
        print(f"installing {requirement} into {venv.relative_to(ROOT)} (first run only)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", requirement], check=True)
    return binary


def vllm_router_binary() -> Path:
    return peer_binary("vllm-router", "vllm-router")


def litellm_binary() -> Path:
    """LiteLLM's proxy: the gateway most teams try first."""
    return peer_binary("litellm", "litellm[proxy]")


def litellm_config(workdir: Path, upstream: int) -> Path:
    """One model, ``bench``, served by the upstream as an OpenAI-compatible endpoint; no database, no key, no
    logging: LiteLLM at its lightest."""
    config = workdir / "litellm.yaml"
    config.write_text(f"""model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: none
litellm_settings:
  drop_params: true
  telemetry: false
general_settings:
  dangerously_permit_weak_or_unset_master_key: true  # on loopback, for the bench: no key, as for the others
""")
    return config


def revgate_router(workdir: Path, records: list[str]) -> tuple[list[str], int, int]:
    """``revgate router`` on the bench route with every feature on, its records as given; command and ports."""
    port, admin = free_port(), free_port()
    return ([sys.executable, "-m", "revgate.cli.main", "router", "--routes", str(workdir / "routes"), "--route",
             "bench", "--port", str(port), "--admin-port", str(admin), "--admin-token-file", str(workdir / "token"),
             *records], port, admin)


def one_round(args: argparse.Namespace, workdir: Path, upstream: int,
              first: bool) -> tuple[dict[str, Any], list[float]]:
    """Every system once, one after another: its figures (and, in the first round, swap propagation)."""
    results: dict[str, Any] = {"direct": measure_load("direct", upstream, _pid_on(upstream), args, workdir)}
    swaps: list[float] = []
    (workdir / "records.jsonl").unlink(missing_ok=True)
    command, port, admin = revgate_router(workdir, ["--records", str(workdir / "records.jsonl")])
    with started(command, port, core=PROXY_CORE, log=workdir / "router.log") as router:
        results["revgate"] = measure_load("revgate", port, router.pid, args, workdir)
        if first:
            swaps = swap_propagation(FileRouteStore(workdir / "routes"), admin, port, args.token, args.swaps)
    results["revgate"]["records_written"] = sum(1 for _ in (workdir / "records.jsonl").open())

    # The same router with the record sink on (a local folder, one object per second), as production runs it.
    sink = workdir / "sink"
    shutil.rmtree(sink, ignore_errors=True)
    command, port, _ = revgate_router(workdir, ["--records-sink", str(sink), "--router-id", "bench"])
    with started(command, port, core=PROXY_CORE, log=workdir / "router-sink.log") as router:
        results["revgate_sink"] = measure_load("revgate_sink", port, router.pid, args, workdir)
    results["revgate_sink"]["records_written"] = sum(1 for path in sink.rglob("*.jsonl") for _ in path.open())

    port = free_port()
    nginx = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(workdir), "-c",
             str(nginx_config(workdir, port, upstream))]
    with started(nginx, port, core=PROXY_CORE) as process:
        results["nginx"] = measure_load("nginx", port, process.pid, args, workdir)

    port = free_port()
    vllm_router = [str(vllm_router_binary()), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                   f"http://127.0.0.1:{upstream}", "--policy", "round_robin", "--log-level", "warning",
                   "--disable-circuit-breaker"]
    with started(vllm_router, port, core=PROXY_CORE, log=workdir / "vllm-router.log") as process:
        time.sleep(2)  # it health-checks the worker before routing
        results["vllm_router"] = measure_load("vllm_router", port, process.pid, args, workdir)

    port = free_port()
    litellm = [str(litellm_binary()), "--config", str(litellm_config(workdir, upstream)), "--host", "127.0.0.1",
               "--port", str(port), "--num_workers", "1"]
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}
    with started(litellm, port, core=PROXY_CORE, env=env, log=workdir / "litellm.log") as process:
        results["litellm"] = measure_load("litellm", port, process.pid, args, workdir)
    return results, swaps


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The rounds, then the figures: medians over the rounds, and every round's own."""
    workdir = Path(tempfile.mkdtemp(prefix="revgate-bench-router-"))
    upstream, candidate = free_port(), free_port()
    vllm_router_binary(), litellm_binary()  # installed before any timing starts
    rounds, swaps = [], []
    with started([sys.executable, __file__, "--upstream", str(upstream), str(candidate)], upstream, core=LOAD_CORE):
        wait_for(candidate)
        FileRouteStore(workdir / "routes").write(route_snapshot(1, upstream, candidate))
        args.token = secrets.token_hex(16)
        (workdir / "token").write_text(args.token)
        (workdir / "token").chmod(0o600)  # the router refuses a token file others can read
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds}", flush=True)
            results, measured = one_round(args, workdir, upstream, first=number == 0)
            rounds.append(summarise(results))
            swaps += measured
    shutil.rmtree(workdir, ignore_errors=True)
    return combine(rounds, swaps)


def _pid_on(port: int) -> int:
    """The pid listening on ``port`` (the upstream), for its CPU figures."""
    output = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(output.split("pid=", 1)[1].split(",", 1)[0])


RATIOS = {  # name: (system, over system, figure)
    "revgate_cpu_per_req_vs_nginx": ("revgate", "nginx", "cpu_us_per_req"),
    "revgate_cpu_per_req_vs_vllm_router": ("revgate", "vllm_router", "cpu_us_per_req"),
    "revgate_max_rps_vs_vllm_router": ("revgate", "vllm_router", "max_rps"),
    "revgate_sink_cpu_per_req_vs_revgate": ("revgate_sink", "revgate", "cpu_us_per_req"),
    "revgate_sink_cpu_per_req_vs_nginx": ("revgate_sink", "nginx", "cpu_us_per_req"),
    "revgate_sink_cpu_per_req_vs_vllm_router": ("revgate_sink", "vllm_router", "cpu_us_per_req"),
    "revgate_cpu_per_req_at_500rps_vs_nginx": ("revgate", "nginx", "cpu_us_per_req_at_500rps"),
    "revgate_cpu_per_req_at_500rps_vs_vllm_router": ("revgate", "vllm_router", "cpu_us_per_req_at_500rps"),
    "revgate_sink_cpu_per_req_at_500rps_vs_nginx": ("revgate_sink", "nginx", "cpu_us_per_req_at_500rps"),
    "revgate_sink_cpu_per_req_at_500rps_vs_vllm_router": ("revgate_sink", "vllm_router",
                                                          "cpu_us_per_req_at_500rps"),
    "revgate_cpu_per_req_vs_litellm": ("revgate", "litellm", "cpu_us_per_req"),
    "revgate_sink_cpu_per_req_vs_litellm": ("revgate_sink", "litellm", "cpu_us_per_req"),
    "revgate_max_rps_vs_litellm": ("revgate", "litellm", "max_rps"),
}


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """One round's figures per system, the added latencies against the upstream alone, and its ratios."""
    direct = results["direct"]
    figures: dict[str, Any] = {}
    for name, measured in results.items():
        figures[name] = {
            "cpu_us_per_req": round(measured["cpu_us_per_req"], 1),
            "cpu_user_us_per_req": round(measured["cpu_user_us_per_req"], 1),
            "cpu_system_us_per_req": round(measured["cpu_system_us_per_req"], 1),
            "cpu_us_per_req_at_500rps": round(measured["cpu_us_per_req_at_rate"], 1),
            "max_rps": round(measured["max_rps"]),
            "added_p50_ms_at_500rps": round(measured["p50_ms"] - direct["p50_ms"], 3),
            "added_p99_ms_at_500rps": round(measured["p99_ms"] - direct["p99_ms"], 3),
            "stream_first_chunk_added_p50_ms": round(measured["stream_first_chunk_p50_ms"]
                                                     - direct["stream_first_chunk_p50_ms"], 3),
            "p50_ms_at_500rps": round(measured["p50_ms"], 3),
            "p99_ms_at_500rps": round(measured["p99_ms"], 3),
            **{f"large_prompt_added_ttft_ms_c{c}": round(measured[f"large_prompt_ttft_ms_c{c}"]
                                                         - direct[f"large_prompt_ttft_ms_c{c}"], 1)
               for c in CONCURRENCY},
        }
    for name in ("revgate", "revgate_sink"):
        figures[name]["records_written"] = results[name]["records_written"]
    figures["ratios"] = {name: round(figures[a][figure] / figures[b][figure], 2)
                         for name, (a, b, figure) in RATIOS.items()}
    return figures


def combine(rounds: list[dict[str, Any]], swaps: list[float]) -> dict[str, Any]:
    """Medians over the rounds (each ratio the median of the rounds' own ratios), and the rounds themselves."""
    figures: dict[str, Any] = {
        name: {figure: statistics.median(r[name][figure] for r in rounds) for figure in rounds[0][name]}
        for name in rounds[0] if name != "ratios"
    }
    figures["ratios"] = {name: statistics.median(r["ratios"][name] for r in rounds) for name in RATIOS}
    figures["swap_propagation_p99_ms"] = round(sorted(swaps)[max(0, int(len(swaps) * 0.99) - 1)], 2)
    figures["swap_propagation_p50_ms"] = round(statistics.median(swaps), 2)
    figures["rounds"] = rounds
    return figures


def print_table(figures: dict[str, Any]) -> None:
    print(f"\n{'system':<12} {'req/s':>8} {'CPU us/req':>11} {'at 500/s':>9} {'+p50 ms':>9} {'+p99 ms':>9} "
          f"{'+1st chunk ms':>14}")
    for name in ("direct", "revgate", "revgate_sink", "nginx", "vllm_router", "litellm"):
        row = figures[name]
        print(f"{name:<12} {row['max_rps']:>8} {row['cpu_us_per_req']:>11} {row['cpu_us_per_req_at_500rps']:>9} "
              f"{row['added_p50_ms_at_500rps']:>9} "
              f"{row['added_p99_ms_at_500rps']:>9} {row['stream_first_chunk_added_p50_ms']:>14}")
    print("\n220 KB prompts, added time to the first streamed chunk against direct (ms), by concurrent callers")
    print(f"{'system':<12} " + " ".join(f"{'c' + str(c):>8}" for c in CONCURRENCY))
    for name in ("revgate", "revgate_sink", "nginx", "vllm_router", "litellm"):
        print(f"{name:<12} " + " ".join(f"{figures[name][f'large_prompt_added_ttft_ms_c{c}']:>8}" for c in CONCURRENCY))
    print(f"swap propagation p99 {figures['swap_propagation_p99_ms']} ms (p50 {figures['swap_propagation_p50_ms']})")
    print(f"medians over {len(figures['rounds'])} rounds; ratios per round:")
    for number, measured in enumerate(figures["rounds"], 1):
        print(f"  round {number}: {json.dumps(measured['ratios'])}")
    print(f"median: {json.dumps(figures['ratios'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", nargs="+", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--stream-rate", type=int, default=100)
    parser.add_argument("--open-seconds", type=float, default=4.0)
    parser.add_argument("--closed-seconds", type=int, default=5)
    parser.add_argument("--swaps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every system, one after another")
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return
    figures = run(args)
    print_table(figures)
    command = "python bench/router.py" + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
    figures.update(command=command, date=datetime.now(UTC).isoformat(timespec="seconds"),
                   machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    output = ROOT / "bench" / "results" / "router.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {output.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
