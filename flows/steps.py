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

from flows.spec import PromotionSpec
from manifests.errors import RevgateError
from manifests.revision import ServiceRevision
from manifests.route import RevisionTarget, RouteSnapshot
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


def check_capacity(spec: PromotionSpec, stable: str) -> dict[str, Any]:
    """Stable must have ready capacity (loading, warming, draining replicas do not count)."""
    report = worker(spec).capacity()
    entry = report.get("revisions", {}).get(stable, {})
    if not entry.get("ready_replicas"):
        raise PromotionRefused(
            f"stable revision {stable[:19]} has no ready replica on {spec.worker_url}",
            where="capacity", fix="Restore stable capacity before starting a rollout.",
        )
    return report


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


def load_candidate(spec: PromotionSpec, revision: ServiceRevision) -> dict[str, Any]:
    """The candidate's replica, ready on the spec's worker."""
    return start_replica(worker(spec), replica_request(spec, revision))


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


def drain(spec: PromotionSpec, fingerprint: str, grace_s: float = 30) -> list[str]:
    """Drain every live replica of ``fingerprint`` on the worker; the ids drained."""
    client = worker(spec)
    live = {"created", "loading", "warming", "ready"}
    replicas = [r for r in client.replicas() if r.get("revision") == fingerprint and r.get("state") in live]
    ids = [str(r["replica_id"]) for r in replicas]
    for replica_id in ids:
        client.drain(replica_id, grace_s)
    return ids
