"""A whole rollout asked for by name and run by a Prefect worker: ``revgate promote ROUTE CANDIDATE``
submits a run of the promote-revision deployment, the worker's run reads the site configuration,
loads the candidate on a worker agent running vLLM on the CPU, moves half the traffic through a
router, pauses for a release manager's approval (the command points at the form), bakes, and
promotes; users' traffic flows through the router the whole time. And two routes, each with its own
router and stable replica, rolled out at the same time by one worker; a stable replica that another
route of the store still names is not drained by the promotion that retires it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from revgate.flows.site import ROUTE_ONLY, RouteSite
from revgate.flows.steps import start_replica
from revgate.manifests.rollout import Approve, Bake, RolloutPlan, SetWeight
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import successor
from revgate.serving.worker.request import ReplicaRequest
from tests.integration.rollout_estate import WARM, Estate, Rollout, estate, rollout, wait_until
from tests.integration.test_deployments import ROOT, deployed, revgate_env, run_span

pytestmark = [pytest.mark.engine, pytest.mark.servers]

PAUSED = re.compile(r"approve or reject at \S+/runs/flow-run/([0-9a-f-]{36})")


def site_of(handles: list[Rollout], path: Path) -> Path:
    """The site configuration for the rollouts' routes: their parts, policy and plan by name, the candidate."""
    routes, policies, plans = {}, {}, {}
    for handle in handles:
        spec = handle.spec
        settings = spec.model_dump(mode="json", include=set(RouteSite.model_fields) - ROUTE_ONLY)
        routes[handle.route] = {**settings, "policy": "demo", "plan": f"{handle.route}-plan",
                                "candidates": {"improved": spec.candidate_manifest}}
        policies["demo"] = spec.gate_policy.model_dump(mode="json")
        plans[f"{handle.route}-plan"] = spec.plan.model_dump(mode="json")
    path.write_text(json.dumps({"routes": routes, "policies": policies, "plans": plans}, indent=1), encoding="utf-8")
    return path


def own_stable(parts: Estate, handle: Rollout) -> None:
    """Give the route a stable replica of its own (a promotion drains its old stable's replicas)."""
    view = start_replica(parts.client, ReplicaRequest(revision=parts.revision("stable"), store=parts.store,
                                                      signature_policy=parts.policy, warm=WARM))
    target = RevisionTarget(fingerprint=parts.revision("stable").fingerprint, endpoints=(str(view.endpoint),),
                            served_model=str(view.served_model))
    handle.store.write(successor(handle.current(), by="seed", now=datetime.now(UTC), stable=target))


@pytest.mark.timeout(900)
def test_a_rollout_asked_for_by_name_is_approved_in_the_ui_and_promoted_by_the_worker(
    zoo_dir: Path, prefect_api: str, tmp_path: Path
) -> None:
    from prefect.flow_runs import resume_flow_run

    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Approve(), Bake(seconds=5)], lease_seconds=20,
                             lease_renew_seconds=2, rollback_window_seconds=30)
    with estate(zoo_dir, prefect_api, tmp_path / "estate") as parts, \
            rollout(parts, tmp_path / "route", "deployed", plan, approval="ui", rate=0.5) as handle:
        stable = handle.current().stable.fingerprint
        env = revgate_env(prefect_api, site_of([handle], tmp_path / "site.json"))
        output = tmp_path / "promote.out"
        with deployed(env, tmp_path), output.open("w") as sink:
            command = subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", "deployed", "improved",
                                        "--requested-by", "ana"], cwd=ROOT, env=env, stdout=sink,
                                       stderr=subprocess.STDOUT, text=True)
            try:
                form = wait_until(lambda: PAUSED.search(output.read_text()), 600, "the run paused for approval")
                assert handle.current().candidate is not None  # the canary serves while the form waits
                resume_flow_run(UUID(form.group(1)), run_input={"approver": "rm", "approve": True,
                                                                "evidence_digest": "", "comment": "looks right"})
                assert command.wait(300) == 0, output.read_text()
                # The command returned at the decision; the run still watches its rollback window.
                window = run_window(handle)
                assert window.startswith("open until "), window
                assert run_state(UUID(form.group(1))).is_running()
                wait_until(lambda: run_state(UUID(form.group(1))).is_final(), 120, "the window's end")
            finally:
                if command.poll() is None:
                    command.kill()
        printed = output.read_text()
        print(printed)
        assert "Paused" in printed and "decided: promoted; the rollback window watches until" in printed
        assert printed.rstrip().endswith("decision: promoted")
        # Half a request a second for 30 s may not reach the window's 20: it ends watching, or healthy; never reverted.
        assert run_window(handle).startswith(("ended healthy: ", "ended watching: ")), run_window(handle)
        # While following, the command showed the route's live view: the canary, its router and replicas.
        assert re.search(r"route deployed  generation \d+  stage canary", printed), printed
        assert "routers" in printed and "replica(s)" in printed
        promoted = handle.current()
        assert promoted.stable.fingerprint != stable and promoted.candidate is None
        assert promoted.created_by.startswith("ana (claimed; prefect flow run "), promoted.created_by
        assert handle.traffic.failed() == []
        assert handle.traffic.served_by(promoted.stable.fingerprint)


