"""Approval through the Prefect API the UI's Resume form uses: the flow pauses, shows the evidence,
and continues only with the answer a release manager gave, bound to the evidence digest."""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from manifests.rollout import Approve
from manifests.route import RevisionTarget, RouteSnapshot
from registry.ledger import EvidenceLedger, sqlite_uri
from registry.route_store import open_route_store
from tests.integration.test_flow_lock import spec

pytestmark = pytest.mark.servers
EVIDENCE = "sha256:" + "e" * 64


def resume_when_paused(run_id: list[Any], answer: dict[str, Any], seen: dict[str, Any]) -> None:
    """What a release manager does in the UI: wait for the pause, read the form, press Resume."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if run_id:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run_id[0]).state
            if state is not None and state.is_paused():
                seen["paused"] = True
                resume_flow_run(run_id[0], run_input=answer)
                return
        time.sleep(0.5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("approve", [True, False])
def test_the_flow_waits_for_the_release_managers_answer(prefect_api: str, tmp_path: Path, approve: bool) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    from flows.promote import Promotion

    store = open_route_store(str(tmp_path / "routes"))
    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    store.write(RouteSnapshot(route="gated", generation=1, stable=stable, created_by="t", created_at=datetime.now(UTC)))
    candidate = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("gated", candidate.fingerprint)
    run_id: list[Any] = []

    @flow(name="approval-probe")
    def probe() -> tuple[bool, str]:
        run_id.append(flow_run.id)
        gated = spec(tmp_path, "gated").model_copy(update={"approval": "ui", "approval_timeout_s": 90})
        promotion = Promotion(gated, ledger, run, candidate)
        promotion.state = promotion.state.__class__(evidence_digest=EVIDENCE)
        answer = promotion.ask_approval(Approve(), "| gate | outcome |\n|---|---|\n| quality | PASS |")
        return answer.approved, answer.evidence_digest

    seen: dict[str, Any] = {}
    answer = {"approve": approve, "evidence_digest": EVIDENCE, "comment": "looked at the slices"}
    # The release manager's thread talks to the same Prefect server: it runs in a copy of this context.
    context = contextvars.copy_context()
    manager = threading.Thread(target=context.run, args=(resume_when_paused, run_id, answer, seen))
    manager.start()
    approved, digest = probe()
    manager.join()
    assert seen.get("paused") is True
    assert (approved, digest) == (approve, EVIDENCE)
    logged = ledger.client.download_artifacts(run.run_id, "evidence/approval.json", str(tmp_path))
    assert "looked at the slices" in Path(logged).read_text()
