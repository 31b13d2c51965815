"""Route ownership through the real file route store and the real `revgate rollback` command.

The rollout writes only on top of the generation it wrote last; the heartbeat renews leases
through the same fence; an operator's rollback ends both, and neither writes the route again.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from revgate.flows.route_owner import Heartbeat, RolloutStopped, RouteOwner, RouteTakenOver
from revgate.flows.spec import PromotionSpec
from revgate.manifests.rollout import Bake, RolloutPlan, SetWeight
from revgate.manifests.route import RevisionTarget, RouteSnapshot, RouteStore
from revgate.manifests.route_change import canary, successor
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.engine import free_port
from tests.integration.commands import revgate
from tests.integration.rollout_estate import wait_until
from tests.integration.s3_proxy import cut_off_while, losing_answers
from tests.integration.test_flow_lock import spec as lock_spec

STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))


def fenced_spec(tmp_path: Path, route: str, plan: RolloutPlan) -> PromotionSpec:
    token = tmp_path / "token"
    token.write_text("t", encoding="utf-8")
    return lock_spec(tmp_path, route).model_copy(update={"plan": plan, "router_admin_token_file": str(token)})


def seeded(tmp_path: Path, route: str) -> RouteSnapshot:
    first = RouteSnapshot(route=route, generation=1, stable=STABLE, created_by="seed", created_at=datetime.now(UTC))
    open_route_store(str(tmp_path / "routes")).write(first)
    return first


def wait_for(condition: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def canary_behind(proxy: str, s3_endpoint: str, bucket: str, spec: PromotionSpec, lease_s: int,
                  ) -> tuple[RouteOwner, RouteStore]:
    """The spec's route seeded in ``bucket`` and its canary committed by a rollout that reaches the store
    through ``proxy``; the rollout's owner, and the store as the routers read it (directly)."""
    spec = spec.model_copy(update={"route_store": f"s3://{bucket}/prod?endpoint_url={proxy}"})
    direct = open_route_store(f"s3://{bucket}/prod?endpoint_url={s3_endpoint}")
    first = RouteSnapshot(route=spec.route, generation=1, stable=STABLE, created_by="seed",
                          created_at=datetime.now(UTC))
    direct.write(first)
    owner, now = RouteOwner(spec, first.generation), datetime.now(UTC)
    owner.commit(lambda current: successor(current, by="flow", now=now,
                                           candidate=canary(CANDIDATE, 500_000, now, lease_s)))
    return owner, direct


def test_heartbeat_renews_through_the_fence_and_an_operator_rollback_ends_it(tmp_path: Path) -> None:
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=100_000)], lease_seconds=10, lease_renew_seconds=1)
    spec = fenced_spec(tmp_path, "fenced", plan)
    store = open_route_store(spec.route_store)
    first = seeded(tmp_path, "fenced")
    owner = RouteOwner(spec, first.generation)
    now = datetime.now(UTC)
    owner.commit(lambda current: successor(current, by="flow", now=now, candidate=canary(CANDIDATE, 100_000, now, 10)))
    with Heartbeat(owner, lease_seconds=10, period_s=1, by="flow") as heartbeat:
        wait_for(lambda: heartbeat.renewals >= 2)
        renewed = store.read("fenced")
        assert renewed is not None and renewed.candidate is not None
        assert renewed.candidate.lease_expires_at > now  # the lease moved forward from the first write

        done = revgate("rollback", "--routes", spec.route_store, "--route", "fenced", "--created-by", "oncall")
        assert done.returncode == 0, done.stderr
        wait_for(owner.lost_event.is_set, timeout_s=10)
    history = store.history("fenced")
    operator = history[-1]
    assert operator.created_by == "oncall" and operator.candidate is None
    assert owner.lost is not None and owner.lost.reason == f"aborted by oncall at generation {operator.generation}"
    with pytest.raises(RouteTakenOver, match="aborted by oncall"):
        owner.commit(lambda current: successor(current, by="flow", now=datetime.now(UTC)))
    assert store.history("fenced")[-1] == operator  # never written again