def run_state(run_id: UUID) -> Any:
    """The flow run's state, from the Prefect API."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def run_window(handle: Rollout) -> str:
    """The rollback window's tag on the route's newest evidence run ("" before a promotion)."""
    from revgate.registry.ledger import EvidenceLedger

    run = EvidenceLedger(handle.spec.tracking_uri, handle.folder / "artifacts").latest_run(handle.route)
    return "" if run is None else str(run.data.tags.get("revgate.rollback_window", ""))


def replica_states(parts: Estate, target: RevisionTarget) -> list[str]:
    """The states of the worker's replicas behind the target's endpoint (a port may be used again)."""
    return [str(r.state) for r in parts.client.replicas()
            if str(r.endpoint).rstrip("/") == target.endpoints[0].rstrip("/")]


@pytest.mark.timeout(900)
def test_two_routes_roll_out_at_the_same_time_on_one_worker(zoo_dir: Path, prefect_api: str, tmp_path: Path) -> None:
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=5)], lease_seconds=20,
                             lease_renew_seconds=2, rollback_window_seconds=0)
    with estate(zoo_dir, prefect_api, tmp_path / "estate") as parts, \
            rollout(parts, tmp_path / "left", "left", plan, rate=0.5) as left, \
            rollout(parts, tmp_path / "right", "right", plan, rate=0.5) as right:
        own_stable(parts, right)
        stables = {handle.route: handle.current().stable.fingerprint for handle in (left, right)}
        # Another route of left's store serves from left's stable replica: left's promotion must not drain it.
        shared = left.current().stable
        left.store.write(RouteSnapshot(route="batch", generation=1, stable=shared, created_by="seed",
                                       created_at=datetime.now(UTC)))
        right_stable = right.current().stable
        env = revgate_env(prefect_api, site_of([left, right], tmp_path / "site.json"))
        with deployed(env, tmp_path):
            commands = [subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", route, "improved"],
                                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True) for route in ("left", "right")]
            printed = [command.communicate(timeout=720)[0] for command in commands]
        print(*printed, sep="\n")
        assert [command.returncode for command in commands] == [0, 0], printed
        (first, first_end), (second, second_end) = run_span(printed[0]), run_span(printed[1])
        assert first < second_end and second < first_end  # both rollouts ran at the same time
        for handle in (left, right):
            promoted = handle.current()
            assert promoted.stable.fingerprint != stables[handle.route] and promoted.candidate is None
            assert handle.traffic.failed() == [], handle.traffic.failed()[:3]
        # Right's old stable replica, which no route names any more, is drained; the shared one still serves.
        wait_until(lambda: {"draining", "terminated"} & set(replica_states(parts, right_stable)), 60,
                   "right's retired stable replica drained")
        assert replica_states(parts, shared) == ["ready"]
