"""What the worker tells the control plane: replica views and the capacity report. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from revgate.manifests.revision import RuntimeEnvironment
from revgate.registry.compat import EngineCapabilities
from revgate.serving.worker.state import Replica, ReplicaState

# Listed per revision so a controller sees capacity on its way, but never counted as capacity.
PENDING = (ReplicaState.CREATED, ReplicaState.LOADING, ReplicaState.WARMING)


def replica_view(replica: Replica, in_flight: int = 0, probes: dict[str, bool] | None = None) -> dict[str, Any]:
    """The JSON view of one replica: state, endpoint, readiness, probes, requests in flight, timings,
    capacity, failure, drain."""
    view = asdict(replica)
    view["state"] = str(replica.state)
    view["ready"] = replica.is_ready
    view["probes"] = probes if probes is not None else {"readiness": replica.is_ready}
    view["in_flight"] = in_flight
    if replica.failure is not None:
        view["failure"]["log_tail"] = list(replica.failure.log_tail)
    return view


def engine_report(runtime: RuntimeEnvironment, engine: EngineCapabilities, *, device: str, slots: int,
                  memory_bytes: int) -> dict[str, Any]:
    """What this host runs a revision with: its engine build (the runtime ``e`` a revision pins) and what
    that build can run. The controller pins ``e`` from here, never from a build of its own."""
    return {"runtime": runtime.model_dump(mode="json"), "device": device, "slots": slots,
            "memory_bytes": memory_bytes,
            "capabilities": {"head_sizes": sorted(engine.head_sizes), "dtypes": sorted(engine.dtypes),
                             "quantization": sorted(engine.quantization)}}


def _empty_revision_entry() -> dict[str, Any]:
    entry: dict[str, Any] = {"ready_replicas": 0, "requests_per_s": 0.0, "output_tokens_per_s": 0.0,
                             "ready_endpoints": {}}
    entry.update({str(state): [] for state in (*PENDING, ReplicaState.READY, ReplicaState.DRAINING)})
    return entry


def capacity_report(replicas: Iterable[Replica], *, device: str = "cpu", slots: int = 0) -> dict[str, Any]:
    """Ready replicas per revision with their summed measured capacity, and the host's room for more.

    Loading, warming and draining replicas are listed by id under their state but add nothing to
    ``ready_replicas`` or the capacity figures: a controller must not route to capacity that is
    still coming or already leaving. Failed and terminated replicas are left out. ``free_slots``
    is how many more replicas get a slot of their own (see serving.worker.cores): placement reads it.
    """
    revisions: dict[str, dict[str, Any]] = {}
    live = 0
    for replica in replicas:
        if replica.state in (ReplicaState.FAILED, ReplicaState.TERMINATED):
            continue
        live += replica.state is not ReplicaState.DRAINING
        entry = revisions.setdefault(replica.revision, _empty_revision_entry())
        entry[str(replica.state)].append(replica.replica_id)
        if replica.is_ready and replica.capacity is not None:
            entry["ready_replicas"] += 1
            entry["requests_per_s"] += replica.capacity.requests_per_s
            entry["output_tokens_per_s"] += replica.capacity.output_tokens_per_s
            # By endpoint, so a controller counts only the replicas its route sends to.
            entry["ready_endpoints"][replica.endpoint] = replica.capacity.requests_per_s
    return {"revisions": revisions, "device": device, "slots": slots, "free_slots": max(0, slots - live)}
