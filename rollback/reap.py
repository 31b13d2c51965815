"""Which replicas nothing holds any more: the reaper's rule. Pure; ``revgate gc`` reads and drains.

A replica is held while a route snapshot names it as stable, while a candidate or shadow lease
naming it runs (and for the grace period after it ran out: the router's poll, a slow controller),
and, named nowhere, for the grace period after its start (a rollout may be loading it). Anything
else is left over: a killed controller's candidate, the old stable of a window whose controller
died, the replicas of a failed partial start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from manifests.route import RouteSnapshot

GONE = frozenset({"draining", "terminated", "failed"})  # nothing to reap: on its way out, or out


@dataclass(frozen=True, slots=True)
class Reap:
    """One replica to drain, and why."""

    worker: str
    replica_id: str
    revision: str
    endpoint: str
    reason: str

    def line(self) -> str:
        """One line for a terminal."""
        return f"reap {self.replica_id} on {self.worker} ({self.revision.removeprefix('sha256:')[:12]}): {self.reason}"

    def record(self) -> dict[str, str]:
        """The reap as JSON."""
        return {"worker": self.worker, "replica_id": self.replica_id, "revision": self.revision,
                "endpoint": self.endpoint, "reason": self.reason}


def _holds(routes: Iterable[RouteSnapshot]) -> tuple[dict[str, str], dict[str, tuple[datetime, str]]]:
    """Endpoint -> the route serving it as stable; endpoint -> (latest lease end, route) of a candidate or shadow."""
    stable: dict[str, str] = {}
    leased: dict[str, tuple[datetime, str]] = {}
    for route in routes:
        stable.update((url.rstrip("/"), route.route) for url in route.stable.endpoints)
        for target in (t for t in (route.candidate, route.shadow) if t is not None):
            for url in target.endpoints:
                key = url.rstrip("/")
                if key not in leased or leased[key][0] < target.lease_expires_at:
                    leased[key] = (target.lease_expires_at, route.route)
    return stable, leased


def reapable(replicas: Mapping[str, Iterable[Mapping[str, Any]]], routes: Iterable[RouteSnapshot], *,
             now: datetime, grace_s: float) -> list[Reap]:
    """The replicas (worker URL -> its replica views) that no route holds, past the grace period."""
    stable, leased = _holds(routes)
    grace = timedelta(seconds=grace_s)
    found: list[Reap] = []
    for worker, views in replicas.items():
        for view in views:
            if str(view.get("state")) in GONE:
                continue
            endpoint = str(view.get("endpoint") or "").rstrip("/")
            reason = _left_over(endpoint, float(view.get("created_at") or 0.0), stable, leased, now=now, grace=grace)
            if reason:
                found.append(Reap(worker, str(view["replica_id"]), str(view.get("revision", "")), endpoint, reason))
    return found


def _left_over(endpoint: str, created_at: float, stable: Mapping[str, str],
               leased: Mapping[str, tuple[datetime, str]], *, now: datetime, grace: timedelta) -> str:
    """Why a replica is left over; empty while something holds it."""
    if endpoint and endpoint in stable:
        return ""
    if endpoint and endpoint in leased:
        ends, route = leased[endpoint]
        if now < ends + grace:
            return ""
        return (f"its candidate or shadow lease on route {route} ran out at {ends.isoformat(timespec='seconds')} "
                "and no later generation names it")
    if created_at <= 0:
        return ""  # an agent that does not say when it started the replica: its age is unknown, kept
    started = datetime.fromtimestamp(created_at, tz=now.tzinfo)
    if now < started + grace:
        return ""
    return f"no route names it, {int((now - started).total_seconds())} s after its start"
