"""Route-change planning: the snapshot a rollout state asks for, as a compare-and-swap successor."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import (
    as_target,
    canary,
    domains_of,
    mirror,
    same_traffic,
    stable_domains,
    successor,
)
from revgate.promotion.machine import RolloutState


@dataclass(frozen=True, slots=True)
class RolloutKeys:
    """One rollout's secrets: the cohort salt's secret, and the credential its probes carry.

    The route store holds the cohort secret (every router must bucket alike) and only the digest of
    the probe credential; the credential itself stays with the flow, which sends it on its probes.
    """

    cohort_secret: str = field(repr=False)
    probe_credential: str = field(default="", repr=False)

    @classmethod
    def new(cls) -> RolloutKeys:
        """Fresh secrets for a rollout that starts now."""
        return cls(cohort_secret=secrets.token_hex(32), probe_credential=secrets.token_urlsafe(32))

    @property
    def probe_digest(self) -> str:
        """``sha256:<hex>`` of the probe credential, as routes name it ("" without one)."""
        if not self.probe_credential:
            return ""
        return "sha256:" + hashlib.sha256(self.probe_credential.encode()).hexdigest()


def desired_route(
    current: RouteSnapshot,
    state: RolloutState,
    candidate: RevisionTarget,
    *,
    lease_seconds: int,
    by: str,
    now: datetime,
    keys: RolloutKeys | None = None,
    attestation: str | None = None,
    domains: Mapping[str, str] | None = None,
) -> RouteSnapshot | None:
    """The next snapshot for ``state``, or None when the committed route already routes that way.

    Leases are renewed by :func:`renew_leases`, not here, so a no-op step writes nothing. While the
    rollout runs, its ``keys`` are the route's cohort secret and probe credential; its decision clears them.
    A decision (promoted, rolled back) writes its ``attestation`` (the signed release decision's digest)
    into the route's history even when the traffic is already so. ``domains`` names the failure domain
    (the worker agent) of each candidate endpoint: the routers retry on another domain first.
    """
    ended = {"cohort_secret": "", "probe_credential": ""}
    if state.status == "promoted":
        # The old stable's endpoints leave the route, and with them their failure domains.
        domains = {url: dom for url, dom in current.failure_domains.items() if url in candidate.endpoints}
        proposed = successor(
            current, by=by, now=now, stable=as_target(candidate), candidate=None, shadow=None, failure_domains=domains,
            decision_attestation=attestation, **ended,
        )
    elif state.status == "rolled_back":
        proposed = successor(current, by=by, now=now, candidate=None, shadow=None, decision_attestation=attestation,
                             failure_domains=stable_domains(current), **ended)
    else:
        weighted = canary(candidate, state.weight_ppm, now, lease_seconds) if state.weight_ppm else None
        mirrored = mirror(candidate, state.shadow_ppm, now, lease_seconds) if state.shadow_ppm else None
        running = ended if keys is None else {"cohort_secret": keys.cohort_secret,
                                              "probe_credential": keys.probe_digest}
        placed = domains_of(candidate.endpoints, domains or {}) if weighted or mirrored else {}
        proposed = successor(current, by=by, now=now, candidate=weighted, shadow=mirrored,
                             failure_domains={**stable_domains(current), **placed}, **running)
    return None if same_traffic(current, proposed) and proposed.decision_attestation is None else proposed


def as_evidence(snapshot: RouteSnapshot) -> RouteSnapshot:
    """The snapshot as the evidence ledger keeps it: the cohort secret replaced by its sha256.

    The secret decides each caller's arm; whoever can read the evidence (auditors, every MLflow user)
    must not be able to pick theirs. The digest still shows which generations shared one rollout's secret.
    """
    if not snapshot.cohort_secret:
        return snapshot
    return snapshot.model_copy(update={"cohort_secret": hashlib.sha256(snapshot.cohort_secret.encode()).hexdigest()})


def renew_leases(current: RouteSnapshot, *, lease_seconds: int, by: str, now: datetime) -> RouteSnapshot:
    """The same traffic with the candidate and shadow leases extended (the controller's heartbeat)."""
    weighted = current.candidate and canary(current.candidate, current.candidate.weight_ppm, now, lease_seconds)
    mirrored = current.shadow and mirror(current.shadow, current.shadow.sample_ppm, now, lease_seconds)
    return successor(current, by=by, now=now, candidate=weighted, shadow=mirrored)
