"""The reaper's rule: what nothing holds any more, past the grace period (the real agent: test_rollout_faults)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from manifests.route import RevisionTarget, RouteSnapshot
from manifests.route_change import canary, successor
from rollback.reap import reapable

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002/",))
W = "http://127.0.0.1:8700"


def view(replica_id: str, endpoint: str, *, age_s: float = 3600, state: str = "ready") -> dict[str, object]:
    return {"replica_id": replica_id, "revision": "sha256:" + "9" * 64, "state": state, "endpoint": endpoint,
            "created_at": (NOW - timedelta(seconds=age_s)).timestamp()}


def route(lease_ends: datetime | None = None) -> RouteSnapshot:
    first = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    if lease_ends is None:
        return first
    return successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, lease_ends, 0))


def reaped(views: list[dict[str, object]], lease_ends: datetime | None = None, grace_s: float = 600) -> list[str]:
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
    unknown_age = view("old-agent", "http://127.0.0.1:8011")
    unknown_age["created_at"] = 0.0
    assert reaped([unknown_age]) == []
