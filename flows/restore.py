"""Rollback onto ready capacity: when the revision a rollback returns to has no replica that answers
(drained after the window, an hour ago), start its replicas through the agents, verified and warmed
like any candidate, and hand their endpoints to the rollback once they are ready.

The revision's documents come from the site configuration (a named candidate whose pinned revision
has that fingerprint) or from the evidence ledger (the service revision its promotion run kept).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from revgate.flows.site import RouteSite
from revgate.flows.steps import start_spread
from revgate.manifests.errors import RevgateError
from revgate.manifests.revision import RuntimeEnvironment, ServiceRevision
from revgate.manifests.route import RouteSnapshot
from revgate.registry.store import open_store
from revgate.serving.worker.client import WorkerClient, one_build
from revgate.serving.worker.request import ReplicaRequest

Say = Callable[[str], None]


class RevisionUnknown(RevgateError):
    """The revision a rollback returns to cannot be started: neither the site nor the ledger has its documents."""


def revision_of(settings: RouteSite, fingerprint: str, runtime: RuntimeEnvironment) -> ServiceRevision:
    """The service revision with ``fingerprint``: a site candidate pinned as a rollout pins it (on ``runtime``, the
    agents' engine build), or the one its promotion run kept in the evidence ledger."""
    store = open_store(settings.artifact_store)
    for name, digest in settings.candidates.items():
        revision = ServiceRevision(name=name, artifact=store.get_manifest(digest), runtime=runtime,
                                   execution=settings.execution, interface=settings.interface)
        if revision.fingerprint == fingerprint:
            return revision
    kept = _from_ledger(settings, fingerprint)
    if kept is not None:
        return kept
    raise RevisionUnknown(
        f"no document of revision {fingerprint[:19]} to start it from: no candidate of the site configuration "
        "pins to it and no promotion run in the ledger kept it",
        where=f"site configuration candidates {sorted(settings.candidates)}, ledger {settings.tracking_uri}",
        fix="Start replicas of that revision on the workers by hand and roll back again, or name its manifest "
            "among the route's candidates.",
    )


def _from_ledger(settings: RouteSite, fingerprint: str) -> ServiceRevision | None:
    if not settings.tracking_uri:
        return None
    from revgate.registry.follow import brief_registry_requests
    from revgate.registry.ledger import EvidenceLedger

    try:
        with brief_registry_requests():
            ledger = EvidenceLedger(settings.tracking_uri, Path(settings.evidence_root) / "mlflow-artifacts")
            for run in ledger.evidence_of(fingerprint):
                stored = ledger.evidence_files(run.run_id).get("service-revision")
                if stored is not None:
                    return ServiceRevision.model_validate(json.loads(stored))
    except Exception:  # an unreachable ledger is one source fewer, never the rollback's failure
        return None
    return None


def restorer(settings: RouteSite, say: Say = print, timeout_s: float = 900) -> Callable[[RouteSnapshot], list[str]]:
    """The rollback's ``restore``: start as many replicas as the planned stable had, spread over the route's
    agents, and return their endpoints once every one is ready (verified, loaded, warmed)."""

    def restore(planned: RouteSnapshot) -> list[str]:
        token = Path(settings.worker_token_file).read_text(encoding="utf-8").strip()
        clients = {url.rstrip("/"): WorkerClient(url, token)
                   for url in dict.fromkeys((settings.worker_url, *settings.more_workers))}
        # Every agent's build, as a rollout pins it: a restore never starts one revision as two.
        engine = one_build([client.engine() for client in clients.values()])
        revision = revision_of(settings, planned.stable.fingerprint, engine.runtime)
        request = ReplicaRequest(revision=revision, store=settings.artifact_store,
                                 signature_policy=settings.signature, warm=settings.warm)
        endpoints = []
        for replica in start_spread(clients.values(), request, max(1, len(planned.stable.endpoints))):
            url = replica.worker_url
            say(f"  replica {replica.replica_id} of {revision.name or revision.short} on {url}: "
                "verifying, loading, warming")
            view = clients[url].wait_for(replica.replica_id, {"ready"}, timeout_s)
            if view.state != "ready":
                raise RevisionUnknown(f"replica {replica.replica_id} ended {view.state} before it was ready: "
                                      f"{view.reason}", where=url,
                                      fix="Read the replica's engine log on the worker; the route was not moved.")
            say(f"  replica {replica.replica_id} ready at {view.endpoint}")
            endpoints.append(view.endpoint)
        return endpoints

    return restore
