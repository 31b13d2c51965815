"""Which replicas nothing holds any more: the reaper's rule. Pure; ``revgate gc`` reads and drains.

A replica is held while a route snapshot names it as stable; while a candidate or shadow lease
naming it runs; as a promotion's old stable, for the rollback window after the write that stopped
naming it (the window keeps it ready for a fast rollback); and, named nowhere, after its start (a
rollout may be loading it). Each hold is followed by a grace period (the router's poll, a slow
controller). Anything else is left over: a killed controller's candidate, the old stable of a window
whose controller died, the replicas of a failed partial start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from revgate.manifests.route import RouteSnapshot

GONE = frozenset({"draining", "terminated", "failed"})  # nothing to reap: on its way out, or out

Holds = dict[str, tuple[datetime, str]]  # endpoint -> (the hold's end, what held it)


class ReplicaFacts(Protocol):
    """What the rule reads of a replica as its agent reports it (the worker's ``ReplicaView`` has these; the rule
    imports nothing of the data plane)."""

    @property
    def replica_id(self) -> str: ...

    @property
    def revision(self) -> str: ...

    @property
    def state(self) -> str: ...  # one of the worker's replica states

    @property
    def endpoint(self) -> str: ...  # empty before it is ready

    @property
    def created_at(self) -> float: ...  # when the agent started it (0: it does not say)


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


def _key(url: str) -> str:
    return url.rstrip("/")


def retired(newest_first: Iterable[RouteSnapshot], *, since: datetime) -> dict[str, tuple[datetime, str]]:
    """Endpoint -> (when, which write) stopped naming it as a route's stable, for writes since ``since``.

    Read newest first and only back to ``since``: a heartbeat adds a generation per renewal.
    """
    found: dict[str, tuple[datetime, str]] = {}
    later: RouteSnapshot | None = None
    for snap in newest_first:
        if later is not None:
            kept = {_key(url) for url in later.stable.endpoints}
            for url in (_key(u) for u in snap.stable.endpoints if _key(u) not in kept):
                found.setdefault(url, (later.created_at, f"route {later.route}'s generation {later.generation}"))
        if snap.created_at < since:
            break
        later = snap
    return found


def holds(routes: Iterable[RouteSnapshot], retired_at: Mapping[str, tuple[datetime, str]],
          hold: timedelta) -> tuple[set[str], Holds]:
    """The endpoints some route serves as stable, and the timed holds: leases, and retired stables' windows."""
    stable: set[str] = set()
    timed: Holds = {}

    def hold_until(url: str, ends: datetime, what: str) -> None:
        if url not in timed or timed[url][0] < ends:
            timed[url] = (ends, what)

    for route in routes:
        stable.update(_key(url) for url in route.stable.endpoints)
        for target in (t for t in (route.candidate, route.shadow) if t is not None):
            for url in target.endpoints:
                hold_until(_key(url), target.lease_expires_at, f"its candidate or shadow lease on route {route.route}")
    for url, (when, write) in retired_at.items():
        hold_until(url, when + hold, f"the rollback window's hold after {write} retired it as stable")
    return stable, timed


def reapable(replicas: Mapping[str, Iterable[ReplicaFacts]], routes: Iterable[RouteSnapshot], *,
             now: datetime, grace_s: float, hold_s: float = 0.0,
             retired_at: Mapping[str, tuple[datetime, str]] | None = None) -> list[Reap]:
    """The replicas (worker URL -> its replica views) that nothing holds, past the grace period.

    ``retired_at`` (from :func:`retired`): an old stable is held for ``hold_s`` (the rollback window)
    after the write that stopped naming it.
    """
    stable, timed = holds(routes, retired_at or {}, timedelta(seconds=hold_s))
    grace = timedelta(seconds=grace_s)
    found: list[Reap] = []
    for worker, views in replicas.items():
        for view in views:
            if view.state in GONE:
                continue
            endpoint = _key(view.endpoint)
            if endpoint and endpoint in stable:
                continue
            reason = _left_over(timed.get(endpoint) if endpoint else None, view.created_at, now=now, grace=grace)
            if reason:
                found.append(Reap(worker, view.replica_id, view.revision, endpoint, reason))
    return found


def _left_over(held: tuple[datetime, str] | None, created_at: float, *, now: datetime, grace: timedelta) -> str:
    """Why a replica no route serves as stable is left over; empty while something holds it."""
    if held is not None:
        ends, what = held
        return "" if now < ends + grace else f"{what} ran out at {ends.isoformat(timespec='seconds')}"
    if created_at <= 0:
        return ""  # an agent that does not say when it started the replica: its age is unknown, kept
    started = datetime.fromtimestamp(created_at, tz=now.tzinfo)
    if now < started + grace:
        return ""
    return f"no route names it, {int((now - started).total_seconds())} s after its start"
