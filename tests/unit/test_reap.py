"""The reaper's rule: what nothing holds any more, past the grace period (the real agent: test_rollout_faults)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.rollback.reap import reapable, retired

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002/",))
W = "http://127.0.0.1:8700"


@dataclass(frozen=True)
class Replica:
    """A replica as an agent reports it, reduced to what the rule reads."""

    replica_id: str
    endpoint: str
    created_at: float
    state: str = "ready"
    revision: str = "sha256:" + "9" * 64


def view(replica_id: str, endpoint: str, *, age_s: float = 3600, state: str = "ready") -> Replica:
    return Replica(replica_id, endpoint, (NOW - timedelta(seconds=age_s)).timestamp(), state)


def route(lease_ends: datetime | None = None) -> RouteSnapshot:
    first = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    if lease_ends is None:
        return first
    return successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, lease_ends, 0))


def reaped(views: list[Replica], lease_ends: datetime | None = None, grace_s: float = 600) -> list[str]:
    return [r.replica_id for r in reapable({W: views}, [route(lease_ends)], now=NOW, grace_s=grace_s)]


def test_stable_and_a_live_candidate_are_held_and_a_dead_controllers_candidate_is_reaped_after_the_grace() -> None:
    replicas = [view("stable", "http://127.0.0.1:8001"), view("candidate", "http://127.0.0.1:8002")]
    assert reaped(replicas, lease_ends=NOW + timedelta(seconds=30)) == []
    assert reaped(replicas, lease_ends=NOW - timedelta(seconds=60)) == []  # inside the grace after the lease
    assert reaped(replicas, lease_ends=NOW - timedelta(seconds=601)) == ["candidate"]
    [reap] = reapable({W: replicas}, [route(NOW - timedelta(seconds=601))], now=NOW, grace_s=600)
    assert "lease on route chat ran out" in reap.reason and reap.endpoint == "http://127.0.0.1:8002"


def test_a_replica_named_nowhere_is_kept_while_young_then_reaped_and_the_gone_are_left_alone() -> None:
    assert reaped([view("loading", "", age_s=30, state="loading")]) == []  # a rollout may be loading it
    assert reaped([view("orphan", "http://127.0.0.1:8009", age_s=601)]) == ["orphan"]
    assert reaped([view("draining", "http://127.0.0.1:8009", state="draining"),
                   view("done", "http://127.0.0.1:8010", state="terminated")]) == []
    unknown_age = replace(view("old-agent", "http://127.0.0.1:8011"), created_at=0.0)
    assert reaped([unknown_age]) == []


def test_a_promotions_old_stable_is_held_for_the_window_after_the_write_that_retired_it() -> None:
    first = route()
    promoted = successor(first, by="flow", now=NOW - timedelta(seconds=100), stable=CANDIDATE)
    renewed = successor(promoted, by="flow", now=NOW - timedelta(seconds=50))
    retired_at = retired([renewed, promoted, first], since=NOW - timedelta(hours=2))
    assert retired_at == {"http://127.0.0.1:8001": (promoted.created_at, "route chat's generation 2")}
    old = [view("old-stable", "http://127.0.0.1:8001")]
    kept = reapable({W: old}, [renewed], now=NOW, grace_s=60, hold_s=3600, retired_at=retired_at)
    assert kept == []  # inside the window: a rollback serves from it at once
    later = NOW + timedelta(seconds=3600 - 100 + 61)
    [reap] = reapable({W: old}, [renewed], now=later, grace_s=60, hold_s=3600, retired_at=retired_at)
    assert "rollback window's hold after route chat's generation 2 retired it as stable ran out" in reap.reason
    # Read newest first only back to `since`: a write older than that is not looked at.
    assert retired([renewed, promoted, first], since=NOW - timedelta(seconds=75)) == {}
