"""Signed approvals: the rollout plan names each approver's public key, and only an answer signed with the
named approver's private key, over a statement about this form and this evidence, decides.

Through real parts: a real Prefect server, real EC keys, `revgate approve` run as a command (a separate
process talking to the server, as a release manager would), the flow's own approval loop, MLflow on
SQLite, and `revgate evidence` verifying the signature again from what the evidence run stored.
"""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from revgate.manifests.rollout import Approve
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from revgate.registry.route_store import open_route_store
from revgate.registry.signing import key_fingerprint
from tests.integration.signing_material import KeyPair, write_key
from tests.integration.test_flow_approval import EVIDENCE, REPORT, form_description, wait_until_paused
from tests.integration.test_flow_lock import spec

pytestmark = pytest.mark.servers
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))


def approve(prefect_api: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`revgate approve ...` as its own process, against the test's Prefect server."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    return subprocess.run([sys.executable, "-m", "revgate.cli.main", "approve", *args], capture_output=True, text=True,
                          check=False, env=env, timeout=120)


def audit(tmp_path: Path, keys: dict[str, KeyPair], *more: str) -> subprocess.CompletedProcess[str]:
    """``revgate evidence`` of the candidate, trusting alice's and bob's public keys (as the auditor holds them)."""
    trusted = [f"--approver-key=alice@example.com={keys['alice'].public}", f"--approver-key=bob={keys['bob'].public}"]
    return subprocess.run([sys.executable, "-m", "revgate.cli.main", "evidence", CANDIDATE.fingerprint,
                           "--tracking-uri", sqlite_uri(tmp_path / "mlflow.db"), *trusted, *more],
                          capture_output=True, text=True, check=False, cwd=tmp_path)


