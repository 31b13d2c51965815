"""Faults across hosts of their own, on small upstreams: what bench/faults.py measures and
tests/integration/test_host_faults.py asserts, shared so both run the same scenario.

The parts: moto's S3 server on ``store`` (route store and record sink), a ``revgate router`` on
``edge-1`` and one on ``edge-2`` (each signing its records), the controller's code on ``control``. The
upstreams are small OpenAI-shaped responders (what is measured is the route, not an engine), each
naming its host in its answer. Stable runs on ``gpu-1``; the candidate has one replica on ``gpu-1``
(another port) and one on ``gpu-2``. The users are open-loop traffic, half through each router, a new
session per request.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx

from revgate.flows import processes
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.promotion.routes import RolloutKeys
from revgate.serving.worker.request import SignaturePolicySpec
from tests.integration.hosts import Host, Network
from tests.integration.rollout_estate import OpenLoop, Sent, wait_until
from tests.integration.test_hosts import ADMIN_TOKEN, ROUTE, S3_CREDENTIALS, Edge, Plane, edge_router, s3_server

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
def upstream_process(gpu: Host, port: int | None = None) -> Iterator[tuple[str, Any]]:
    """An upstream on ``gpu``'s address (killed with its host, or ended with the block); its URL and process."""
    port = port or gpu.free_port()
    process = gpu.popen([sys.executable, "-c", UPSTREAM, gpu.address, str(port), gpu.name])
    try:
        wait_until(lambda: answers(gpu.url(port)), 30, f"the upstream on {gpu.name} answering")
        yield gpu.url(port), process
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def upstream(gpu: Host, port: int | None = None) -> Iterator[str]:
    """An upstream on ``gpu``'s address (killed with its host, or ended with the block); its URL."""
    with upstream_process(gpu, port) as (url, _):
        yield url


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


def held_canary(fleet: Fleet, stack: ExitStack, spec: Path, lease: int, renew: float) -> tuple[RouteSnapshot,
                                                                                          list[Users]]:
    """Stable alone, then the controller on control holding the candidate's canary (renewed at least twice and
    served by both routers), and users through both for as long as ``stack`` holds them: the generation before
    the canary, and the users."""
    plane, edges, store = fleet.plane, fleet.edges, fleet.plane.route_store
    start = commit(plane, edges, candidate=None, cohort_secret="", max_retries=1)  # stable alone
    all_serve(edges, start.generation)
    stack.enter_context(controller(fleet.network["control"], spec, target(CANDIDATE, fleet.candidate_url), lease,
                                   renew))
    renewed = wait_until(lambda: (now := store.read(ROUTE)) and now.created_by == BY
                         and now.generation >= start.generation + 3 and now, 60,
                         "the controller's canary renewed twice", every_s=0.1)
    all_serve(edges, renewed.generation)
    loops = stack.enter_context(traffic(edges, fleet.rate))
    wait_until(lambda: all(sum(item.revision == CANDIDATE for _, item in loop.done()) >= 5 for loop in loops),
               60, "the candidate serving through both routers")
    return start, loops


def partitioned_controller(fleet: Fleet, spec: Path, lease: int, renew: float) -> dict[str, Any]:
    """The controller holds the candidate's lease; control's link goes down; until stable serves everything."""
    edges, control, store = fleet.edges, fleet.network["control"], fleet.plane.route_store
    with ExitStack() as stack:
        start, loops = held_canary(fleet, stack, spec, lease, renew)
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


# --- 4. the candidate's last replica killed -------------------------------------------------------

def last_replica(fleet: Fleet) -> dict[str, Any]:
    """The candidate at 50% with one replica on gpu-1 and one on gpu-2; every process on gpu-2 killed, then the
    candidate's last replica (on gpu-1) killed: until every router sends every new request to stable.

    ``seconds``: from the last kill to the sending time of the last request after it that stable did not
    answer with 200 (0 when none). The routers' fallbacks are counted, and their records name the candidate."""
    plane, edges, network = fleet.plane, fleet.edges, fleet.network
    gpu1, gpu2 = network["gpu-1"], network["gpu-2"]
    with ExitStack() as stack:
        doomed = stack.enter_context(upstream(gpu2))
        last_url, last = stack.enter_context(upstream_process(gpu1))
        written = commit(plane, edges, stable=plane.stable, max_retries=1, **long_canary((last_url, doomed)))
        all_serve(edges, written.generation)
        fallbacks = [counter(edge, "fallback_to_stable") for edge in edges]
        loops = stack.enter_context(traffic(edges, fleet.rate))
        wait_until(lambda: all(sum(loop.hosts.get(n) == "gpu-2" for n, _ in loop.done()) >= 5 for loop in loops),
                   60, "the candidate's gpu-2 replica serving through both routers")
        first_kill_s = time.time()
        for pid in gpu2.pids():
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not gpu2.pids(), 10, "nothing left running on gpu-2", every_s=0.01)
        wait_until(lambda: all(sum(item.revision == CANDIDATE and item.sent_s > first_kill_s + 1
                                   for _, item in loop.done()) >= 5 for loop in loops),
                   60, "the candidate's last replica serving through both routers")
        killed_s = time.time()
        last.kill()  # SIGKILL: its port refuses from now on
        last.wait(10)

        def all_stable() -> bool:
            tails = [[item for _, item in loop.done() if item.sent_s > killed_s][-ALL_STABLE:] for loop in loops]
            return all(len(tail) == ALL_STABLE and all(item.revision == STABLE for item in tail) for tail in tails)

        wait_until(all_stable, 60, "every router sending every new request to stable", every_s=0.05)
    after = [item for loop in loops for item in loop.sent if item.sent_s >= killed_s]
    not_stable = sorted(item.sent_s - killed_s for item in after if item.status != 200 or item.revision != STABLE)
    failed = [item for loop in loops for item in loop.sent if item.status != 200]
    since_kill = [item.sent_s - max(k for k in (first_kill_s, killed_s) if k <= item.sent_s)
                  for item in failed if item.sent_s >= first_kill_s]
    return {
        "seconds": round(not_stable[-1], 3) if not_stable else 0.0,
        "generation": written.generation,
        "sent_after_kill": len(after),
        "not_on_stable_after_kill": len(not_stable),
        "failed": len(failed),
        # Sending times of failed requests from the kill before them: only those in flight at a kill (sent
        # before it) or sent in the moment the router learns of it may fail.
        "failed_since_kill_s": [round(at, 2) for at in since_kill][:30],
        "failed_a_second_after_a_kill": sum(at >= 1.0 for at in since_kill),
        "fallbacks": sum(counter(edge, "fallback_to_stable") for edge in edges) - sum(fallbacks),
        "errors": sorted({item.error[:80] for item in failed})[:3],
    }