def test_a_bake_ends_at_once_when_another_writer_takes_the_route(tmp_path: Path) -> None:
    from revgate.flows.promote import Promotion

    plan = RolloutPlan.build(steps=[Bake(seconds=600), SetWeight(weight_ppm=100_000)], lease_seconds=10,
                             lease_renew_seconds=1)
    spec = fenced_spec(tmp_path, "baking", plan)
    seeded(tmp_path, "baking")
    driver = Promotion(spec, None, None, CANDIDATE)  # type: ignore[arg-type]  # a bake touches no evidence
    store = open_route_store(spec.route_store)
    with Heartbeat(driver.owner, lease_seconds=10, period_s=1, by="flow"):
        current = store.read("baking")
        assert current is not None
        store.write(successor(current, by="someone with route set", now=datetime.now(UTC), request_timeout_ms=5000))
        started = time.monotonic()
        with pytest.raises(RouteTakenOver, match="aborted by someone with route set at generation 2"):
            driver.step_once()
        assert time.monotonic() - started < 30  # the 600 s bake did not run out
    assert [s.created_by for s in store.history("baking")] == ["seed", "someone with route set"]


def flow_beside_operator(probe: Any, operator: Any) -> float:
    """Run the flow ``probe`` while ``operator`` acts on it from a thread of its own; the seconds the flow took."""
    import contextvars

    thread = threading.Thread(target=contextvars.copy_context().run, args=(operator,))
    thread.start()
    started = time.monotonic()
    try:
        probe(return_state=True)
    finally:
        thread.join()
    return time.monotonic() - started


@pytest.mark.servers
@pytest.mark.timeout(300)
def test_a_bake_ends_at_once_when_the_flow_run_is_cancelled(prefect_api: str, tmp_path: Path) -> None:
    """Cancel in the Prefect UI: a run started in-process has no runner to kill it; the heartbeat asks."""

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelling

    from revgate.flows.promote import Promotion, run_cancelled
    from revgate.flows.route_owner import RolloutCancelled

    plan = RolloutPlan.build(steps=[Bake(seconds=600), SetWeight(weight_ppm=100_000)], lease_seconds=10,
                             lease_renew_seconds=1)
    spec = fenced_spec(tmp_path, "cancelled", plan)
    seeded(tmp_path, "cancelled")
    run_ids: list[str] = []
    outcome: list[str] = []

    @flow(name="cancel-probe")
    def probe() -> None:
        run_ids.append(str(flow_run.get_id()))
        driver = Promotion(spec, None, None, CANDIDATE)  # type: ignore[arg-type]  # a bake touches no evidence
        with Heartbeat(driver.owner, lease_seconds=10, period_s=1, by="flow", cancelled=run_cancelled()):
            try:
                driver.step_once()
            except RolloutCancelled as stopped:
                outcome.append(str(stopped))

    def operator() -> None:
        wait_for(lambda: run_ids, 60)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_ids[0], Cancelling(), force=True)

    assert flow_beside_operator(probe, operator) < 120  # not the bake's 600 s
    assert outcome and "was cancelled" in outcome[0]


@pytest.mark.servers
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", ["cancelled", "taken over"])
def test_an_approval_pause_ends_within_seconds_when_the_run_is_cancelled_or_the_route_taken_over(
    prefect_api: str, tmp_path: Path, stop: str
) -> None:
    # The defect: Prefect's pause blocks until it is answered or times out (an hour by default). A cancel in the
    # UI or another writer taking the route stopped the renewals, but the flow sat in its pause until the
    # timeout, its candidate's replicas running and its route lock held, and then took the timeout for a
    # rejection.

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelling

    from revgate.flows.promote import Promotion, run_cancelled
    from revgate.flows.route_owner import RolloutCancelled
    from revgate.manifests.rollout import Approve
    from tests.integration.test_flow_approval import wait_until_paused

    plan = RolloutPlan.build(steps=[Approve(prompt="Go on?"), SetWeight(weight_ppm=100_000)], lease_seconds=10,
                             lease_renew_seconds=1)
    route = "paused-" + stop.replace(" ", "-")
    spec = fenced_spec(tmp_path, route, plan).model_copy(update={"approval": "ui", "approval_timeout_s": 3600})
    seeded(tmp_path, route)
    store = open_route_store(spec.route_store)
    run_ids: list[str] = []
    outcome: list[BaseException] = []

    @flow(name="approval-stop-probe")
    def probe() -> None:
        run_ids.append(str(flow_run.get_id()))
        driver = Promotion(spec, None, None, CANDIDATE)  # type: ignore[arg-type]  # nothing is answered
        with Heartbeat(driver.owner, lease_seconds=10, period_s=1, by="flow", cancelled=run_cancelled(),
                       watch_every_s=1):
            try:
                driver.step_once()
            except (RolloutCancelled, RouteTakenOver) as stopped:
                outcome.append(stopped)

    def operator() -> None:
        run_id = wait_until_paused(run_ids)
        if stop == "cancelled":
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run_id, Cancelling(), force=True)
        else:
            current = store.read(route)
            assert current is not None
            store.write(successor(current, by="someone with route set", now=datetime.now(UTC),
                                  request_timeout_ms=5000))

    assert flow_beside_operator(probe, operator) < 150  # not the pause's hour
    expected = RolloutCancelled if stop == "cancelled" else RouteTakenOver
    assert outcome and isinstance(outcome[0], expected), outcome
    # Nor is Prefect's pause left polling the run in a thread for the rest of its hour.
    wait_until(lambda: not [thread for thread in threading.enumerate() if thread.name == "approval-pause"], 30,
               "the abandoned pause's thread ended")