def wait_for_form_saying(run_id: Any, text: str, timeout: float = 120) -> str:
    """The paused run's form once its description says ``text`` (the flow asked again, saying why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        description = form_description(wait_until_paused([run_id], timeout=deadline - time.monotonic()))
        if text in description:
            return description
        time.sleep(0.5)
    raise TimeoutError(f"the approval form never said {text!r}")


def signed_round(tmp_path: Path, keys: dict[str, KeyPair], manager: Any, asks: int = 1) -> tuple[list[Any], Any]:
    """Run a flow that asks for approval ``asks`` times under a plan requiring signed approvals, while
    ``manager(run_id)`` answers; the answers (approved, evidence, by) and the evidence run."""
    from prefect import flow
    from prefect.runtime import flow_run

    from revgate.flows.promote import Promotion

    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    open_route_store(str(tmp_path / "routes")).write(
        RouteSnapshot(route="signed", generation=1, stable=stable, created_by="t", created_at=datetime.now(UTC)))
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("signed", CANDIDATE.fingerprint)
    run_id: list[Any] = []

    @flow(name="signed-approval-probe")
    def probe() -> list[tuple[bool, str, str]]:
        run_id.append(flow_run.id)
        gated = spec(tmp_path, "signed").model_copy(update={"approval": "ui", "approval_timeout_s": 200})
        plan = gated.plan.model_copy(update={
            "approvers": ("alice@example.com", "bob"), "signed_approval": True,
            "approver_keys": {"alice@example.com": str(keys["alice"].public), "bob": str(keys["bob"].public)}})
        promotion = Promotion(gated.model_copy(update={"plan": plan}), ledger, run, CANDIDATE)
        promotion.state = promotion.state.__class__(evidence_digest=EVIDENCE)
        answers = [promotion.ask_approval(Approve(), REPORT) for _ in range(asks)]
        return [(answer.approved, answer.evidence_digest, answer.by) for answer in answers]

    failures: list[BaseException] = []

    def release_manager() -> None:
        try:
            manager(wait_until_paused(run_id))
        except BaseException as error:  # the test thread reports it
            failures.append(error)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(release_manager,))
    thread.start()
    try:
        result = probe()
    finally:
        thread.join()
    if failures:
        raise failures[0]
    return result, run


@pytest.mark.timeout(400)
def test_only_an_answer_signed_with_the_named_approvers_key_decides(prefect_api: str, tmp_path: Path) -> None:
    keys = {name: write_key(tmp_path / "keys", name)[0] for name in ("alice", "bob", "mallory")}
    seen: dict[str, Any] = {}

    def manager(run_id: Any) -> None:
        from prefect.client.orchestration import get_client
        from prefect.flow_runs import resume_flow_run

        seen["first form"] = form_description(run_id)
        # 1. An answer typed on the form (as in the UI): named, right evidence, but unsigned.
        resume_flow_run(run_id, run_input={"approver": "alice@example.com", "approve": True,
                                           "evidence_digest": EVIDENCE, "comment": "typed in the UI"})
        seen["after unsigned"] = wait_for_form_saying(run_id, "was not signed")
        # 2. Signed, but with mallory's key while naming alice.
        forged = approve(prefect_api, str(run_id), "--key", str(keys["mallory"].private), "--as", "alice@example.com",
                         "--comment", "forged")
        seen["forged"] = forged
        seen["after forged"] = wait_for_form_saying(run_id, "signed with another key")
        # 3. A key that cannot be read: a clear error, nothing sent, the run stays paused.
        seen["unreadable"] = approve(prefect_api, str(run_id), "--key", str(tmp_path / "no-such.pem"),
                                     "--as", "alice@example.com")
        with get_client(sync_client=True) as client:
            paused = client.read_flow_run(run_id)
            seen["still paused"] = paused.state is not None and paused.state.is_paused()
        # 4. Alice's own key, the run named by its name: this one counts.
        seen["signed"] = approve(prefect_api, str(paused.name), "--key", str(keys["alice"].private),
                                 "--as", "alice@example.com", "--comment", "slices fine")

    result, run = signed_round(tmp_path, keys, manager)
    assert result == [(True, EVIDENCE, "alice@example.com")]
    assert "signed approvals" in seen["first form"] and "revgate approve" in seen["first form"]
    assert "quality-sliced" in seen["after forged"]  # the report is still shown above the form
    assert seen["forged"].returncode == 0, seen["forged"].stderr  # sent; the flow is what refuses it
    unreadable = seen["unreadable"]
    assert unreadable.returncode == 2 and "SigningError" in unreadable.stderr and "no-such.pem" in unreadable.stderr
    assert seen["still paused"] is True
    assert seen["signed"].returncode == 0, seen["signed"].stderr
    alice = key_fingerprint(keys["alice"].public.read_text())
    assert alice in seen["signed"].stdout

    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    stored = ledger.evidence_files(run.run_id)
    assert json.loads(stored["approval"])["comment"] == "slices fine"
    assert json.loads(stored["approval-unsigned-1"])["comment"] == "typed in the UI"
    assert json.loads(stored["approval-signed-with-another-key-1"])["comment"] == "forged"
    statement = json.loads(stored["approval-statement"])
    assert (statement["approver"], statement["evidence_digest"], statement["route"]) == (
        "alice@example.com", EVIDENCE, "signed")
    assert json.loads(stored["approval-signer"])["fingerprint"] == alice
    tags = ledger.client.get_run(run.run_id).data.tags
    assert tags["revgate.approval.signer"] == f"alice@example.com (key {alice})"
    assert tags["revgate.step.approval"] == f"approved by alice@example.com, signed with key {alice}"

    audited = audit(tmp_path, keys)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "approval: approved by alice@example.com" in audited.stdout
    assert f"signed with key {alice}: signature verified" in audited.stdout
    # Without the auditor's own keys nothing found in the run vouches for the signature.
    untrusted = subprocess.run([sys.executable, "-m", "revgate.cli.main", "evidence", CANDIDATE.fingerprint,
                                "--tracking-uri", sqlite_uri(tmp_path / "mlflow.db")], capture_output=True, text=True,
                               check=False, cwd=tmp_path)
    assert untrusted.returncode == 4 and "no trusted key for 'alice@example.com'" in untrusted.stdout, untrusted.stdout

    # The defect: the audit verified with the key stored in the same run, so "alice approves" signed with
    # a fresh key, stored beside it with its digest tags, audited as verified.
    from revgate.manifests.canonical import sha256_digest
    from revgate.registry.signing import sign_approval

    artifacts = Path(ledger.client.get_run(run.run_id).info.artifact_uri.removeprefix("file://")) / "evidence"
    forger = write_key(tmp_path / "keys", "forger")[0]
    forged = {"approval-signature": sign_approval((artifacts / "approval-statement.json").read_bytes(),
                                                  forger.private),
              "approval-signer": json.dumps({"fingerprint": key_fingerprint(forger.public.read_text()),
                                             "public_key": forger.public.read_text()})}
    for name, text in forged.items():
        path = next(artifacts.glob(f"{name}.*"))
        path.write_text(text, encoding="utf-8")
        ledger.client.set_tag(run.run_id, f"revgate.digest.{name}", sha256_digest(path.read_bytes()))
    caught = audit(tmp_path, keys)
    assert caught.returncode == 4, caught.stdout
    assert "SIGNATURE DOES NOT VERIFY" in caught.stdout and "trusted for 'alice@example.com'" in caught.stdout


@pytest.mark.timeout(400)
def test_a_second_counted_answer_is_kept_beside_the_first_and_a_wrong_run_or_state_is_refused(
    prefect_api: str, tmp_path: Path
) -> None:
    keys = {name: write_key(tmp_path / "keys", name)[0] for name in ("alice", "bob")}
    seen: dict[str, Any] = {}

    def manager(run_id: Any) -> None:
        seen["nobody"] = approve(prefect_api, "no-such-run-name", "--key", str(keys["bob"].private), "--as", "bob")
        approve(prefect_api, str(run_id), "--key", str(keys["alice"].private), "--as", "alice@example.com")
        wait_for_form_saying(run_id, "Approve the candidate")  # the second approve step's form
        seen["bob"] = approve(prefect_api, str(run_id), "--key", str(keys["bob"].private), "--as", "bob",
                              "--reject", "--comment", "second thoughts")
        seen["run"] = run_id

    result, run = signed_round(tmp_path, keys, manager, asks=2)
    assert result == [(True, EVIDENCE, "alice@example.com"), (False, EVIDENCE, "bob")]
    assert seen["nobody"].returncode == 2 and "no flow run 'no-such-run-name'" in seen["nobody"].stderr
    late = approve(prefect_api, str(seen["run"]), "--key", str(keys["bob"].private), "--as", "bob")
    assert late.returncode == 2 and "is not paused for approval" in late.stderr
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    stored = ledger.evidence_files(run.run_id)
    assert json.loads(stored["approval"])["approver"] == "alice@example.com"  # not overwritten by the second
    assert json.loads(stored["approval-2"])["comment"] == "second thoughts"
    assert json.loads(stored["approval-2-statement"])["approve"] is False
    audited = audit(tmp_path, keys)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert audited.stdout.count("signature verified") == 2
    # Evidence altered after the fact: a signed statement edited (and its digest tag with it) no longer verifies.
    artifacts = Path(ledger.client.get_run(run.run_id).info.artifact_uri.removeprefix("file://"))
    statement = artifacts / "evidence" / "approval-2-statement.json"
    statement.write_text(statement.read_text().replace('"approve":false', '"approve":true'))
    from revgate.manifests.canonical import sha256_digest

    ledger.client.set_tag(run.run_id, "revgate.digest.approval-2-statement", sha256_digest(statement.read_bytes()))
    altered = audit(tmp_path, keys)
    assert altered.returncode == 4, altered.stdout
    assert "SIGNATURE DOES NOT VERIFY" in altered.stdout
