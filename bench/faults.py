"""Faults benchmark: a dead replica, a partitioned controller and a healed router, across hosts of their own.

One command: ``.venv/bin/python bench/faults.py [--repeats 3] [--rate 40] [--lease 6] [--renew 1]`` (as root:
each host is a network namespace, tests/integration/hosts.py). The same parts as bench/fleet.py: moto's S3 server on
``store`` (route store and record sink), a ``revgate router`` on ``edge-1`` and one on ``edge-2`` (each
signing its records), the controller's code on ``control``; the upstreams are small OpenAI-shaped
responders (what is measured is the route, not an engine), each naming its host in its answer. Stable
runs on ``gpu-1``; the candidate has one replica on ``gpu-1`` (another port) and one on ``gpu-2``. The
users are on a host of their own, ``users``: open-loop traffic at ``--rate``, half through each router,
a new session per request.

- ``dead_replica_to_no_failures_s``: the candidate at 50%; every process on ``gpu-2`` is killed (SIGKILL).
  From the first failed request (no 200) to the last one; 0 when none failed. The failed requests
  are counted beside it. Goal: at most 1 s.
- ``partitioned_controller_to_stable_s``: a controller process on ``control`` holds the candidate's
  lease (the flow's ``RouteOwner`` and ``Heartbeat``, lease ``--lease`` s, renewed every
  ``--renew`` s); ``control``'s link goes down. From the cut to the sending time of the last request
  the candidate served, through either router. Goal: at most one lease.
- ``router_heal_catch_up_s``: ``edge-1`` is cut from ``store``; control commits a new generation (and
  notifies both routers, as the flow's commit does); ``edge-1`` serves on from its last snapshot; the
  cut heals. From the heal to ``edge-1``'s admin health reporting the new generation. Goal: at most
  one poll of the route store plus one store timeout (0.5 + 5 s).

Beside the first figure, the same fault on a route with ``max_retries`` 0: the requests that fail in
the ``WINDOW_S`` after the kill (each router's probes of the dead replica, one request each backoff).

Median and worst of ``--repeats`` each. Writes bench/results/faults.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

import boto3  # noqa: E402
import httpx  # noqa: E402

from bench.fleet import answers, machine  # noqa: E402
from revgate.flows import processes  # noqa: E402
from revgate.flows.spec import PromotionSpec  # noqa: E402
from revgate.manifests.gates import GatePolicy  # noqa: E402
from revgate.manifests.route import RevisionTarget, RouteSnapshot  # noqa: E402
from revgate.manifests.route_change import canary, successor  # noqa: E402
from revgate.promotion.routes import RolloutKeys  # noqa: E402
from revgate.registry.route_store_s3 import ATTEMPTS, TIMEOUT_S  # noqa: E402
from revgate.serving.worker.request import SignaturePolicySpec  # noqa: E402
from tests.integration.hosts import HOST_NAMES, Host, Network, run_prefix, sweep_stale, why_unavailable  # noqa: E402
from tests.integration.rollout_estate import OpenLoop, Sent, wait_until  # noqa: E402
from tests.integration.test_hosts import (  # noqa: E402
    ADMIN_TOKEN,
    ROUTE,
    S3_CREDENTIALS,
    Edge,
    Plane,
    edge_router,
    s3_server,
)

RESULTS = ROOT / "bench" / "results" / "faults.json"
STABLE = "sha256:" + "5" * 64  # the stable revision, as the route names it
CANDIDATE = "sha256:" + "6" * 64  # the candidate revision
WEIGHT_PPM = 500_000  # the candidate's share: 50%
POLL_S = 0.5  # the routers' route-store poll (flows/processes.py: router)
WINDOW_S = 20.0  # without retries: how long the traffic runs after the kill (past the 1, 2, 4 and 8 s backoffs)
QUIET_S = 5.0  # a dead replica's faults are over once no request has failed for this long (past 1, 2 and 4 s probes)
ALL_STABLE = 20  # the switch to stable has happened once each router's last this many answers were stable's
BY = "bench controller"

# An upstream: answers every completion at once, naming its host (argv[3]) in the answer's id.
UPSTREAM = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = json.dumps({"id": "cmpl-" + sys.argv[3], "object": "text_completion",
    "choices": [{"index": 0, "text": "3", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()
class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    do_GET = do_POST
    def log_message(self, *args):
        pass
ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Answer).serve_forever()
"""

