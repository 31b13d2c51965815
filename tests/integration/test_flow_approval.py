"""Approval by a release manager: the flow pauses, shows the evidence, and continues only with the
answer given, bound to the evidence digest and naming who gave it. Once through the API the UI's
Resume form posts to, once by pressing the buttons of the Prefect UI itself in a headless Chromium."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from revgate.manifests.rollout import Approve
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from revgate.registry.route_store import open_route_store
from tests.integration.browser import answer_the_resume_form, browser_page
from tests.integration.test_flow_lock import spec

pytestmark = pytest.mark.servers
EVIDENCE = "sha256:" + "e" * 64
REPORT = "| gate | outcome |\n|---|---|\n| quality-sliced | PASS |"

Manager = Callable[[Any, dict[str, Any]], None]


def wait_until_paused(run_id: list[Any], timeout: float = 120) -> Any:
    """The flow run's id once it is paused and waiting for input."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run_id:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run_id[0]).state
            if state is not None and state.is_paused():
                return run_id[0]
        time.sleep(0.5)
    raise TimeoutError("the flow did not pause for approval within the time allowed")


def through_the_api(answer: dict[str, Any]) -> Manager:
    """What the UI's Resume form does, through the API: post the answer as the run's input."""

    def manager(run_id: Any, seen: dict[str, Any]) -> None:
        from prefect.flow_runs import resume_flow_run

        resume_flow_run(run_id, run_input=answer)
        seen["answered"] = True

    return manager


def through_the_ui(ui_url: str, approve: bool, comment: str) -> Manager:
    """A release manager in the Prefect UI: open the paused run, read the report, answer, submit."""

    def manager(run_id: Any, seen: dict[str, Any]) -> None:
        from playwright.sync_api import expect

        with browser_page() as page:
            page.goto(f"{ui_url}/runs/flow-run/{run_id}")
            page.get_by_role("button", name="Resume").first.click(timeout=90_000)
            form = page.locator(".p-modal")
            # The gate report is rendered above the form, and the digest it is bound to is filled in.
            expect(form.get_by_role("cell", name="quality-sliced")).to_be_visible(timeout=30_000)
            seen["report_shown"] = form.get_by_role("cell", name="PASS").is_visible()
            answer_the_resume_form(page, "rm@example.com", approve, comment, before_submit=lambda form: seen.update(
                digest_shown=form.locator("textarea").nth(1).input_value()))
            seen["answered"] = True

    return manager


def form_description(run_id: Any) -> str:
    """The markdown the paused run's Resume form shows above its fields."""
    from prefect.client.orchestration import get_client
    from prefect.input.actions import read_flow_run_input
    from prefect.input.run_input import keyset_from_paused_state

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state is not None
    return str(read_flow_run_input(keyset_from_paused_state(state)["description"], flow_run_id=run_id))


Round = tuple[tuple[bool, str, str], dict[str, Any], Path]


def approval_round(prefect_api: str, tmp_path: Path, manager: Manager, approvers: tuple[str, ...] = ()) -> Round:
    """Run a flow that asks for approval while ``manager`` answers; the answer (approved, evidence, by) and
    the ledger's copy. ``approvers``: the rollout plan's allow-list."""
    from prefect import flow
    from prefect.runtime import flow_run

    from revgate.flows.promote import Promotion

    store = open_route_store(str(tmp_path / "routes"))
    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    store.write(RouteSnapshot(route="gated", generation=1, stable=stable, created_by="t", created_at=datetime.now(UTC)))
    candidate = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("gated", candidate.fingerprint)
    run_id: list[Any] = []

    @flow(name="approval-probe")
    def probe() -> tuple[bool, str, str]:
        run_id.append(flow_run.id)
        gated = spec(tmp_path, "gated").model_copy(update={"approval": "ui", "approval_timeout_s": 150})
        gated = gated.model_copy(update={"plan": gated.plan.model_copy(update={"approvers": approvers})})
        promotion = Promotion(gated, ledger, run, candidate)
        promotion.state = promotion.state.__class__(evidence_digest=EVIDENCE)
        answer = promotion.ask_approval(Approve(), REPORT)
        return answer.approved, answer.evidence_digest, answer.by

    seen: dict[str, Any] = {}

    def release_manager() -> None:
        manager(wait_until_paused(run_id), seen)

    # The release manager's thread talks to the same Prefect server: it runs in a copy of this context.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(release_manager,))
    thread.start()
    result = probe()
    thread.join()
    evidence = ledger.client.download_artifacts(run.run_id, "evidence", str(tmp_path))
    return result, seen, Path(evidence) / "approval.json"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("approve", [True, False])
