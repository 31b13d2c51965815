"""Decisions of the demo's plan and policy on the embedded default, one rollout per candidate on one shared
demo session (as `revgate demo` sets it up: real Prefect, worker agent, vLLM, router with its record
sink, MLflow, users' traffic through the router from another process for the whole session).

`slice-regressed` is better on average and clearly worse on one slice: the flow must catch it on that
slice during the shadow stage and roll back, with stable serving throughout. `slow` answers alike at
3.5x stable's time per token: a latency or SLO gate must roll it back. `stable-copy` (stable's files
under a new artifact identity) must be promoted. Each rollout starts from stable alone on the route,
warm, with no other replica up (`DemoSession.restore_stable`), as bench/decisions.py runs them; the
whole `revgate demo` command is tested in test_promotion_demo.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from revgate.evaluation.gates import FUTILE
from revgate.flows.demo import ROUTE, DemoSession, demo_session
from revgate.manifests.route import RouteSnapshot
from revgate.registry.route_store import open_route_store
from tests.integration.gate_reports import evidence_counts, last_report

pytestmark = [pytest.mark.engine, pytest.mark.servers, pytest.mark.gated]


@pytest.fixture(scope="module")
def session(zoo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoSession]:
    with demo_session(tmp_path_factory.mktemp("demo"), zoo_dir, ("slow", "slice-regressed", "stable-copy"),
                      users_s=3600) as shared:
        yield shared


def roll_out(session: DemoSession, candidate: str, exit_code: int) -> tuple[list[RouteSnapshot], MlflowClient]:
    """One rollout of ``candidate`` from stable alone; its exit and decision checked; the route's generations from
    the rollout's start (stable alone) on, and the evidence store."""
    store = open_route_store(session.routes)
    log = session.root / "logs" / f"{candidate}.log"
    done = session.rollout(candidate, log=log)
    output = log.read_text(encoding="utf-8")
    client = MlflowClient(done.spec.tracking_uri)
    assert done.code == exit_code, output[-3000:] + gates_of_last_report(client, session.root / "failed")
    decision = "promoted" if exit_code == 0 else "rolled_back"
    assert f"decision: {decision}" in output, output[-3000:]
    history = store.history(ROUTE)
    started = max(s.generation for s in history if s.created_at.timestamp() <= done.started_s)
    return [s for s in history if s.generation >= started], client


def gates_of_last_report(client: MlflowClient, folder: Path) -> str:
    """The last gate report's verdict per gate, with its reason: what a wrong decision is read from."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        name, report = last_report(client, folder)
    except Exception as error:  # the failure message must not hide the failure itself
        return f"\n(no gate report to show: {error!r})"
    lines = [f"{gate['gate']}: {gate['outcome']} ({gate.get('reason', '')})" for gate in report["gates"]]
    return f"\n{name}: {report['outcome']}\n" + "\n".join(lines) + "\nnotes: " + " | ".join(report["notes"])


def test_a_slower_revision_is_rolled_back_by_a_latency_or_slo_gate(session: DemoSession, tmp_path: Path) -> None:
    history, client = roll_out(session, "slow", 3)
    stable = history[0].stable.fingerprint
    assert all(snapshot.stable.fingerprint == stable for snapshot in history)
    assert history[-1].candidate is None and history[-1].shadow is None
    name, report = last_report(client, tmp_path)
    failed = {gate["gate"] for gate in report["gates"] if gate["outcome"] == "fail"}
    # Stopped as futile: passing by the horizon was out of reach, so more samples could only fail it. On a
    # busy machine the wider spread can keep a 1.75x slower E2E short of the fail boundary at its early
    # looks while passing is already out of reach; either way a timing gate is what rolled it back.
    futile = {gate["gate"] for gate in report["gates"]
              if gate["outcome"] == "inconclusive" and gate["reason"].startswith(FUTILE)}
    timing = {"latency-ttft", "latency-e2e", "slo-*"}  # the canary's latency and SLO gates
    assert report["outcome"] in ("fail", "inconclusive") and (failed | futile) & timing, (name, report["gates"])
    assert not failed - timing, failed  # the same answers: no quality or error gate may fail it
    counts = evidence_counts(report)  # mirrored users' copies may be dropped: the slow shadow cannot take them all
    assert counts["stable_users"] + counts["stable_probes"] > 0, counts
    assert counts["candidate_users"] + counts["candidate_probes"] > 0, counts


def test_a_slice_regression_is_caught_and_rolled_back(session: DemoSession, tmp_path: Path) -> None:
    history, client = roll_out(session, "slice-regressed", 3)
    stable = history[0].stable.fingerprint
    assert all(snapshot.stable.fingerprint == stable for snapshot in history)  # stable served throughout
    assert history[-1].candidate is None and history[-1].shadow is None
    assert any(snapshot.shadow is not None for snapshot in history)  # it got as far as the shadow stage

    experiment = client.get_experiment_by_name("revgate/demo")
    assert experiment is not None
    run = client.search_runs([experiment.experiment_id])[0]
    assert run.data.tags["revgate.decision"] == "rolled_back"
    assert run.data.tags["revgate.step.verify"] == "pass"
    _, last = last_report(client, tmp_path)
    quality = next(gate for gate in last["gates"] if gate["gate"] in ("quality", "quality-paired"))
    failed = [s["slice"] for s in quality["slices"] if s["outcome"] == "fail"]
    assert quality["outcome"] == "fail" and failed, quality
    assert all("sort" in name and "long" in name for name in failed), failed


def test_a_revision_identical_to_stable_is_promoted_by_the_demos_plan(session: DemoSession, tmp_path: Path) -> None:
    # stable's own weights, tokenizer and chat template under a new artifact identity: an A/A rollout.
    # The old plan rolled such a revision back in every run (a canary too short for the hardest
    # slice, and a latency transient the shadow stage left on the candidate).
    history, client = roll_out(session, "stable-copy", 0)
    first, last = history[0], history[-1]
    assert last.stable.fingerprint != first.stable.fingerprint and last.candidate is None
    _, report = last_report(client, tmp_path)  # the canary's report
    assert report["outcome"] == "pass", report["gates"]
    notes = " ".join(report["notes"])
    assert "power: P(pass | equal) at least 0.90 on every gate cell" in notes, notes
    assert "counting began once both arms' replicas were idle" in notes, notes
    assert {g["gate"] for g in report["gates"]} >= {"latency-ttft", "latency-e2e", "errors"}
