"""Pure parts of a rollout that stays safe while others act: route ownership, capacity rule, window verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from revgate.manifests.rollout import RolloutPlan, SetWeight
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, mirror, successor
from revgate.promotion.capacity import (
    RevisionCapacity,
    check_capacity,
    observed_demand,
    required_replicas,
    revisions_from_report,
    route_endpoints,
    stated_capacity,
)
from revgate.promotion.fleet import merge_capacity
from revgate.promotion.machine import StepApplied, TransitionRefused, advance, commit_refused, start
from revgate.promotion.ownership import decision_of, drainable, lapsed_lease, lease_end, takeover
from revgate.rollback.plan import revert_to, rollback_snapshot

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))
FIRST = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)


def test_only_the_rollouts_own_generation_is_its_route() -> None:
    mine = successor(FIRST, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 60))
    assert takeover(mine, owned_generation=2) is None
    operator = rollback_snapshot([FIRST, mine], by="oncall", now=NOW)
    taken = takeover(operator, owned_generation=2)
    assert taken is not None and taken.reason == "aborted by oncall at generation 3"
    # A heartbeat's own renewal is the rollout's write: it moves the owned generation, nobody else's does.
    assert takeover(None, owned_generation=2) is not None


def test_the_decision_is_what_the_route_says() -> None:
    promoted = successor(FIRST, by="flow", now=NOW, stable=CANDIDATE)
    assert decision_of(promoted, CANDIDATE.fingerprint) == "promoted"
    assert decision_of(FIRST, CANDIDATE.fingerprint) == "rolled_back"


def test_drain_only_what_no_router_may_send_to() -> None:
    leased = successor(FIRST, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 60))
    urls = [*STABLE.endpoints, *CANDIDATE.endpoints]
    assert drainable([leased], urls, NOW) == []  # stable always routed, candidate inside its lease
    assert drainable([leased], urls, NOW + timedelta(seconds=61)) == list(CANDIDATE.endpoints)
    assert lease_end(leased, CANDIDATE.endpoints) == NOW + timedelta(seconds=60)
    assert lease_end(leased, STABLE.endpoints) is None


def test_a_lease_that_ran_out_before_its_renewal_ends_the_rollout_instead_of_serving_it_again() -> None:
    other = RevisionTarget(fingerprint="sha256:" + "3" * 64, endpoints=("http://127.0.0.1:8003",))
    leased = successor(FIRST, by="flow", now=NOW, candidate=canary(CANDIDATE, 500_000, NOW, 20),
                       shadow=mirror(other, 100_000, NOW, 30))
    assert lapsed_lease(leased, NOW + timedelta(seconds=19)) is None  # renewed in time: the rollout holds it
    why = lapsed_lease(leased, NOW + timedelta(seconds=23))
    assert why is not None and why.startswith("the candidate's lease ran out at 2026-11-29T10:00:20+00:00 (3.0 s")
    assert "sent its traffic to stable" in why
    shadow_only = successor(FIRST, by="flow", now=NOW, shadow=mirror(CANDIDATE, 100_000, NOW, 30))
    assert (lapsed_lease(shadow_only, NOW + timedelta(seconds=31)) or "").startswith("the shadow's lease ran out")
    assert lapsed_lease(FIRST, NOW + timedelta(days=1)) is None  # stable alone holds no lease


def test_a_retired_stable_that_another_route_still_names_is_not_drained() -> None:
    promoted = successor(FIRST, by="flow", now=NOW, stable=CANDIDATE)
    sharing = FIRST.model_copy(update={"route": "other"})  # another route on the same stable replica
    assert drainable([promoted], STABLE.endpoints, NOW) == list(STABLE.endpoints)
    assert drainable([promoted, sharing], STABLE.endpoints, NOW) == []
    assert drainable([promoted, sharing], [STABLE.endpoints[0] + "/"], NOW) == []  # a trailing slash is the same


def test_revert_returns_the_old_stable_alone() -> None:
    promoted = successor(FIRST, by="flow", now=NOW, stable=CANDIDATE)
    reverted = revert_to(promoted, FIRST, by="flow", now=NOW)
    assert reverted.generation == 3 and reverted.stable == STABLE and reverted.candidate is None


@pytest.mark.parametrize(("demand", "share", "per_replica", "utilisation", "needed"), [
    (0.0, 0.5, 10.0, 0.8, 1),  # a share always needs one ready replica
    (16.0, 0.5, 10.0, 0.8, 1),  # 8 req/s on 8 usable per replica
    (16.1, 0.5, 10.0, 0.8, 2),
    (100.0, 0.99, 10.0, 0.8, 13),
    (5.0, 0.0, 10.0, 0.8, 0),  # no share, nothing needed
])
def test_required_replicas(demand: float, share: float, per_replica: float, utilisation: float, needed: int) -> None:
    assert required_replicas(demand, share, per_replica, utilisation) == needed


def test_capacity_check_names_the_short_revision_with_its_inputs() -> None:
    s, c = STABLE.fingerprint, CANDIDATE.fingerprint
    revisions = {s: RevisionCapacity(ready_replicas=1, requests_per_s=10.0), c: RevisionCapacity(1, 10.0)}
    ok = check_capacity({s: 0.5, c: 0.5}, revisions, demand_rps=12.0, target_utilisation=0.8)
    assert ok.ok
    short = check_capacity({s: 0.9, c: 0.1}, revisions, demand_rps=12.0, target_utilisation=0.8)
    assert not short.ok and short.reason.startswith(s[:19]) and "needs 2" in short.reason
    evidence = short.evidence()
    assert evidence["demand_rps"] == 12.0 and evidence["revisions"][0]["ready_replicas"] == 1
    # Nothing ready (loading, warming and draining replicas are not in ready_replicas) never passes.
    assert not check_capacity({c: 0.01}, {}, demand_rps=0.0, target_utilisation=0.8).ok
    # Ready but never measured, with real demand: not known to suffice.
    assert not check_capacity({c: 0.5}, {c: RevisionCapacity(1, 0.0)}, demand_rps=1.0, target_utilisation=0.8).ok


def test_observed_demand_counts_the_window_only() -> None:
    assert observed_demand([95.0, 99.0, 100.0, 70.0, 101.0], now=100.0, window_s=10.0) == pytest.approx(0.3)


def test_a_plan_stated_capacity_decides_whatever_the_warm_up_measured() -> None:
    # one stable replica whose warm-up measured 21 requests/s on a quiet host, or 4 on a busy one
    for measured in (21.0, 4.0):
        ready = stated_capacity({"stable": RevisionCapacity(1, measured)}, 0.1)
        check = check_capacity({"stable": 1.0}, ready, demand_rps=3.0, target_utilisation=0.8)
        assert not check.ok and ready["stable"].per_replica_rps == 0.1
    two = stated_capacity({"stable": RevisionCapacity(2, 9.0)}, 2.0)
    assert check_capacity({"stable": 1.0}, two, demand_rps=3.0, target_utilisation=0.8).ok


def test_only_replicas_the_route_sends_to_count_as_its_capacity() -> None:
    # Two agents' reports: stable's replica on the route, an orphan of stable (started by a rollout that died),
    # another route's replica of the same revision, and the rollout's own candidate replica.
    def entry(*endpoints: str) -> dict[str, object]:
        return {"ready_replicas": len(endpoints), "requests_per_s": 10.0 * len(endpoints),
                "ready_endpoints": dict.fromkeys(endpoints, 10.0)}

    reports = [
        {"revisions": {STABLE.fingerprint: entry("http://127.0.0.1:8001", "http://127.0.0.1:8009")}},
        {"revisions": {STABLE.fingerprint: entry("http://10.0.0.7:8001"),
                       CANDIDATE.fingerprint: entry("http://127.0.0.1:8002")}},
    ]
    counted = route_endpoints((STABLE.fingerprint, STABLE.endpoints),
                              (CANDIDATE.fingerprint, ("http://127.0.0.1:8002/",)))
    ready = merge_capacity([revisions_from_report(report, counted) for report in reports])
    assert ready[STABLE.fingerprint] == RevisionCapacity(1, 10.0)  # summed over agents, it said 3 ready
    assert ready[CANDIDATE.fingerprint] == RevisionCapacity(1, 10.0)
    check = check_capacity({STABLE.fingerprint: 1.0}, ready, demand_rps=20.0, target_utilisation=0.8)
    assert not check.ok and "has 1 ready, needs 3" in check.reason
    unscoped = merge_capacity([revisions_from_report(report) for report in reports])
    assert check_capacity({STABLE.fingerprint: 1.0}, unscoped, demand_rps=20.0, target_utilisation=0.8).ok


def test_a_promotion_short_of_capacity_at_its_commit_is_rolled_back_with_the_reason() -> None:
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)])
    promoted = advance(plan, start(plan), StepApplied())
    assert promoted.status == "promoted"
    refused = commit_refused(promoted, "the candidate's replicas cannot carry all the traffic")
    assert (refused.status, refused.weight_ppm) == ("rolled_back", 0)
    assert "cannot carry all the traffic" in refused.reason
    with pytest.raises(TransitionRefused):
        commit_refused(start(plan), "not a promotion")
