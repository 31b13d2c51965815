"""The promotion's I/O steps as plain functions: pin, verify, capacity, load, isolated check, route.

The Prefect flow wraps each in a task; keeping them plain lets the command line and the tests
run any step without an orchestrator.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from flows.evidence import live_arrivals
from flows.spec import PromotionSpec
from manifests.errors import RevgateError
from manifests.revision import ServiceRevision
from manifests.route import RevisionTarget, RouteSnapshot
from promotion.capacity import CapacityCheck, check_capacity, observed_demand, revisions_from_report
from registry.route_store import open_route_store
from registry.runtime import engine_runtime
from registry.store import open_store
from serving.worker.artifact import ArtifactPreparer
from serving.worker.client import WorkerClient
from serving.worker.request import ReplicaRequest


class PromotionRefused(RevgateError):
    """A precondition of the promotion does not hold; nothing was loaded and no traffic moved."""


def pin(spec: PromotionSpec) -> ServiceRevision:
    """Resolve the candidate to its immutable documents: manifest by digest, this host's engine build."""
    manifest = open_store(spec.artifact_store).get_manifest(spec.candidate_manifest)
    return ServiceRevision(
        name=spec.candidate_name,
        artifact=manifest,
        runtime=engine_runtime(Path(spec.engine_venv)),
        execution=spec.execution,
        interface=spec.interface,
    )


def replica_request(spec: PromotionSpec, revision: ServiceRevision) -> ReplicaRequest:
    """The worker's start request for the candidate."""
    return ReplicaRequest(revision=revision, store=spec.artifact_store, signature_policy=spec.signature, warm=spec.warm)


def verify(spec: PromotionSpec, revision: ServiceRevision, cache: Path) -> dict[str, float]:
    """Fetch and verify digests, signature and compatibility here, before any worker loads a byte."""
    prepared = ArtifactPreparer(Path(spec.engine_venv))(replica_request(spec, revision), cache)
    return {"fetch_s": prepared.fetch_s, "verify_s": prepared.verify_s}


def current_route(spec: PromotionSpec) -> RouteSnapshot:
    """The committed route; a promotion needs a stable revision to compare against and fall back to."""
    snapshot = open_route_store(spec.route_store).read(spec.route)
    if snapshot is None:
        raise PromotionRefused(
            f"route {spec.route!r} has no snapshot", where=spec.route_store,
            fix="Create the route with its stable revision first (revgate route set).",
        )
    return snapshot


def worker(spec: PromotionSpec) -> WorkerClient:
    """A client for the spec's worker agent."""
    return WorkerClient(spec.worker_url, Path(spec.worker_token_file).read_text(encoding="utf-8").strip())


def observed_demand_rps(spec: PromotionSpec, window_s: float = 30.0) -> float:
    """Live requests per second the router saw over the last ``window_s`` (0 when it keeps no records)."""
    if not spec.router_records:
        return 0.0
    now = time.time()
    return observed_demand(live_arrivals(Path(spec.router_records), now - window_s), now, window_s)


def capacity(spec: PromotionSpec, shares: dict[str, float]) -> CapacityCheck:
    """The capacity rule for ``shares`` (revision -> fraction of traffic) on the worker's ready replicas."""
    return check_capacity(shares, revisions_from_report(worker(spec).capacity()),
                          demand_rps=observed_demand_rps(spec), target_utilisation=float(spec.plan.target_utilisation))


def check_stable_capacity(spec: PromotionSpec, stable: str) -> dict[str, Any]:
    """Stable must carry all the traffic before anything is loaded (loading, warming, draining do not count)."""
    check = capacity(spec, {stable: 1.0})
    if not check.ok:
        raise PromotionRefused(
            f"stable cannot carry the route's traffic on {spec.worker_url}: {check.reason}",
            where="capacity", fix="Restore stable capacity before starting a rollout.",
        )
    return check.evidence()


def start_replica(client: WorkerClient, request: ReplicaRequest, timeout_s: float = 600) -> dict[str, Any]:
    """Start, verify, load and warm a replica on the worker; its view once ready, else the worker's reason."""
    replica = client.start(request)
    view = client.wait_for(str(replica["replica_id"]), {"ready"}, timeout_s)
    if view.get("state") != "ready":
        failure = view.get("failure") or {}
        reason = f"{failure.get('error', '')} {failure.get('message', '')}".strip()
        raise PromotionRefused(
            f"replica of {request.revision.name or request.revision.short} ended {view.get('state')}: {reason}",
            where=client.url, fix="Read the replica's reason in the worker's log; nothing was routed to it.",
        )
    return view