# --- 5. an edge cut from the store while a canary's lease is held ---------------------------------

def cut_edge_lease(fleet: Fleet, spec: Path, lease: int, renew: float) -> dict[str, Any]:
    """The controller holds a canary's lease (renewed every ``renew`` s); ``edge-1`` is cut from ``store``: it
    serves its snapshot until that snapshot's lease ends, then sends every new request to stable, while
    ``edge-2`` serves the renewed canary; healed, ``edge-1`` catches up and serves the canary again.

    ``seconds``: from the end of the lease ``edge-1`` held to the sending time of the last request through it
    that the candidate served (at most 0 when it switched by its own clock, as it should)."""
    network, store = fleet.network, fleet.plane.route_store
    store_host, cut_edge, one = network["store"], network["edge-1"], fleet.edges[0]
    with ExitStack() as stack:
        _, loops = held_canary(fleet, stack, spec, lease, renew)
        unavailable = counter(one, "store_unavailable")
        cut_s = time.time()
        cut_edge.cut_from(store_host)
        try:
            wait_until(lambda: counter(one, "store_unavailable") > unavailable, 60,
                       "edge-1's poll failing on the cut", every_s=0.05)
            held = next(s for s in store.history(ROUTE) if s.generation == serving(one))
            assert held.candidate is not None
            lease_end_s = held.candidate.lease_expires_at.timestamp()

            def one_on_stable() -> bool:
                tail = [item for _, item in loops[0].done() if item.sent_s > lease_end_s][-ALL_STABLE:]
                return len(tail) == ALL_STABLE and all(item.revision == STABLE for item in tail)

            wait_until(one_on_stable, lease + 60, "edge-1 sending every new request to stable", every_s=0.05)
            behind = serving(one)
            two_after = [item for _, item in loops[1].done() if item.sent_s > lease_end_s]
        finally:
            healed_s = time.time()
            cut_edge.heal(store_host)
        latest = store.read(ROUTE)
        assert latest is not None
        wait_until(lambda: serving(one) >= latest.generation, 60, "edge-1 catching up once healed", every_s=0.01)
        caught_s = time.time() - healed_s
        wait_until(lambda: any(item.revision == CANDIDATE and item.sent_s > healed_s + caught_s
                               for _, item in loops[0].done()), 60, "edge-1 serving the canary again")
        stack.close()  # traffic ends, then the controller
    through_one = [item for item in loops[0].sent if item.revision == CANDIDATE and cut_s <= item.sent_s < healed_s]
    failed = [item for loop in loops for item in loop.sent if item.status != 200]
    return {
        "seconds": round(max(item.sent_s for item in through_one) - lease_end_s, 3) if through_one else None,
        "lease_s": lease, "renew_s": renew,
        "lease_left_at_cut_s": round(lease_end_s - cut_s, 3),
        "edge_1_generation_while_cut": behind, "edge_1_held_generation": held.generation,
        "edge_2_candidate_share_after_lease_end": round(
            sum(item.revision == CANDIDATE for item in two_after) / max(1, len(two_after)), 3),
        "heal_to_catch_up_s": round(caught_s, 3),
        "failed": len(failed), "sent": sum(len(loop.sent) for loop in loops),
    }

def answers(url: str) -> bool:
    """Whether the responder at ``url`` answers a completion with 200."""
    try:
        return httpx.post(f"{url}/v1/completions", json={}, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def faults_fleet(network: Network, rate: float) -> Iterator[Fleet]:
    """The store with its buckets, stable's upstream and a candidate replica's on ``gpu-1``, both routers
    serving stable alone; users at ``rate``, from ``users``, in the scenarios run on it."""
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)
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
        yield Fleet(network, plane, edges, rate, stack.enter_context(upstream(gpu1)))

