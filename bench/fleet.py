"""Fleet benchmark: the route, the window and the capacity rule across hosts of their own.

One command: ``.venv/bin/python bench/fleet.py [--repeats 10] [--rate 10]`` (as root: each host is a
network namespace, tests/integration/hosts.py). Real parts: moto's S3 server on ``store`` (the route
store and the record sink), a ``revgate router`` on ``edge-1`` and one on ``edge-2`` (each signing its
records), the controller's code on ``control``; the upstream on ``gpu-1`` is a small OpenAI-shaped
responder (what is measured is the route and the records, not an engine), told to fail on cue.

- ``promotion_commit_to_all_routers_s``: control writes a new generation to the S3 route store and
  notifies both routers (as the flow's commit does); until both serve it. Median and worst of
  ``--repeats``. Goal: at most 0.1 s.
- ``window_verdict_lag_s``: the upstream starts failing; from the first failing answer a caller got
  to the rollback window's verdict ``fail`` (the flow's window code: every router's signed records
  from the S3 sink, polled each second, its confidence sequence). Goal: at most 10 s.
- ``capacity_demand_error``: open-loop traffic at ``--rate`` through both routers; the demand the
  capacity rule reads from the sink (``RecordSource.demand``) against the rate the users sent over
  the same window, as ``seen / sent - 1``. Goal: within 10%.

Writes bench/results/fleet.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

import boto3  # noqa: E402
import httpx  # noqa: E402

from revgate.flows import processes  # noqa: E402
from revgate.flows.evidence import DEMAND_LAG_S, DEMAND_WINDOW_S, RecordSource  # noqa: E402
from revgate.manifests.rollout import PostPromotionCheck  # noqa: E402
from revgate.manifests.route import RevisionTarget, RouteSnapshot  # noqa: E402
from revgate.promotion.window import WindowTally, tally, window_verdict  # noqa: E402
from tests.integration.host_faults import answers  # noqa: E402
from tests.integration.hosts import HOST_NAMES, Host, Network, run_prefix, sweep_stale, why_unavailable  # noqa: E402
from tests.integration.rollout_estate import OpenLoop, wait_until  # noqa: E402
from tests.integration.test_hosts import (  # noqa: E402
    ADMIN_TOKEN,
    ROUTE,
    S3_CREDENTIALS,
    Edge,
    Plane,
    edge_router,
    s3_server,
)

RESULTS = ROOT / "bench" / "results" / "fleet.json"
FINGERPRINT = "sha256:" + "5" * 64  # the upstream's revision, as the route names it
# The upstream: answers completions at once; once FAIL exists in its folder, answers 500.
UPSTREAM = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
FAIL = Path(sys.argv[3])
class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        failing = FAIL.exists()
        body = json.dumps({"error": "told to fail"} if failing else {"id": "c", "object": "text_completion",
            "choices": [{"index": 0, "text": "3", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()
        self.send_response(500 if failing else 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST
    def log_message(self, *args):
        pass
ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Answer).serve_forever()
"""


@contextmanager
def upstream(gpu: Host) -> Any:
    """The responder on gpu-1's address; yields its URL and the file that makes it fail."""
    port, fail = gpu.free_port(), gpu.folder / "FAIL"
    process = gpu.popen([sys.executable, "-c", UPSTREAM, gpu.address, str(port), str(fail)])
    try:
        wait_until(lambda: answers(gpu.url(port)), 30, "the upstream answering")
        yield gpu.url(port), fail
    finally:
        process.terminate()
        process.wait(10)


def snapshot(generation: int, endpoint: str) -> RouteSnapshot:
    return RouteSnapshot(route=ROUTE, generation=generation, stable=RevisionTarget(
        fingerprint=FINGERPRINT, endpoints=(endpoint,)), created_by="bench", created_at=datetime.now(UTC),
        reveal_revision=True)


def serving(edge: Edge) -> int:
    return int(edge.health()["generation"])


def commit_to_all_routers(plane: Plane, edges: list[Edge], endpoint: str, repeats: int) -> list[float]:
    """Per repeat: a new generation written and announced, until every router serves it."""
    store, seconds = plane.route_store, []
    with httpx.Client(timeout=10) as client:
        for _ in range(repeats):
            current = store.read(ROUTE)
            generation = (current.generation if current else 0) + 1
            started = time.perf_counter()
            store.write(snapshot(generation, endpoint))
            for edge in edges:  # the flow's notify: every router told at once, then each one's health read
                client.post(f"{edge.admin}/admin/notify", headers={"Authorization": f"Bearer {edge.token}"})
            deadline = time.monotonic() + 30
            while any(serving(edge) < generation for edge in edges):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"generation {generation} not served by every router within 30 s")
                time.sleep(0.002)
            seconds.append(time.perf_counter() - started)
    return seconds


