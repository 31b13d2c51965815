"""The rollout state machine, route-change planning and rollback planning (pure logic)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from revgate.manifests import ManifestInvalid
from revgate.manifests.rollout import Analyze, Approve, Bake, RolloutPlan, SetWeight, Shadow, default_plan
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.promotion.machine import (
    Abort,
    ApprovalGiven,
    GateDecided,
    RolloutState,
    StepApplied,
    TransitionRefused,
    advance,
    current_step,
    resume,
    start,
)
from revgate.promotion.routes import desired_route, renew_leases
from revgate.rollback.plan import (
    NoLiveStable,
    NothingToRollBack,
    last_known_good,
    on_live_endpoints,
    plan_rollback,
    rollback_snapshot,
)

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))


def route(**changes: object) -> RouteSnapshot:
    fields: dict[str, object] = {
        "route": "chat",
        "generation": 1,
        "stable": STABLE,
        "created_by": "test",
        "created_at": NOW,
    }
    fields.update(changes)
    return RouteSnapshot.build(**fields)


def plan(on_inconclusive: str = "pause") -> RolloutPlan:
    steps = [Shadow(sample_ppm=100_000), Analyze(max_samples=100), Approve(), SetWeight(weight_ppm=50_000)]
    steps += [Bake(seconds=10), Analyze(max_samples=100)]
    return RolloutPlan.build(steps=steps, on_inconclusive=on_inconclusive)


def run_to_approval(p: RolloutPlan) -> RolloutState:
    state = advance(p, start(p), StepApplied())
    return advance(p, state, GateDecided("pass", report_digest="sha256:" + "a" * 64))


def test_plan_round_trips_and_refuses_falling_weights() -> None:
    assert RolloutPlan.from_json(default_plan().canonical()) == default_plan()
    with pytest.raises(ManifestInvalid, match="strictly increase"):
        RolloutPlan.build(steps=[SetWeight(weight_ppm=50_000), SetWeight(weight_ppm=10_000)])


def test_a_passing_rollout_walks_every_step_and_promotes() -> None:
    p = plan()
    state = start(p)
    assert state.shadow_ppm == 100_000 and state.weight_ppm == 0
    state = run_to_approval(p)
    assert state.status == "awaiting_approval"
    state = advance(p, state, ApprovalGiven(True, evidence_digest="sha256:" + "a" * 64, by="rm"))
    assert (state.weight_ppm, state.shadow_ppm) == (50_000, 0)
    state = advance(p, advance(p, state, StepApplied()), StepApplied())
    assert isinstance(current_step(p, state), Analyze)
    state = advance(p, state, GateDecided("pass", report_digest="sha256:" + "b" * 64))
    assert state.status == "promoted"


def test_a_failed_gate_rolls_back_at_once() -> None:
    p = plan()
    state = advance(p, start(p), StepApplied())
    state = advance(p, state, GateDecided("fail", report_digest="sha256:" + "c" * 64, reason="add/long worse"))
    assert (state.status, state.weight_ppm, state.shadow_ppm) == ("rolled_back", 0, 0)
    assert "add/long" in state.reason
    assert advance(p, state, StepApplied()) == state  # terminal states absorb events


def test_inconclusive_keeps_collecting_then_pauses_or_fails_by_policy() -> None:
    for policy, expected in (("pause", "paused"), ("fail", "rolled_back")):
        p = plan(policy)
        state = advance(p, start(p), StepApplied())
        held = advance(p, state, GateDecided("inconclusive", report_digest="sha256:" + "d" * 64))
        assert held.status == "running" and held.step_index == state.step_index
        limit = GateDecided("inconclusive", report_digest="sha256:" + "d" * 64, at_limit=True)
        assert advance(p, held, limit).status == expected
    paused = advance(plan("pause"), held, limit)
    assert resume(plan("pause"), paused, proceed=False, by="rm").status == "rolled_back"
    assert resume(plan("pause"), paused, proceed=True).status == "awaiting_approval"


def test_approval_binds_to_the_evidence_it_was_shown() -> None:
    p = plan()
    state = run_to_approval(p)
    with pytest.raises(TransitionRefused, match="evidence"):
        advance(p, state, ApprovalGiven(True, evidence_digest="sha256:" + "f" * 64))
    assert advance(p, state, ApprovalGiven(False, evidence_digest="", by="rm")).status == "rolled_back"


def test_events_that_do_not_fit_the_step_are_refused() -> None:
    p = plan()
    with pytest.raises(TransitionRefused):
        advance(p, start(p), GateDecided("pass", report_digest=""))
    assert advance(p, start(p), Abort("operator")).status == "rolled_back"


def test_desired_route_follows_the_state_and_writes_nothing_when_unchanged() -> None:
    p = plan()
    shadowing = desired_route(route(), start(p), CANDIDATE, lease_seconds=60, by="flow", now=NOW)
    assert shadowing is not None and shadowing.generation == 2
    assert shadowing.shadow is not None and shadowing.shadow.sample_ppm == 100_000
    assert shadowing.shadow.lease_expires_at == NOW + timedelta(seconds=60)
    assert desired_route(shadowing, start(p), CANDIDATE, lease_seconds=60, by="flow", now=NOW) is None
    promoted = RolloutState(status="promoted")
    final = desired_route(shadowing, promoted, CANDIDATE, lease_seconds=60, by="flow", now=NOW)
    assert final is not None and final.stable.fingerprint == CANDIDATE.fingerprint
    assert final.candidate is None and final.shadow is None and final.generation == 3


def test_renewing_leases_keeps_traffic_and_moves_expiry() -> None:
    canary_route = desired_route(route(), RolloutState(weight_ppm=10_000), CANDIDATE, lease_seconds=60, by="f", now=NOW)
    assert canary_route is not None
    later = NOW + timedelta(seconds=30)
    renewed = renew_leases(canary_route, lease_seconds=60, by="f", now=later)
    assert renewed.candidate is not None and renewed.candidate.weight_ppm == 10_000
    assert renewed.candidate.lease_expires_at == later + timedelta(seconds=60)


def test_rollback_aborts_a_canary_first_then_reverts_a_promotion() -> None:
    first = route()
    canary_route = desired_route(first, RolloutState(weight_ppm=10_000), CANDIDATE, lease_seconds=60, by="f", now=NOW)
    assert canary_route is not None
    aborted = rollback_snapshot([first, canary_route], by="ops", now=NOW)
    assert aborted.candidate is None and aborted.stable == STABLE and aborted.generation == 3
    done = RolloutState(status="promoted")
    promoted = desired_route(canary_route, done, CANDIDATE, lease_seconds=60, by="f", now=NOW)
    assert promoted is not None
    history = [first, canary_route, promoted]
    assert last_known_good(history) == canary_route
    reverted = rollback_snapshot(history, by="ops", now=NOW)
    assert reverted.stable.fingerprint == STABLE.fingerprint and reverted.generation == promoted.generation + 1


def test_rollback_with_nothing_earlier_says_so() -> None:
    with pytest.raises(NothingToRollBack, match="only ever served one revision"):
        rollback_snapshot([route()], by="ops", now=NOW)
    with pytest.raises(NothingToRollBack, match="no snapshots"):
        rollback_snapshot([], by="ops", now=NOW)


def test_plan_renews_leases_inside_the_lease() -> None:
    assert default_plan().renew_every_s == default_plan().lease_seconds // 3
    assert RolloutPlan.build(steps=[Bake(seconds=1)], lease_seconds=12, lease_renew_seconds=3).renew_every_s == 3
    with pytest.raises(ManifestInvalid, match="at most half of lease_seconds"):
        RolloutPlan.build(steps=[Bake(seconds=1)], lease_seconds=10, lease_renew_seconds=6)



def test_the_heartbeat_watches_every_few_seconds_apart_from_renewal_and_never_less_often() -> None:
    assert default_plan().watch_every_s == 5 < default_plan().renew_every_s  # 300 s renewals, 5 s watches
    fast = RolloutPlan.build(steps=[Bake(seconds=1)], lease_seconds=10, lease_renew_seconds=1)
    assert fast.watch_every_s == 1  # at least once a renewal


def test_a_rollback_plan_reads_the_history_only_as_far_as_it_needs() -> None:
    first = route()
    canary_route = desired_route(first, RolloutState(weight_ppm=10_000), CANDIDATE, lease_seconds=60, by="f", now=NOW)
    assert canary_route is not None
    renewals = [canary_route]
    for _ in range(50):  # a heartbeat's renewals: one generation each, the same stable
        renewals.append(desired_route(renewals[-1], RolloutState(weight_ppm=10_000), CANDIDATE, lease_seconds=60,
                                      by="f", now=NOW + timedelta(seconds=len(renewals))) or renewals[-1])
    read: list[int] = []

    def newest_first(history: list[RouteSnapshot]) -> Iterator[RouteSnapshot]:
        for snapshot in reversed(history):
            read.append(snapshot.generation)
            yield snapshot

    aborted = plan_rollback(newest_first([first, *renewals]), by="ops", now=NOW)
    assert aborted.candidate is None and len(read) == 1  # aborting a canary reads the current generation only
    promoted = desired_route(renewals[-1], RolloutState(status="promoted"), CANDIDATE, lease_seconds=60, by="f",
                             now=NOW)
    assert promoted is not None
    read.clear()
    reverted = plan_rollback(newest_first([first, *renewals, promoted]), by="ops", now=NOW)
    assert reverted.stable.fingerprint == STABLE.fingerprint and len(read) == 2  # back to the last other stable


def test_a_rollback_lands_on_the_live_endpoints_of_its_stable_or_is_refused() -> None:
    two = route().model_copy(update={"stable": STABLE.model_copy(
        update={"endpoints": ("http://127.0.0.1:1", "http://127.0.0.1:2")})})
    assert on_live_endpoints(two, ["http://127.0.0.1:2"]).stable.endpoints == ("http://127.0.0.1:2",)
    assert on_live_endpoints(two, two.stable.endpoints) is two
    with pytest.raises(NoLiveStable, match="would land on nothing"):
        on_live_endpoints(two, [])


def test_each_candidate_endpoint_names_its_failure_domain_while_it_serves_and_leaves_with_it() -> None:
    spread = RevisionTarget(fingerprint=CANDIDATE.fingerprint, endpoints=("http://10.0.0.1:8002", "http://10.0.0.2:8002"))
    domains = {"http://10.0.0.1:8002": "gpu-1", "http://10.0.0.2:8002": "gpu-2", "http://10.9.9.9:1": "elsewhere"}
    first = route(failure_domains={"http://127.0.0.1:8001": "cpu-1"})
    canary_route = desired_route(first, RolloutState(weight_ppm=500_000), spread, lease_seconds=60, by="f", now=NOW,
                                 domains=domains)
    assert canary_route is not None
    assert canary_route.failure_domains == {"http://127.0.0.1:8001": "cpu-1", "http://10.0.0.1:8002": "gpu-1",
                                            "http://10.0.0.2:8002": "gpu-2"}  # only the route's own endpoints
    back = desired_route(canary_route, RolloutState(status="rolled_back"), spread, lease_seconds=60, by="f", now=NOW)
    assert back is not None and back.failure_domains == {"http://127.0.0.1:8001": "cpu-1"}
    promoted = desired_route(canary_route, RolloutState(status="promoted"), spread, lease_seconds=60, by="f", now=NOW)
    assert promoted is not None and promoted.failure_domains == {"http://10.0.0.1:8002": "gpu-1",
                                                                 "http://10.0.0.2:8002": "gpu-2"}
    # An operator's rollback of the canary drops the candidate's domains with its endpoints (it was refused
    # as a snapshot naming endpoints it does not route to).
    assert rollback_snapshot([first, canary_route], by="oncall", now=NOW).failure_domains == {
        "http://127.0.0.1:8001": "cpu-1"}


def test_the_evidence_copy_of_a_route_keeps_no_cohort_secret_only_its_digest() -> None:
    import hashlib

    from revgate.promotion.routes import RolloutKeys, as_evidence

    keys = RolloutKeys.new()
    state = advance(default_plan(), start(default_plan()), StepApplied())
    live = desired_route(route(), state, CANDIDATE, lease_seconds=60, by="flow", now=NOW, keys=keys)
    assert live is not None and live.cohort_secret == keys.cohort_secret
    kept = as_evidence(live)
    assert keys.cohort_secret not in kept.canonical().decode()
    assert kept.cohort_secret == hashlib.sha256(keys.cohort_secret.encode()).hexdigest()
    assert kept.model_copy(update={"cohort_secret": live.cohort_secret}) == live  # nothing else changed
    assert as_evidence(route()) == route()  # outside a rollout there is nothing to hide