# The controller on control: the flow's own fence and heartbeat. It writes the canary at 50% with a
# lease, then renews it through RouteOwner and Heartbeat (the flow's commit: conditional write, then a
# notify to every router) until it is ended. argv: the spec's file, the candidate's JSON, lease, period.
CONTROLLER = r"""
import logging, signal, sys
from datetime import UTC, datetime
from pathlib import Path
from revgate.flows.route_owner import Heartbeat, RouteOwner
from revgate.flows.spec import PromotionSpec
from revgate.manifests.route import RevisionTarget
from revgate.manifests.route_change import canary, successor
from revgate.promotion.routes import RolloutKeys
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
spec = PromotionSpec.model_validate_json(Path(sys.argv[1]).read_text())
candidate = RevisionTarget.model_validate_json(sys.argv[2])
lease, period, by = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
owner = RouteOwner(spec, RouteOwner(spec, 0).read().generation)
keys = RolloutKeys.new()
now = datetime.now(UTC)
owner.commit(lambda current: successor(current, by=by, now=now, candidate=canary(candidate, 500_000, now, lease),
                                       cohort_secret=keys.cohort_secret))
print(f"holding generation {owner.generation}", flush=True)
with Heartbeat(owner, lease_seconds=lease, period_s=period, by=by):
    signal.pause()
"""


