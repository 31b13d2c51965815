"""Route-change planning: the snapshot a rollout state asks for, as a compare-and-swap successor."""

from __future__ import annotations

from datetime import datetime

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import as_target, canary, mirror, same_traffic, successor
from revgate.promotion.machine import RolloutState


def desired_route(
    current: RouteSnapshot,
    state: RolloutState,
    candidate: RevisionTarget,
    *,
    lease_seconds: int,
    by: str,
    now: datetime,
    attestation: str | None = None,
) -> RouteSnapshot | None:
    """The next snapshot for ``state``, or None when the committed route already routes that way.

    Leases are renewed by :func:`renew_leases`, not here, so a no-op step writes nothing. A decision
    (promoted, rolled back) writes its ``attestation`` (the signed release decision's digest) into the
    route's history even when the traffic is already so.
    """
    if state.status == "promoted":
        # The old stable's endpoints leave the route, and with them their failure domains.
        domains = {url: dom for url, dom in current.failure_domains.items() if url in candidate.endpoints}
        proposed = successor(
            current, by=by, now=now, stable=as_target(candidate), candidate=None, shadow=None, failure_domains=domains,
            decision_attestation=attestation,
        )
    elif state.status == "rolled_back":
        proposed = successor(current, by=by, now=now, candidate=None, shadow=None, decision_attestation=attestation)
    else:
        weighted = canary(candidate, state.weight_ppm, now, lease_seconds) if state.weight_ppm else None
        mirrored = mirror(candidate, state.shadow_ppm, now, lease_seconds) if state.shadow_ppm else None
        proposed = successor(current, by=by, now=now, candidate=weighted, shadow=mirrored)
    return None if same_traffic(current, proposed) and proposed.decision_attestation is None else proposed


def renew_leases(current: RouteSnapshot, *, lease_seconds: int, by: str, now: datetime) -> RouteSnapshot:
    """The same traffic with the candidate and shadow leases extended (the controller's heartbeat)."""
    weighted = current.candidate and canary(current.candidate, current.candidate.weight_ppm, now, lease_seconds)
    mirrored = current.shadow and mirror(current.shadow, current.shadow.sample_ppm, now, lease_seconds)
    return successor(current, by=by, now=now, candidate=weighted, shadow=mirrored)
