"""A release manager runs a rollout from the Prefect UI alone, in a headless Chromium: Deployments ->
promote-revision -> Run -> Custom run, the route, candidate, policy and plan typed by name; a
``prefect worker`` process picks the run up, loads the candidate on a worker agent running vLLM on the
CPU, moves a quarter of the traffic through the route's router and pauses for approval. On the run's
Resume form a name not on the plan's allow-list approves nothing: the run stays paused and asks again,
and the canary stays where it was. A listed name approves, and the run goes on to promotion.

With ``REVGATE_DOCS_SCREENSHOTS=docs/img`` it retakes the docs' screenshot of the finished run's page
(the approval form's, with a gate report above it, comes from test_promotion_demo.py).
"""

from __future__ import annotations

import contextvars
import json
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from revgate.manifests.rollout import Approve, Bake, RolloutPlan, SetWeight
from revgate.registry.ledger import EvidenceLedger
from tests.integration.browser import answer_the_resume_form, browser_page, screenshot
from tests.integration.rollout_estate import Rollout, estate, rollout, wait_until
from tests.integration.test_deployment_rollout import site_of
from tests.integration.test_deployments import deployed, revgate_env

pytestmark = [pytest.mark.engine, pytest.mark.servers, pytest.mark.gated]

RELEASE_MANAGER = "rm@example.com"
STRANGER = "mallory@example.com"
NOT_LISTED = f"`{STRANGER}`, who is not on the rollout plan's allow-list"
DEPLOYMENT_PAGE = re.compile(r"/deployments/deployment/([0-9a-f-]{36})")
SUBMITTED = re.compile(r"/deployments/deployment/[0-9a-f-]{36}(\?|$)")  # not the form's own page, .../run


def run_state(run_id: UUID) -> Any:
    """The flow run's current state, from the Prefect server."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def paused_form(run_id: UUID, showing: str = "") -> str:
    """The markdown above the paused run's Resume form when it shows ``showing``; empty while not so.

    Read on a thread of its own: Prefect's sync-or-async input helpers return a coroutine where an
    event loop runs, and the browser's sync API runs one on this thread.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:  # in this context: it holds the Prefect server's address
        return pool.submit(contextvars.copy_context().run, _paused_form, run_id, showing).result()


def _paused_form(run_id: UUID, showing: str) -> str:
    from prefect.input.actions import read_flow_run_input
    from prefect.input.run_input import keyset_from_paused_state

    state = run_state(run_id)
    if state is None or not state.is_paused():
        return ""
    description = read_flow_run_input(keyset_from_paused_state(state)["description"], flow_run_id=run_id)
    return str(description) if description and showing in str(description) else ""


def start_from_the_run_form(page: Any, ui_url: str, fields: dict[str, str]) -> UUID:
    """Deployments -> promote-revision -> Run -> Custom run, the typed parameters filled in, Submit."""
    page.goto(f"{ui_url}/deployments")
    page.get_by_role("link", name="promote-revision").first.click(timeout=60_000)
    page.get_by_role("button", name="Run", exact=True).click(timeout=60_000)
    page.get_by_text("Custom run").click(timeout=30_000)
    # The form's text fields in the flow's parameter order (no approval mode: the site's).
    boxes = page.locator("textarea")
    for number, name in enumerate(("route", "candidate", "policy", "plan", "requested_by")):
        boxes.nth(number).fill(fields[name], timeout=30_000)
    from playwright.sync_api import expect

    expect(boxes.nth(4)).to_have_value(fields["requested_by"])
    found = DEPLOYMENT_PAGE.search(page.url)
    assert found is not None
    submitted = datetime.now(UTC)
    page.locator("button[type=submit]").click()
    page.wait_for_url(SUBMITTED, timeout=60_000)  # back on the deployment's page once the run is created
    return wait_until(lambda: deployment_run(UUID(found.group(1)), submitted), 60, "the run the form created")