def test_a_running_flow_never_undoes_an_operators_rollback(tmp_path: Path) -> None:
    """The issue's report: the flow committed its canary, then its promotion, on top of a rollback."""
    from revgate.flows.promote import Promotion
    from revgate.manifests.errors import RevgateError
    from revgate.registry.ledger import EvidenceLedger, sqlite_uri

    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=0)], lease_seconds=60)
    spec = fenced_spec(tmp_path, "undone", plan)
    store = open_route_store(spec.route_store)
    first = seeded(tmp_path, "undone")
    now = datetime.now(UTC)
    # The flow's canary is on the route (written by the flow), and the flow's driver is at that step.
    store.write(successor(first, by=spec.created_by, now=now, candidate=canary(CANDIDATE, 500_000, now, 60)))
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    driver = Promotion(spec, ledger, ledger.open_run("undone", CANDIDATE.fingerprint), CANDIDATE)

    done = revgate("rollback", "--routes", spec.route_store, "--route", "undone", "--created-by", "oncall")
    assert done.returncode == 0, done.stderr
    operator = store.history("undone")[-1]
    try:
        driver.run_plan()  # the rest of the plan: bake, then promotion
    except RevgateError as stopped:
        assert "aborted by oncall at generation 3" in str(stopped)
    assert store.history("undone")[-1] == operator  # the operator's rollback stands


def test_a_canary_after_a_full_shadow_is_an_increase_the_capacity_rule_checks(tmp_path: Path) -> None:
    from revgate.flows.promote import Promotion
    from revgate.manifests.rollout import Shadow
    from revgate.manifests.route_change import mirror
    from revgate.promotion.machine import StepApplied, advance, start

    plan = RolloutPlan.build(steps=[Shadow(sample_ppm=1_000_000), SetWeight(weight_ppm=500_000)], lease_seconds=60)
    spec = fenced_spec(tmp_path, "ladder", plan)
    first = seeded(tmp_path, "ladder")
    driver = Promotion(spec, None, None, CANDIDATE)  # type: ignore[arg-type]  # no evidence is written here
    now = datetime.now(UTC)
    shadowed = successor(first, by="flow", now=now, shadow=mirror(CANDIDATE, 1_000_000, now, 60))
    driver.state = advance(plan, start(plan), StepApplied())  # on to the 50% canary
    assert driver._raises_candidate_traffic(shadowed)  # 0% -> 50% of callers, though the mirror was at 100%
    at_weight = successor(shadowed, by="flow", now=now, shadow=None, candidate=canary(CANDIDATE, 500_000, now, 60))
    assert not driver._raises_candidate_traffic(at_weight)


@pytest.mark.parametrize("outage", ["refused", "hangs"])
def test_a_prefect_api_outage_never_stops_lease_renewal(tmp_path: Path, outage: str) -> None:
    # The defect: the heartbeat asked Prefect whether the run was cancelled before it renewed, in
    # one try: with the API down every beat raised and nothing was renewed (a hanging API held the
    # heartbeat for ever). The probe here is a real HTTP call to an API that refuses or never answers.
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=100_000)], lease_seconds=10, lease_renew_seconds=1)
    spec = fenced_spec(tmp_path, "outage", plan)
    store = open_route_store(spec.route_store)
    first = seeded(tmp_path, "outage")
    owner = RouteOwner(spec, first.generation)
    now = datetime.now(UTC)
    owner.commit(lambda current: successor(current, by="flow", now=now, candidate=canary(CANDIDATE, 100_000, now, 10)))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts, never answers
        port = silent.getsockname()[1] if outage == "hangs" else free_port()

        def cancelled() -> bool:
            # A read timeout far past the test: an API that never answers, as a hung Prefect server is.
            return httpx.get(f"http://127.0.0.1:{port}/api/flow_runs/x", timeout=600).status_code == 200

        with Heartbeat(owner, lease_seconds=10, period_s=1, by="flow", cancelled=cancelled) as heartbeat:
            wait_for(lambda: heartbeat.renewals >= 3, timeout_s=30)
    renewed = store.read("outage")
    assert renewed is not None and renewed.candidate is not None
    assert renewed.candidate.lease_expires_at > now + timedelta(seconds=10)