def start_candidate(spec: PromotionSpec, revision: ServiceRevision) -> dict[str, Any]:
    """Ask the spec's worker for the candidate's replica; its view in state ``created``."""
    return worker(spec).start(replica_request(spec, revision))


def wait_ready(spec: PromotionSpec, replica: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """The started replica's view once ready, else PromotionRefused with the worker's reason."""
    client = worker(spec)
    view = client.wait_for(str(replica["replica_id"]), {"ready"}, timeout_s)
    if view.get("state") != "ready":
        failure = view.get("failure") or {}
        reason = f"{failure.get('error', '')} {failure.get('message', '')}".strip()
        raise PromotionRefused(
            f"replica {replica['replica_id']} ended {view.get('state')}: {reason}",
            where=client.url, fix="Read the replica's reason in the worker's log; nothing was routed to it.",
        )
    return view


def _post(url: str, body: dict[str, Any], timeout_s: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(  # noqa: S310 - the replica's own http endpoint
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        return int(response.status), bytes(response.read())


def isolated_check(endpoint: str, model: str) -> dict[str, float]:
    """Completion and streaming against the candidate alone, off the live path."""
    started = time.monotonic()
    status, body = _post(f"{endpoint}/v1/completions", {"model": model, "prompt": "add 1+2=", "max_tokens": 4})
    if status != 200 or not json.loads(body).get("choices"):
        raise PromotionRefused(f"candidate completion failed with {status}", where=endpoint, fix="Inspect the replica.")
    status, body = _post(
        f"{endpoint}/v1/completions", {"model": model, "prompt": "rev abc=", "max_tokens": 4, "stream": True}
    )
    if status != 200 or not body.rstrip().endswith(b"data: [DONE]"):
        raise PromotionRefused("candidate stream did not end with [DONE]", where=endpoint, fix="Inspect the replica.")
    return {"isolated_check_s": time.monotonic() - started}


def candidate_target(view: dict[str, Any], revision: ServiceRevision) -> RevisionTarget:
    """The route target for a ready replica view."""
    return RevisionTarget(
        fingerprint=revision.fingerprint, endpoints=(str(view["endpoint"]),), served_model=str(view["served_model"])
    )


def commit_route(spec: PromotionSpec, snapshot: RouteSnapshot) -> None:
    """Compare-and-swap the snapshot into the store, then tell the router to read it now."""
    open_route_store(spec.route_store).write(snapshot)
    token = Path(spec.router_admin_token_file).read_text(encoding="utf-8").strip()
    request = urllib.request.Request(  # noqa: S310 - the router's admin port
        f"{spec.router_admin_url}/admin/notify", data=b"", headers={"Authorization": f"Bearer {token}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310
            pass
    except OSError:
        pass  # the router also polls the store; a missed notify only delays the swap by one poll


LIVE = frozenset({"created", "loading", "warming", "ready"})


def replicas_serving(spec: PromotionSpec, endpoints: tuple[str, ...]) -> dict[str, str]:
    """Live replicas on the worker behind ``endpoints``: replica id -> endpoint."""
    wanted = {url.rstrip("/") for url in endpoints}
    return {str(r["replica_id"]): str(r["endpoint"]).rstrip("/") for r in worker(spec).replicas()
            if r.get("state") in LIVE and str(r.get("endpoint", "")).rstrip("/") in wanted}


def drain_replica(spec: PromotionSpec, replica_id: str, grace_s: float = 30) -> bool:
    """Drain one replica by id (a replica already gone is fine); whether a drain was started."""
    client = worker(spec)
    if client.replica(replica_id).get("state") not in LIVE:
        return False
    client.drain(replica_id, grace_s)
    return True


def replica_fault(spec: PromotionSpec, replica_id: str) -> str | None:
    """Why the rollout's candidate replica can no longer serve (failed, terminated), or None while it is ready.

    A worker that cannot be asked is no verdict: the next look asks again.
    """
    try:
        view = worker(spec).replica(replica_id)
    except (OSError, RevgateError):
        return None
    if view.get("state") in ("ready",):
        return None
    failure = view.get("failure") or {}
    return f"candidate replica {replica_id} is {view.get('state')}: {failure.get('message', '')}".strip(": ")