@dataclass
class Users(OpenLoop):
    """OpenLoop's traffic, also noting which host's upstream answered each request (by its index)."""

    hosts: dict[int, str] = field(default_factory=dict)

    def _one(self, item: Sent, number: int) -> None:
        body = json.dumps({"model": "default", "prompt": "add 1+2=", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", data=body, method="POST",  # noqa: S310
                                         headers={"Content-Type": "application/json", "x-session-id": f"s{number}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
                answer = json.loads(response.read())
                item.status = response.status
                item.revision = response.headers.get("x-revgate-revision", "")
                item.generation = int(response.headers.get("x-revgate-generation", "0"))
                self.hosts[number] = str(answer.get("id", "")).removeprefix("cmpl-")
        except urllib.error.HTTPError as error:
            item.status, item.error = error.code, error.read()[:200].decode(errors="replace")
        except (OSError, ValueError) as error:
            item.error = str(error) or type(error).__name__
        finally:
            item.answered.set()

    def done(self) -> list[tuple[int, Sent]]:
        """Requests that have their answer (or their error), with their index."""
        return [(number, item) for number, item in enumerate(list(self.sent)) if item.answered.is_set()]


@dataclass(frozen=True)
class Fleet:
    """The hosts, the store, the two routers, the users' rate and the candidate's replica on gpu-1."""

    network: Network
    plane: Plane
    edges: list[Edge]
    rate: float
    candidate_url: str


@contextmanager
def upstream(gpu: Host, port: int | None = None) -> Iterator[str]:
    """An upstream on ``gpu``'s address (killed with its host, or ended with the block); its URL."""
    port = port or gpu.free_port()
    process = gpu.popen([sys.executable, "-c", UPSTREAM, gpu.address, str(port), gpu.name])
    try:
        wait_until(lambda: answers(gpu.url(port)), 30, f"the upstream on {gpu.name} answering")
        yield gpu.url(port)
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def traffic(edges: list[Edge], rate: float) -> Iterator[list[Users]]:
    """Users at ``rate`` in all, half through each router, for the block."""
    loops = [Users(edge.public, rate=rate / len(edges)) for edge in edges]
    with ExitStack() as stack:
        for loop in loops:
            stack.enter_context(loop.running())
        yield loops


def commit(plane: Plane, edges: list[Edge], **changes: Any) -> RouteSnapshot:
    """The next generation with ``changes``, written and announced to every router (the flow's commit)."""
    store = plane.route_store
    current = store.read(ROUTE)
    assert current is not None
    proposed = successor(current, by="bench", now=datetime.now(UTC), **changes)
    store.write(proposed)
    for edge in edges:
        httpx.post(f"{edge.admin}/admin/notify", headers={"Authorization": f"Bearer {edge.token}"}, timeout=10)
    return proposed


def admin(edge: Edge, path: str) -> bytes:
    """One read of a router's admin port (a connection of its own: the admin port closes idle ones)."""
    request = urllib.request.Request(f"{edge.admin}{path}",  # noqa: S310 - the router's admin port (http)
                                     headers={"Authorization": f"Bearer {edge.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return bytes(response.read())


def serving(edge: Edge) -> int:
    """The generation the router serves, as its admin health reports it."""
    return int(json.loads(admin(edge, "/admin/health"))["generation"])


def counter(edge: Edge, name: str) -> int:
    """One of the router's event counters for the route (its /metrics)."""
    text = admin(edge, "/metrics").decode()
    found = re.search(rf'^revgate_router_{name}_total\{{route="{ROUTE}"\}} (\d+)$', text, re.M)
    return int(found.group(1)) if found else 0


def all_serve(edges: list[Edge], generation: int, within_s: float = 30) -> None:
    wait_until(lambda: all(serving(edge) >= generation for edge in edges), within_s,
               f"every router serving generation {generation}", every_s=0.05)


def target(fingerprint: str, *endpoints: str) -> RevisionTarget:
    return RevisionTarget(fingerprint=fingerprint, endpoints=endpoints)


def long_canary(endpoints: tuple[str, ...]) -> dict[str, Any]:
    """The candidate at 50% with a lease that outlasts the measurement (nobody renews it here)."""
    return {"candidate": canary(target(CANDIDATE, *endpoints), WEIGHT_PPM, datetime.now(UTC), 3600),
            "cohort_secret": RolloutKeys.new().cohort_secret}


# --- 1. a dead replica ----------------------------------------------------------------------------

def dead_replica(fleet: Fleet, retries: int = 1, window_s: float = 0.0) -> dict[str, Any]:
    """The candidate at 50% over gpu-1 and gpu-2; every process on gpu-2 killed; its failed requests.

    ``retries``: the route's ``max_retries`` (1, the default, lets a refused request go to the candidate's
    other replica). With ``window_s`` the traffic runs that long after the kill, whatever fails meanwhile;
    without it, until no request has failed for QUIET_S."""
    plane, edges, gpu2 = fleet.plane, fleet.edges, fleet.network["gpu-2"]
    with ExitStack() as stack:
        doomed = stack.enter_context(upstream(gpu2))  # a fresh address each repeat: no ejection carried over
        written = commit(plane, edges, stable=plane.stable, max_retries=retries,
                         **long_canary((fleet.candidate_url, doomed)))
        all_serve(edges, written.generation)
        ejected = [counter(edge, "endpoint_ejected") for edge in edges]
        loops = stack.enter_context(traffic(edges, fleet.rate))
        wait_until(lambda: all(sum(loop.hosts.get(n) == "gpu-2" for n, _ in loop.done()) >= 5 for loop in loops),
                   60, "the candidate's gpu-2 replica serving through both routers")
        killed_s = time.time()
        for pid in gpu2.pids():
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not gpu2.pids(), 10, "nothing left running on gpu-2", every_s=0.01)

        def quiet() -> bool:
            done = [item for loop in loops for _, item in loop.done()]
            failed = [item.sent_s for item in done if item.status != 200]
            since = killed_s + window_s - QUIET_S if window_s else max([killed_s, *failed])
            return time.time() - since >= QUIET_S and all(
                counter(edge, "endpoint_ejected") > before for edge, before in zip(edges, ejected, strict=True))

        wait_until(quiet, 60 + window_s, "no request failing for 5 s after the kill (or the window's end), and "
                   "both routers ejecting the replica",
                   every_s=0.1)
    # The block has ended the traffic: every request has its answer.
    sent = [(loop, number, item) for loop in loops for number, item in enumerate(loop.sent)]
    failed = sorted(item.sent_s for _, _, item in sent if item.status != 200 and item.sent_s >= killed_s - 1)
    after = [(loop, number) for loop, number, item in sent if item.sent_s >= killed_s]
    return {
        "seconds": round(failed[-1] - failed[0], 3) if failed else 0.0,
        "failed": len(failed),
        "sent_after_kill": len(after),
        "kill_to_last_failure_s": round(failed[-1] - killed_s, 3) if failed else None,
        "failed_at_s": [round(at - killed_s, 2) for at in failed[:30]],  # sending times, from the kill
        "max_retries": retries,
        "candidate_share_after_kill": round(sum(loop.sent[number].revision == CANDIDATE for loop, number in after)
                                            / max(1, len(after)), 3),
        "ejections": sum(counter(edge, "endpoint_ejected") for edge in edges) - sum(ejected),
        "errors": sorted({item.error[:80] for _, _, item in sent if item.status != 200})[:3],
    }


# --- 2. a partitioned controller ------------------------------------------------------------------

def controller_spec(plane: Plane, edges: list[Edge], control: Host) -> Path:
    """What the operator provisions on control for the controller: the spec (route store, routers)."""
    token = control.folder / "router-token"
    token.write_text(edges[0].token, encoding="utf-8")
    token.chmod(0o600)
    unused = "http://127.0.0.1:9"  # never contacted: the controller here only holds the lease
    spec = PromotionSpec(
        route=ROUTE, candidate_manifest=CANDIDATE, artifact_store=str(control.folder / "artifacts"),
        route_store=plane.routes, signature=SignaturePolicySpec(kind="key", public_key="k.pub"),
        gate_policy=GatePolicy(), worker_url=unused, worker_token_file=str(token), router_url=edges[0].public,
        router_admin_url=edges[0].admin, more_routers=tuple(edge.admin for edge in edges[1:]),
        router_admin_token_file=str(token), records_sink=plane.records, trace="unused",
        tracking_uri=f"sqlite:///{control.folder / 'mlflow.db'}", evidence_root=str(control.folder / "evidence"))
    path = control.folder / "spec.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    return path


@contextmanager
def controller(control: Host, spec: Path, candidate: RevisionTarget, lease: int, renew: float) -> Iterator[None]:
    log = (control.folder / "controller.log").open("a", encoding="utf-8")
    process = control.popen([sys.executable, "-c", CONTROLLER, str(spec), candidate.model_dump_json(), str(lease),
                             str(renew), BY], env=S3_CREDENTIALS, stdout=log, stderr=log)
    try:
        yield
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def partitioned_controller(fleet: Fleet, spec: Path, lease: int, renew: float) -> dict[str, Any]:
    """The controller holds the candidate's lease; control's link goes down; until stable serves everything."""
    plane, edges, control = fleet.plane, fleet.edges, fleet.network["control"]
    store = plane.route_store
    start = commit(plane, edges, candidate=None, cohort_secret="", max_retries=1)  # stable alone
    all_serve(edges, start.generation)
    with ExitStack() as stack:
        stack.enter_context(controller(control, spec, target(CANDIDATE, fleet.candidate_url), lease, renew))
        # The controller's canary, then at least two renewals of it, served by both routers.
        renewed = wait_until(lambda: (now := store.read(ROUTE)) and now.created_by == BY
                             and now.generation >= start.generation + 3 and now, 60,
                             "the controller's canary renewed twice", every_s=0.1)
        all_serve(edges, renewed.generation)
        loops = stack.enter_context(traffic(edges, fleet.rate))
        wait_until(lambda: all(sum(item.revision == CANDIDATE for _, item in loop.done()) >= 5 for loop in loops),
                   60, "the candidate serving through both routers")
        cut_s = time.time()
        control.cut()
        try:
            held = store.read(ROUTE)  # what the routers hold: the controller's last renewal before the cut
            assert held is not None and held.candidate is not None
            lease_left = held.candidate.lease_expires_at.timestamp() - cut_s

            def all_stable() -> bool:
                tails = [[item for _, item in loop.done() if item.sent_s > cut_s][-ALL_STABLE:] for loop in loops]
                return all(len(tail) == ALL_STABLE and all(item.revision == STABLE for item in tail) for tail in tails)

            wait_until(all_stable, lease + 30, "every router sending every new request to stable", every_s=0.05)
        finally:
            stack.close()  # traffic ends, then the controller (ended while still cut: it writes nothing more)
            control.heal()
    last = {edge.name: max(item.sent_s for item in loop.sent if item.revision == CANDIDATE) - cut_s
            for edge, loop in zip(edges, loops, strict=True)}
    failed = [item for loop in loops for item in loop.sent if item.status != 200]
    renewals = [s for s in store.history(ROUTE) if s.generation > start.generation and s.created_by == BY]
    return {"seconds": round(max(last.values()), 3), "per_router_s": {k: round(v, 3) for k, v in last.items()},
            "lease_s": lease, "renew_s": renew,
            "lease_left_at_cut_s": round(lease_left, 3), "failed": len(failed),
            "sent": sum(len(loop.sent) for loop in loops), "controller_writes": len(renewals)}


# --- 3. a router healed from its store ------------------------------------------------------------

def router_heal(fleet: Fleet) -> dict[str, Any]:
    """edge-1 cut from store; a new generation committed; edge-1 serving its snapshot; healed: until it catches up."""
    network, plane, edges = fleet.network, fleet.plane, fleet.edges
    control, store, cut_edge = network["control"], network["store"], network["edge-1"]
    one, two = edges
    with control.network():
        start = commit(plane, edges, candidate=None, cohort_secret="", max_retries=1)
    all_serve(edges, start.generation)
    with traffic(edges, fleet.rate) as loops:
        wait_until(lambda: all(len(loop.done()) >= 5 for loop in loops), 60, "users served through both routers")
        unavailable = counter(one, "store_unavailable")
        cut_edge.cut_from(store)
        try:
            wait_until(lambda: counter(one, "store_unavailable") > unavailable, 60, "edge-1's poll failing on the cut",
                       every_s=0.05)
            with control.network():
                written = commit(plane, edges)  # the next generation, the same traffic
            wait_until(lambda: serving(two) == written.generation, 30, "edge-2 serving the new generation",
                       every_s=0.05)
            cut_at = len(loops[0].sent)
            wait_until(lambda: counter(one, "store_unavailable") >= unavailable + 3
                       and sum(item.status == 200 for item in loops[0].sent[cut_at:]) >= 10, 60,
                       "edge-1 polling on the cut and serving users meanwhile", every_s=0.05)
            behind = serving(one)
            served_on_cut = loops[0].sent[cut_at:]
        finally:
            healed_s = time.perf_counter()
            cut_edge.heal(store)
        wait_until(lambda: serving(one) == written.generation, 60, "edge-1 catching up once healed", every_s=0.01)
        caught = time.perf_counter() - healed_s
        after = len(loops[0].sent)
        wait_until(lambda: any(item.generation == written.generation for item in loops[0].sent[after:]), 30,
                   "users served the new generation through edge-1")
    assert behind == start.generation, f"edge-1 served generation {behind} while cut, not its last snapshot"
    failed = [item for loop in loops for item in loop.sent if item.status != 200]
    return {"seconds": round(caught, 3), "served_through_edge_1_while_cut": sum(i.status == 200 for i in served_on_cut),
            "failed": len(failed), "served_generation_while_cut": behind, "new_generation": written.generation}


# --- the run --------------------------------------------------------------------------------------

def summary(runs: list[dict[str, Any]], goal: float, **extra: Any) -> dict[str, Any]:
    seconds = [run["seconds"] for run in runs]
    return {"median": round(statistics.median(seconds), 3), "worst": round(max(seconds), 3), "goal": goal,
            **extra, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0, help="users' requests per second, all routers")
    parser.add_argument("--lease", type=int, default=6, help="the candidate's lease held by the controller, s")
    parser.add_argument("--renew", type=float, default=1.0, help="the controller's renewal period, s")
    args = parser.parse_args()
    missing = why_unavailable()
    if missing:
        print(f"bench/faults.py needs hosts of their own (network namespaces): {missing}; nothing measured")
        return 0
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    sweep_stale(run_prefix())
    root = Path(tempfile.mkdtemp(prefix="revgate-faults-"))
    network = Network.create(run_prefix(), HOST_NAMES, root)
    dead: list[dict[str, Any]] = []
    unretried: list[dict[str, Any]] = []
    partitioned: list[dict[str, Any]] = []
    heal: list[dict[str, Any]] = []
    try:
        store, gpu1 = network["store"], network["gpu-1"]
        with ExitStack() as stack, network["users"].network():
            s3 = stack.enter_context(s3_server(store))
            client = boto3.client("s3", endpoint_url=s3)
            for bucket in ("routes", "records"):
                client.create_bucket(Bucket=bucket)
            stable_url = stack.enter_context(upstream(gpu1))
            plane = Plane(s3, f"s3://routes/faults?endpoint_url={s3}", f"s3://records/faults?endpoint_url={s3}",
                          target(STABLE, stable_url))
            plane.route_store.write(RouteSnapshot(route=ROUTE, generation=1, stable=plane.stable, created_by="bench",
                                                  created_at=datetime.now(UTC), reveal_revision=True))
            # The operator provisions one admin token for the route's routers; control holds a copy.
            processes.token_file(network["control"].folder / ADMIN_TOKEN)  # edge_router provisions each edge's copy
            edges = [stack.enter_context(edge_router(network[name], plane.routes, plane.records,
                                                     control=network["control"])) for name in ("edge-1", "edge-2")]
            all_serve(edges, 1, 60)
            fleet = Fleet(network, plane, edges, args.rate, stack.enter_context(upstream(gpu1)))
            spec = controller_spec(plane, edges, network["control"])
            for number in range(args.repeats):
                dead.append(dead_replica(fleet))
                print(f"dead replica {number + 1}: {dead[-1]}", flush=True)
            for number in range(args.repeats):
                run = dead_replica(fleet, retries=0, window_s=WINDOW_S)
                # Within the window only: past it the probes go on failing (one request each backoff).
                unretried.append({"first_to_last_failure_in_window_s": run.pop("seconds"), **run})
                print(f"dead replica, no retries {number + 1}: {unretried[-1]}", flush=True)
            for number in range(args.repeats):
                partitioned.append(partitioned_controller(fleet, spec, args.lease, args.renew))
                print(f"partitioned controller {number + 1}: {partitioned[-1]}", flush=True)
            for number in range(args.repeats):
                heal.append(router_heal(fleet))
                print(f"router heal {number + 1}: {heal[-1]}", flush=True)
    finally:
        network.close()
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "dead_replica_to_no_failures_s": summary(
            dead, 1.0, failed_requests=sum(run["failed"] for run in dead), max_retries=1,
            without_retries={"max_retries": 0, "window_s": WINDOW_S,
                             "failed_requests": [run["failed"] for run in unretried], "runs": unretried}),
        "partitioned_controller_to_stable_s": summary(partitioned, float(args.lease), lease_s=args.lease,
                                                      renew_s=args.renew,
                                                      failed_requests=sum(run["failed"] for run in partitioned)),
        "router_heal_catch_up_s": summary(heal, POLL_S + TIMEOUT_S, store_timeout_s=TIMEOUT_S,
                                          store_attempts=ATTEMPTS, poll_s=POLL_S,
                                          failed_requests=sum(run["failed"] for run in heal)),
    }
    print("| figure | median | worst | goal | failed requests |\n|---|---|---|---|---|")
    for name, figure in figures.items():
        print(f"| {name} (of {len(figure['runs'])}) | {figure['median']} | {figure['worst']} | <= {figure['goal']} | "
              f"{figure['failed_requests']} |")
    print(f"| dead replica, route max_retries 0: failed requests in the {WINDOW_S:.0f} s after the kill | "
          f"{', '.join(str(run['failed']) for run in unretried)} | | | |")
    RESULTS.write_text(json.dumps({
        "command": " ".join(["python bench/faults.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
        "details": {"rate_rps": args.rate, "routers": 2, "weight_ppm": WEIGHT_PPM,
                    "hosts": "network namespaces: control (controller), store (moto S3), edge-1, edge-2 (routers), "
                             "gpu-1 (stable; candidate replica 1), gpu-2 (candidate replica 2), users"},
        "figures": figures}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