def deployment_run(deployment_id: UUID, since: datetime) -> UUID | None:
    """The deployment's flow run created since ``since`` (the server is shared by the test run), once there is one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])))
    new = [run.id for run in runs if run.created is not None and run.created >= since]
    assert len(new) <= 1, new
    return new[0] if new else None


def answer_on_the_resume_form(page: Any, ui_url: str, run_id: UUID, approver: str, shot: Path | None = None) -> None:
    """Open the paused run, press Resume, name the approver, switch approve on, submit."""
    page.goto(f"{ui_url}/runs/flow-run/{run_id}")
    page.get_by_role("button", name="Resume").first.click(timeout=90_000)
    answer_the_resume_form(page, approver, approve=True, comment=f"{approver}: the canary's gates read well",
                           before_submit=None if shot is None else  # the docs' one shows a report: see above
                           lambda form: form.screenshot(path=str(shot / "prefect-approval.png")))


def weights(handle: Rollout) -> list[int]:
    """The candidate weights the route's generations committed (lease renewals repeat one), each once, in order."""
    seen = [s.candidate.weight_ppm for s in handle.history() if s.candidate is not None]
    return sorted(set(seen), key=seen.index)


@pytest.mark.timeout(1200)
def test_a_release_manager_starts_a_rollout_from_the_run_form_and_approves_it_on_the_resume_form(
    zoo_dir: Path, prefect_api: str, tmp_path: Path
) -> None:
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=250_000), Approve(), SetWeight(weight_ppm=500_000),
                                    Bake(seconds=5)], approvers=(RELEASE_MANAGER,), lease_seconds=20,
                             lease_renew_seconds=2, rollback_window_seconds=0)
    ui_url = prefect_api.removesuffix("/api")
    with estate(zoo_dir, prefect_api, tmp_path / "estate") as parts, \
            rollout(parts, tmp_path / "route", "chat", plan, approval="ui", rate=0.5) as handle, \
            deployed(revgate_env(prefect_api, site_of([handle], tmp_path / "site.json")), tmp_path), \
            browser_page() as page:
        stable = handle.current().stable.fingerprint
        run_id = start_from_the_run_form(page, ui_url, {"route": "chat", "candidate": "improved", "policy": "demo",
                                                         "plan": "chat-plan", "requested_by": "ana"})
        first = wait_until(lambda: paused_form(run_id), 600, "the worker's run paused for approval", every_s=1)
        assert f"`{RELEASE_MANAGER}`" in first  # who may answer, above the report
        assert weights(handle) == [250_000]  # the canary serves while the form waits

        answer_on_the_resume_form(page, ui_url, run_id, STRANGER)
        again = wait_until(lambda: paused_form(run_id, NOT_LISTED), 120, "the form asked again", every_s=1)
        assert "Answer again" in again
        assert weights(handle) == [250_000]  # the stranger's approval moved nothing

        answer_on_the_resume_form(page, ui_url, run_id, RELEASE_MANAGER, shot=tmp_path)
        final = wait_until(lambda: (state := run_state(run_id)) is not None and state.is_final() and state, 600,
                           "the run reached its decision", every_s=1)
        page.goto(f"{ui_url}/runs/flow-run/{run_id}")
        page.get_by_text("decision: promoted").first.wait_for(timeout=60_000)  # the state and the flow's log line
        screenshot(page, "prefect-run.png", tmp_path)

    assert final.is_completed() and final.message == "decision: promoted", final
    assert weights(handle) == [250_000, 500_000]  # on past the approval, to the next step
    promoted = handle.current()
    assert promoted.stable.fingerprint != stable and promoted.candidate is None
    assert promoted.created_by.startswith("ana (claimed; prefect flow run "), promoted.created_by
    assert handle.traffic.failed() == [], handle.traffic.failed()[:3]
    ledger = EvidenceLedger(handle.spec.tracking_uri, Path(handle.spec.evidence_root) / "mlflow-artifacts")
    run = ledger.latest_run("chat")
    assert run is not None
    assert run.data.tags["revgate.step.approval"] == f"approved by {RELEASE_MANAGER}"
    evidence = Path(ledger.client.download_artifacts(run.info.run_id, "evidence", str(tmp_path)))
    refused = json.loads((evidence / "approval-not-on-allow-list-1.json").read_text())
    assert (refused["approver"], refused["approve"]) == (STRANGER, True)
    assert json.loads((evidence / "approval.json").read_text())["approver"] == RELEASE_MANAGER
