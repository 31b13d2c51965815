"""Building the next route snapshot: every change is a new, fully validated generation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from revgate.manifests.revision import InterfacePolicy
from revgate.manifests.route import ALL_TOOLS, CanaryTarget, RevisionTarget, RouteSnapshot, ServingLimits, ShadowTarget


def successor(current: RouteSnapshot, *, by: str, now: datetime, **changes: Any) -> RouteSnapshot:
    """``current`` with ``changes`` applied, at the next generation, re-validated from scratch.

    ``model_copy(update=...)`` would skip validation; a route is what production traffic touches,
    so the successor goes through the same checks as a snapshot read from the store. A decision's
    attestation belongs to the one write that records the decision: the successor carries it only when
    ``changes`` names it again.
    """
    fields = current.model_dump()
    fields.update({"decision_attestation": None}, **changes, generation=current.generation + 1, created_by=by,
                  created_at=now)
    return RouteSnapshot.build(**fields)


def stable_domains(snapshot: RouteSnapshot) -> dict[str, str]:
    """The snapshot's failure domains of stable's endpoints only: what stays when candidate and shadow leave."""
    return {url: domain for url, domain in snapshot.failure_domains.items() if url in snapshot.stable.endpoints}


def domains_of(endpoints: Iterable[str], domains: Mapping[str, str]) -> dict[str, str]:
    """``domains`` (endpoint: failure domain) for ``endpoints`` alone."""
    return {url: domains[url] for url in endpoints if url in domains}


def as_target(target: RevisionTarget) -> dict[str, Any]:
    """The plain revision-and-endpoints part of any target (with its limits), for building another kind of target."""
    return {"fingerprint": target.fingerprint, "endpoints": target.endpoints, "served_model": target.served_model,
            "limits": target.limits}


def serving_limits(interface: InterfacePolicy) -> ServingLimits:
    """What the router enforces of a revision's interface policy."""
    return ServingLimits(max_output_tokens=interface.max_output_tokens, request_timeout_ms=interface.request_timeout_ms,
                         max_retries=interface.max_retries, side_effecting_tools=interface.side_effecting_tools)


def canary(target: RevisionTarget, weight_ppm: int, now: datetime, lease_seconds: int) -> CanaryTarget:
    """``target`` taking ``weight_ppm`` of new requests, leased for ``lease_seconds`` from ``now``."""
    lease = now + timedelta(seconds=lease_seconds)
    return CanaryTarget.build(**as_target(target), weight_ppm=weight_ppm, lease_expires_at=lease)


def mirror(target: RevisionTarget, sample_ppm: int, now: datetime, lease_seconds: int) -> ShadowTarget:
    """``target`` receiving a ``sample_ppm`` mirror of traffic, leased for ``lease_seconds``."""
    lease = now + timedelta(seconds=lease_seconds)
    # The revision's own list of side-effecting tools, when it names one: requests calling any other tool
    # may then be mirrored. With none named, no request that declares tools is (it may have effects).
    named = target.limits.side_effecting_tools if target.limits is not None else ()
    return ShadowTarget.build(**as_target(target), sample_ppm=sample_ppm, lease_expires_at=lease,
                              side_effecting_tools=named or (ALL_TOOLS,))


def same_traffic(a: RouteSnapshot, b: RouteSnapshot) -> bool:
    """Whether two snapshots route traffic identically (ignoring generation, author, time, leases, attestation)."""
    ignore = {"generation", "created_by", "created_at", "decision_attestation"}

    def shape(snapshot: RouteSnapshot) -> dict[str, Any]:
        data = snapshot.model_dump(exclude=ignore)
        for key in ("candidate", "shadow"):
            if data[key] is not None:
                data[key].pop("lease_expires_at")
        return data

    return shape(a) == shape(b)
