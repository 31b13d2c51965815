"""The capacity rule checked before every increase of candidate traffic.

Each revision's ready replicas must carry its share of the demand:
``ready >= ceil(demand x share / (per-replica capacity x target utilisation))``. Loading, warming
and draining replicas do not count (the worker reports them apart), nor do replicas the route
does not send to: only endpoints the route's snapshot or the rollout itself names are counted
(an orphan, or another route's replica of the same revision, carries none of this route's traffic).
Demand is what every router of the route recorded; per-replica capacity is what the plan states
(a profile measured at load) or else what the worker measured at warm-up. A revision with a share
needs at least one ready replica even when the demand is zero. Demand that could not be read is
not zero: the rule then fails, and says why.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

UNKNOWN_CAPACITY = 1 << 30  # "more than any worker has": a share without measured capacity never passes


@dataclass(frozen=True, slots=True)
class RevisionCapacity:
    """What the worker reports for one revision: ready replicas and their summed measured throughput."""

    ready_replicas: int
    requests_per_s: float

    @property
    def per_replica_rps(self) -> float:
        """Measured completions per second of one ready replica (0 when none is ready)."""
        return self.requests_per_s / self.ready_replicas if self.ready_replicas else 0.0


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One revision's share, what it needs and what it has."""

    fingerprint: str
    share: float
    ready_replicas: int
    per_replica_rps: float
    required_replicas: int

    @property
    def ok(self) -> bool:
        """Enough ready replicas for the share."""
        return self.ready_replicas >= self.required_replicas


@dataclass(frozen=True, slots=True)
class CapacityCheck:
    """The verdict with every input, for the evidence."""

    demand_rps: float
    target_utilisation: float
    rows: tuple[CapacityRow, ...]
    demand_unknown: str = ""  # why the demand could not be read ("" when it was)

    @property
    def ok(self) -> bool:
        """Every revision carries its share of a demand that is known."""
        return not self.demand_unknown and all(row.ok for row in self.rows)

    @property
    def reason(self) -> str:
        """Which revisions are short, in words."""
        if self.demand_unknown:
            return f"the route's demand is unknown: {self.demand_unknown}"
        short = [f"{row.fingerprint[:19]} has {row.ready_replicas} ready, needs {row.required_replicas} for "
                 f"{row.share:.0%} of {self.demand_rps:.1f} req/s" for row in self.rows if not row.ok]
        return "; ".join(short) or "every revision carries its share"

    def evidence(self) -> dict[str, Any]:
        """The inputs and the outcome as plain JSON."""
        return {"ok": self.ok, "reason": self.reason, "demand_rps": self.demand_rps,
                "demand_unknown": self.demand_unknown, "target_utilisation": self.target_utilisation,
                "revisions": [asdict(row) for row in self.rows]}


def required_replicas(demand_rps: float, share: float, per_replica_rps: float, target_utilisation: float) -> int:
    """Ready replicas a revision needs for ``share`` of ``demand_rps``; no share needs none."""
    if share <= 0:
        return 0
    if per_replica_rps <= 0:
        # Real demand and no measured capacity: no replica count is known to suffice.
        return 1 if demand_rps <= 0 else UNKNOWN_CAPACITY
    return max(1, math.ceil(demand_rps * share / (per_replica_rps * target_utilisation) - 1e-9))


def check_capacity(
    shares: Mapping[str, float],
    revisions: Mapping[str, RevisionCapacity],
    *,
    demand_rps: float,
    target_utilisation: float,
    demand_unknown: str = "",
) -> CapacityCheck:
    """The rule for every revision with a share; a revision the worker does not report has nothing ready."""
    rows = []
    for fingerprint, share in shares.items():
        have = revisions.get(fingerprint, RevisionCapacity(0, 0.0))
        need = required_replicas(demand_rps, share, have.per_replica_rps, target_utilisation)
        rows.append(CapacityRow(fingerprint, share, have.ready_replicas, have.per_replica_rps, need))
    return CapacityCheck(demand_rps, target_utilisation, tuple(rows), demand_unknown)


def stated_capacity(revisions: Mapping[str, RevisionCapacity], per_replica_rps: float) -> dict[str, RevisionCapacity]:
    """The same ready replicas, each carrying what the plan states instead of what its warm-up measured.

    A warm-up of a few requests measures the host's load as much as the replica: on a shared host the
    same replica measured 4 to 21 requests/s. A capacity profiled at load, stated in the plan, holds.
    """
    return {fingerprint: RevisionCapacity(have.ready_replicas, have.ready_replicas * per_replica_rps)
            for fingerprint, have in revisions.items()}


def observed_demand(arrivals: Iterable[float], now: float, window_s: float) -> float:
    """Requests per second that arrived in the last ``window_s`` seconds before ``now``."""
    return sum(1 for t in arrivals if now - window_s <= t <= now) / window_s


def revisions_from_report(report: Mapping[str, Any],
                          counted: Mapping[str, Collection[str]] | None = None) -> dict[str, RevisionCapacity]:
    """The worker's ``/v1/capacity`` answer as typed per-revision capacity.

    With ``counted`` (revision: the endpoints the route sends it to), only those ready replicas count,
    by the endpoint each one's ``ready_endpoints`` entry names; a revision not in ``counted`` has none.
    """
    found = {}
    for fingerprint, entry in report.get("revisions", {}).items():
        if counted is None:
            found[fingerprint] = RevisionCapacity(int(entry.get("ready_replicas", 0)),
                                                  float(entry.get("requests_per_s", 0.0)))
            continue
        named = set(counted.get(fingerprint, ()))
        mine = [float(rps) for endpoint, rps in dict(entry.get("ready_endpoints", {})).items()
                if endpoint.rstrip("/") in named]
        found[fingerprint] = RevisionCapacity(len(mine), sum(mine))
    return found


def route_endpoints(*targets: tuple[str, Iterable[str]]) -> dict[str, set[str]]:
    """Per revision, the endpoints whose replicas count for the route (``(fingerprint, endpoints)`` pairs)."""
    counted: dict[str, set[str]] = {}
    for fingerprint, endpoints in targets:
        counted.setdefault(fingerprint, set()).update(endpoint.rstrip("/") for endpoint in endpoints)
    return counted