def demand_error(plane: Plane, edges: list[Edge], rate: float) -> dict[str, float]:
    """Users at ``rate`` (half through each router) for a whole demand window; what the rule reads against it."""
    signers = {edge.name: edge.signer for edge in edges}
    loops = [OpenLoop(edge.public, rate=rate / len(edges)) for edge in edges]
    with ExitStack() as stack:
        for loop in loops:
            stack.enter_context(loop.running())
        time.sleep(DEMAND_WINDOW_S + DEMAND_LAG_S + 3)  # a benchmark's fixed duration: the window must fill
        now = time.time()
        seen = RecordSource(plane.records, ROUTE, signers).demand(now)
    until, since = now - DEMAND_LAG_S, now - DEMAND_LAG_S - DEMAND_WINDOW_S
    sent = sum(since <= item.sent_s < until for loop in loops for item in loop.sent) / DEMAND_WINDOW_S
    return {"demand_seen_rps": round(seen.rps, 3), "demand_sent_rps": round(sent, 3),
            "capacity_demand_error": round(seen.rps / sent - 1, 4)}


def window_lag(plane: Plane, edges: list[Edge], fail: Path, rate: float) -> dict[str, float]:
    """The upstream fails from now on; the first failing answer to the window's ``fail`` from the sink."""
    check = PostPromotionCheck()
    signers = {edge.name: edge.signer for edge in edges}
    loops = [OpenLoop(edge.public, rate=rate / len(edges)) for edge in edges]
    with ExitStack() as stack:
        for loop in loops:
            stack.enter_context(loop.running())
        wait_until(lambda: all(sum(item.status == 200 for item in loop.sent) >= 5 for loop in loops), 60,
                   "healthy answers through both routers before the failure")
        flipped = time.time()
        records = RecordSource(plane.records, ROUTE, signers).tail(flipped)
        fail.write_text("fail", encoding="utf-8")
        seen, verdict = WindowTally(), None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(1.0)  # the window's poll period (flows/promote.py: watch_window)
            seen = tally(seen, records.poll(), check, promoted=FINGERPRINT, old_stable="", promoted_at_s=flipped)
            verdict = window_verdict(check, seen)
            if verdict.outcome == "fail":
                break
        decided = time.time()
    fail.unlink()
    failing = [item.sent_s for loop in loops for item in loop.sent if item.status == 500]
    assert verdict is not None and verdict.outcome == "fail", verdict
    first = min(failing)
    return {"window_verdict_lag_s": round(decided - first, 3), "failures_counted": seen.promoted.failures}


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rate", type=float, default=10.0, help="users' requests per second, all routers")
    args = parser.parse_args()
    missing = why_unavailable()
    if missing:
        print(f"bench/fleet.py needs hosts of their own (network namespaces): {missing}; nothing measured")
        return 0
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    sweep_stale(run_prefix())
    root = Path(tempfile.mkdtemp(prefix="revgate-fleet-"))
    network = Network.create(run_prefix(), HOST_NAMES, root)
    try:
        control, store, gpu = network["control"], network["store"], network["gpu-1"]
        with ExitStack() as stack, control.network():
            s3 = stack.enter_context(s3_server(store))
            client = boto3.client("s3", endpoint_url=s3)
            for bucket in ("routes", "records"):
                client.create_bucket(Bucket=bucket)
            url, fail = stack.enter_context(upstream(gpu))
            plane = Plane(s3, f"s3://routes/fleet?endpoint_url={s3}", f"s3://records/fleet?endpoint_url={s3}",
                          RevisionTarget(fingerprint=FINGERPRINT, endpoints=(url,)))
            plane.route_store.write(snapshot(1, url))
            processes.token_file(control.folder / ADMIN_TOKEN)  # edge_router provisions each edge's copy
            edges = [stack.enter_context(edge_router(network[name], plane.routes, plane.records, control=control))
                     for name in ("edge-1", "edge-2")]
            wait_until(lambda: all(serving(edge) == 1 for edge in edges), 60, "both routers serving")
            commits = commit_to_all_routers(plane, edges, url, args.repeats)
            demand = demand_error(plane, edges, args.rate)
            window = window_lag(plane, edges, fail, args.rate)
    finally:
        network.close()
    figures = {
        "promotion_commit_to_all_routers_s": {"median": round(statistics.median(commits), 4),
                                              "max": round(max(commits), 4), "repeats": len(commits)},
        "window_verdict_lag_s": window["window_verdict_lag_s"],
        "capacity_demand_error": demand["capacity_demand_error"],
        "details": {**demand, "window_failures_counted": window["failures_counted"], "rate_rps": args.rate,
                    "routers": 2, "hosts": "network namespaces: control, store (moto S3), edge-1, edge-2, gpu-1"},
        "goals": {"promotion_commit_to_all_routers_s": 0.1, "window_verdict_lag_s": 10.0,
                  "capacity_demand_error": 0.10},
    }
    print("| figure | value | goal |\n|---|---|---|")
    print(f"| promotion_commit_to_all_routers_s (median / max of {len(commits)}) | "
          f"{figures['promotion_commit_to_all_routers_s']['median']} / "
          f"{figures['promotion_commit_to_all_routers_s']['max']} | <= 0.1 |")
    print(f"| window_verdict_lag_s | {figures['window_verdict_lag_s']} | <= 10 |")
    print(f"| capacity_demand_error | {figures['capacity_demand_error']:+.1%} "
          f"(seen {demand['demand_seen_rps']} of {demand['demand_sent_rps']} req/s) | within 10% |")
    RESULTS.write_text(json.dumps({**figures, "command": "python bench/fleet.py " + " ".join(sys.argv[1:]),
                                   "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine()},
                                  indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
