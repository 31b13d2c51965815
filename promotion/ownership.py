"""Who owns the route: a rollout writes only on top of the generation it wrote itself.

A rollout owns its route from the generation it wrote to the next one it writes. Anyone else's
write (an operator's rollback, ``route set``, another tool) ends the rollout: it never writes the
route again. Pure functions over snapshots; the flow does the reading and writing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from revgate.manifests.route import RouteSnapshot

Decision = Literal["promoted", "rolled_back"]


@dataclass(frozen=True, slots=True)
class Takeover:
    """Another writer committed the route after the rollout's last write."""

    writer: str
    generation: int

    @property
    def reason(self) -> str:
        """The sentence recorded in the rollout's evidence."""
        return f"aborted by {self.writer} at generation {self.generation}"


def takeover(current: RouteSnapshot | None, owned_generation: int) -> Takeover | None:
    """The foreign write that ended the rollout, or None while the route is still at its own generation."""
    if current is None:
        return Takeover("(the route was removed)", 0)
    if current.generation == owned_generation:
        return None
    return Takeover(current.created_by, current.generation)


def decision_of(route: RouteSnapshot, candidate: str) -> Decision:
    """What the route says about a rollout: promoted only while the candidate is the stable revision."""
    return "promoted" if route.stable.fingerprint == candidate else "rolled_back"


def routed_endpoints(route: RouteSnapshot, now: datetime) -> frozenset[str]:
    """Endpoints the routers may send new requests to: stable, and candidate or shadow inside their lease."""
    routed = set(route.stable.endpoints)
    for target in (route.candidate, route.shadow):
        if target is not None and target.lease_expires_at > now:
            routed.update(target.endpoints)
    return frozenset(routed)


def drainable(routes: Iterable[RouteSnapshot], endpoints: Iterable[str], now: datetime) -> list[str]:
    """Of the endpoints a rollout started or retired, those no router of any of ``routes`` may send new
    requests to: a stable replica that several routes share stays up while another route names it."""
    routed = frozenset().union(*(routed_endpoints(route, now) for route in routes))
    return [url for url in endpoints if url.rstrip("/") not in routed]


def lease_end(route: RouteSnapshot, endpoints: Iterable[str]) -> datetime | None:
    """When the last lease that still names one of ``endpoints`` runs out (None: no lease names them)."""
    wanted = {url.rstrip("/") for url in endpoints}
    ends = [t.lease_expires_at for t in (route.candidate, route.shadow) if t is not None and wanted & set(t.endpoints)]
    return max(ends, default=None)


def lapsed_lease(route: RouteSnapshot, now: datetime) -> str | None:
    """Why the rollout no longer holds its traffic: a candidate or shadow lease that ran out before it was
    renewed (the controller could not reach the route store for a whole lease). Every router has sent that
    traffic to stable since, unwatched by the rollout's gates; renewing it would put an unwatched revision
    back in front of users, so the rollout ends instead. None while every lease is live."""
    for role, target in (("candidate", route.candidate), ("shadow", route.shadow)):
        if target is not None and target.lease_expires_at <= now:
            late = (now - target.lease_expires_at).total_seconds()
            return (f"the {role}'s lease ran out at {target.lease_expires_at.isoformat(timespec='seconds')} "
                    f"({late:.1f} s before it could be renewed: the route store was out of reach for a whole "
                    f"lease); the routers have sent its traffic to stable since")
    return None