def test_the_flow_waits_for_the_release_managers_answer(prefect_api: str, tmp_path: Path, approve: bool) -> None:
    answer = {"approver": "rm@example.com", "approve": approve, "evidence_digest": EVIDENCE,
              "comment": "looked at the slices"}
    result, seen, logged = approval_round(prefect_api, tmp_path, through_the_api(answer))
    assert seen.get("answered") is True
    assert result == (approve, EVIDENCE, "rm@example.com")
    assert "looked at the slices" in logged.read_text()


def answers_in_turn(run_id: list[Any], answers: list[dict[str, Any]], seen: dict[str, Any]) -> None:
    """A release manager who answers each pause in turn (waiting for the next one after each)."""
    from prefect.flow_runs import resume_flow_run

    for number, answer in enumerate(answers):
        resume_flow_run(wait_until_paused(run_id), run_input=answer)
        seen[f"answered {number}"] = True


@pytest.mark.timeout(300)
def test_an_approval_of_other_evidence_approves_nothing_and_the_flow_asks_again(
    prefect_api: str, tmp_path: Path
) -> None:
    stale = {"approver": "rm", "approve": True, "evidence_digest": "sha256:" + "d" * 64, "comment": "from an old tab"}
    right = {"approver": "rm", "approve": True, "evidence_digest": EVIDENCE, "comment": "this report"}
    run_id: list[Any] = []

    def manager(first_run: Any, seen: dict[str, Any]) -> None:
        run_id.append(first_run)
        answers_in_turn(run_id, [stale, right], seen)

    result, seen, logged = approval_round(prefect_api, tmp_path, manager)
    assert seen == {"answered 0": True, "answered 1": True}
    assert result == (True, EVIDENCE, "rm")
    assert "this report" in logged.read_text()  # the answer that counted
    refused = logged.parent / "approval-of-other-evidence-1.json"  # and, beside it, the one that did not
    assert "from an old tab" in refused.read_text()


@pytest.mark.timeout(300)
def test_an_answer_from_someone_not_on_the_allow_list_counts_for_nothing_and_is_kept(
    prefect_api: str, tmp_path: Path
) -> None:
    """Neither a stranger's approval nor their rejection decides; the form says who answered; a listed one decides."""
    stranger = {"approver": "mallory@example.com", "approve": True, "evidence_digest": EVIDENCE, "comment": "ship it"}
    stop = {**stranger, "approve": False, "comment": "stop it"}
    listed = {"approver": "Alice@Example.com", "approve": True, "evidence_digest": EVIDENCE, "comment": "slices fine"}
    run_id: list[Any] = []

    def manager(first_run: Any, seen: dict[str, Any]) -> None:
        run_id.append(first_run)
        seen["first form"] = form_description(first_run)
        from prefect.flow_runs import resume_flow_run

        resume_flow_run(first_run, run_input=stranger)
        resume_flow_run(wait_until_paused(run_id), run_input=stop)
        seen["third form"] = form_description(wait_until_paused(run_id))
        resume_flow_run(run_id[0], run_input=listed)

    result, seen, logged = approval_round(prefect_api, tmp_path, manager, approvers=("alice@example.com", "bob"))
    assert result == (True, EVIDENCE, "Alice@Example.com")
    assert "`alice@example.com`, `bob`" in seen["first form"]  # who may answer, above the report
    assert "`mallory@example.com`, who is not on the rollout plan's allow-list" in seen["third form"]
    assert "quality-sliced" in seen["third form"]  # the report is still shown
    counted = json.loads(logged.read_text())
    assert (counted["approver"], counted["comment"]) == ("Alice@Example.com", "slices fine")
    refused = [json.loads((logged.parent / f"approval-not-on-allow-list-{n}.json").read_text()) for n in (1, 2)]
    assert [(r["approver"], r["approve"], r["comment"]) for r in refused] == [
        ("mallory@example.com", True, "ship it"), ("mallory@example.com", False, "stop it")]
    evidence_run = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts").latest_run("gated")
    assert evidence_run is not None
    assert evidence_run.data.tags["revgate.step.approval"] == "approved by Alice@Example.com"


@pytest.mark.timeout(400)
def test_a_release_manager_approves_in_the_prefect_ui(prefect_api: str, tmp_path: Path) -> None:
    manager = through_the_ui(prefect_api.removesuffix("/api"), approve=True, comment="sort/long looks fine")
    result, seen, logged = approval_round(prefect_api, tmp_path, manager)
    assert seen == {"report_shown": True, "digest_shown": EVIDENCE, "answered": True}
    assert result == (True, EVIDENCE, "rm@example.com")
    assert "sort/long looks fine" in logged.read_text()