def test_a_rollback_wins_over_a_rollout_renewing_every_quarter_second_in_10_of_10_tries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: `revgate rollback` read the whole history and never retried a conflict while the
    # heartbeat added a generation per renewal: with short leases it could lose to a live rollout.
    # Here the real heartbeat renews four times a second (a 1 s lease's renewals, and faster).
    from revgate.cli.main import main

    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=100_000)], lease_seconds=10, lease_renew_seconds=1)
    took = []
    for attempt in range(10):
        route = f"race-{attempt}"
        spec = fenced_spec(tmp_path, route, plan)
        owner = RouteOwner(spec, seeded(tmp_path, route).generation)
        now = datetime.now(UTC)
        owner.commit(lambda current, now=now: successor(current, by="flow", now=now,
                                                        candidate=canary(CANDIDATE, 100_000, now, 10)))
        with Heartbeat(owner, lease_seconds=10, period_s=0.25, by="flow") as heartbeat:
            wait_for(lambda heartbeat=heartbeat: heartbeat.renewals >= 3)
            started = time.monotonic()
            assert main(["rollback", "--routes", spec.route_store, "--route", route, "--created-by", "oncall"]) == 0
            took.append(time.monotonic() - started)
            wait_for(owner.lost_event.is_set, timeout_s=10)
        current = open_route_store(spec.route_store).read(route)
        assert current is not None and current.created_by == "oncall" and current.candidate is None, attempt
    capsys.readouterr()
    print(f"rollback against a live heartbeat: 10 of 10 landed, slowest {max(took):.3f} s, "
          f"median {sorted(took)[5]:.3f} s")


def test_a_dead_candidate_is_seen_within_seconds_of_its_death_and_its_lease_is_never_renewed_after(
    tmp_path: Path,
) -> None:
    # The defect: the replica watch ran once per renewal (a third of the lease: 300 s by default), so a
    # candidate replica that died failed its share of requests for minutes; and a heartbeat whose watch had
    # stopped the rollout went on renewing the dead candidate's lease while the flow waited in an approval pause.
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=1800, lease_renew_seconds=600,
                             watch_every_seconds=1)
    spec = fenced_spec(tmp_path, "watched", plan)
    owner = RouteOwner(spec, seeded(tmp_path, "watched").generation)
    now = datetime.now(UTC)
    owner.commit(lambda current: successor(current, by="flow", now=now,
                                           candidate=canary(CANDIDATE, 500_000, now, 1800)))
    died, looks = threading.Event(), []

    def candidate_watch() -> str | None:
        looks.append(died.is_set())
        return "candidate replica r-1 on http://gpu-2: failed (ReplicaDied)" if died.is_set() else None

    with Heartbeat(owner, lease_seconds=plan.lease_seconds, period_s=plan.renew_every_s, by="flow",
                   watches=[candidate_watch], watch_every_s=plan.watch_every_s) as heartbeat:
        wait_for(lambda: len(looks) >= 2)  # watched twice while no renewal was due
        died.set()
        wait_for(lambda: bool(owner.fault))
        assert heartbeat.renewals == 0 and owner.fault.startswith("candidate replica r-1")
        held = open_route_store(spec.route_store).read("watched")
        heartbeat.beat()  # a renewal due now renews nothing for a rollout that a fault stopped
        assert heartbeat.renewals == 0 and open_route_store(spec.route_store).read("watched") == held


def test_a_controller_cut_from_its_store_past_the_lease_stops_the_rollout_and_never_serves_the_candidate_again(
    tmp_path: Path, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The defect: a controller that could not reach the route store for longer than the lease (a partition,
    # a store outage) renewed the candidate's lapsed lease once it could write again. The routers had sent its
    # traffic to stable meanwhile; the renewal put the candidate back in front of users with a gap no gate saw,
    # and the canary went on as though nothing had happened.
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    cut = threading.Event()
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=10, lease_renew_seconds=1)
    with cut_off_while(s3_endpoint, cut.is_set) as proxy:
        owner, direct = canary_behind(proxy, s3_endpoint, bucket, fenced_spec(tmp_path, "partition", plan), 3)
        with Heartbeat(owner, lease_seconds=3, period_s=0.5, by="flow") as heartbeat:
            wait_for(lambda: heartbeat.renewals >= 2)
            cut.set()
            held = direct.read("partition")
            assert held is not None and held.candidate is not None
            # The lease runs out while the controller cannot write: every router sends to stable from then on.
            wait_for(lambda: datetime.now(UTC) > held.candidate.lease_expires_at + timedelta(seconds=1))  # type: ignore[union-attr]
            before = direct.read("partition")
            cut.clear()  # the store is back
            wait_for(lambda: bool(owner.fault), timeout_s=30)
            renewals = heartbeat.renewals
            # Beats due now, with the store answering again, renew nothing: the rollout has stopped.
            for _ in range(3):
                heartbeat.beat()
            assert heartbeat.renewals == renewals
    after = direct.read("partition")
    assert after == before, "the lapsed candidate was renewed once the store was back"
    assert after.candidate is not None and after.candidate.lease_expires_at < datetime.now(UTC)
    assert owner.fault.startswith("the candidate's lease ran out at") and "sent its traffic to stable" in owner.fault
    with pytest.raises(RolloutStopped, match="lease ran out"):
        owner.stop_if_ended()  # the flow's next wait or step ends the rollout and routes back to stable
    # The outage reads as one event in the flow's log: one traceback, then a line per failed beat.
    failed = [r for r in caplog.records if r.getMessage().startswith("lease renewal failed")]
    assert failed and [r.exc_info is not None for r in failed] == [True] + [False] * (len(failed) - 1), [
        r.getMessage() for r in failed]


def test_a_renewal_that_landed_while_its_every_answer_was_lost_is_the_rollouts_own_not_a_takeover(
    tmp_path: Path, s3_endpoint: str
) -> None:
    # The defect: a renewal's write reached the store, but every attempt's answer was lost (a store that
    # stalls, a link that drops replies), so the call failed and the owner kept its older generation. At
    # the next beat it read its own write back as another writer's and ended the rollout as taken over.
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    losing, lost = threading.Event(), []

    def lose_history_puts(method: str, path: str) -> bool:
        if losing.is_set() and method == "PUT" and "/history/" in path:
            lost.append(path)
            return True
        return False

    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=30, lease_renew_seconds=1)
    with losing_answers(s3_endpoint, lose_history_puts) as proxy:
        owner, direct = canary_behind(proxy, s3_endpoint, bucket, fenced_spec(tmp_path, "stalled", plan), 30)
        with Heartbeat(owner, lease_seconds=30, period_s=0.25, by="flow") as heartbeat:
            wait_for(lambda: heartbeat.renewals >= 2)
            renewals = heartbeat.renewals
            losing.set()
            wait_for(lambda: heartbeat.failing >= 1)  # one renewal's every attempt went unanswered
            losing.clear()
            wait_for(lambda: heartbeat.renewals >= renewals + 3 or owner.lost is not None)
    assert len(lost) >= 2, lost  # a write retried, each attempt's answer lost
    assert owner.lost is None, f"the rollout took its own landed write for a takeover: {owner.lost}"
    newest = direct.read("stalled")
    assert newest is not None and newest.generation == owner.generation and newest.created_by == "flow"
    assert all(s.created_by == "flow" for s in direct.history("stalled")[1:])


def test_a_failed_write_that_never_landed_leaves_another_writers_generation_a_takeover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other side of taking back a write with no answer: only this rollout's own bytes are its own.
    spec = fenced_spec(tmp_path, "lost", RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)]))
    first = seeded(tmp_path, "lost")
    owner, now = RouteOwner(spec, first.generation), datetime.now(UTC)

    def unanswered(*_: object) -> None:
        raise ConnectionError("no answer from the route store")

    with monkeypatch.context() as patched:
        patched.setattr("revgate.flows.steps.commit_route", unanswered)  # the write never reached the store
        with pytest.raises(ConnectionError):
            owner.commit(lambda current: successor(current, by="flow", now=now,
                                                   candidate=canary(CANDIDATE, 500_000, now, 30)))
    open_route_store(spec.route_store).write(successor(first, by="oncall", now=now))  # generation 2: not ours
    with pytest.raises(RouteTakenOver, match="aborted by oncall at generation 2"):
        owner.check()
