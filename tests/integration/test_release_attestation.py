"""A promotion's signed release decision, audited through the real parts: a real Prefect server (the flow pauses
for a signed approval that `revgate approve` sends as its own process), a real router serving the route, a real
route store folder, MLflow on SQLite, real EC keys for the approver and the controller, and `revgate evidence` as
the auditor runs it.

One promotion is made (the module's fixture); each test then tampers with its evidence or its route history as an
attacker with write access to one of them would, audits, and puts back what it changed, so the cases are
independent and the promotion is paid for once.
"""

from __future__ import annotations

import contextvars
import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.gates import gates_from_policy, judge
from revgate.flows import processes
from revgate.manifests.canonical import sha256_digest
from revgate.manifests.rollout import Approve, RolloutPlan
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.follow import follow_route
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from revgate.registry.route_store import open_route_store
from tests.integration.commands import revgate
from tests.integration.signing_material import KeyPair, write_key
from tests.integration.test_flow_approval import wait_until_paused
from tests.integration.test_flow_lock import spec
from tests.integration.test_signed_approval import approve
from tests.unit.test_gates import evidence, policy

pytestmark = pytest.mark.servers
ROUTE = "attested"
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))
EVEN = {"add": 0.8, "rev": 0.8, "sort": 0.8}


@dataclass
class Promoted:
    """The promotion's folders, keys and evidence run, and the route generation its decision was written at."""

    root: Path
    keys: dict[str, KeyPair]
    ledger: EvidenceLedger
    run_id: str
    generation: int

    @property
    def evidence(self) -> Path:
        return Path(self.ledger.client.get_run(self.run_id).info.artifact_uri.removeprefix("file://")) / "evidence"

    @property
    def routes(self) -> str:
        return str(self.root / "routes")

    def audit(self, controller: Path | None = None) -> Any:
        """``revgate evidence`` of the candidate with the auditor's own keys: alice's and the controller's."""
        return revgate("evidence", CANDIDATE.fingerprint, "--tracking-uri", sqlite_uri(self.root / "mlflow.db"),
                       "--routes", self.routes, f"--approver-key=alice={self.keys['alice'].public}",
                       "--controller-key", str(controller or self.keys["controller"].public))

    def retag(self, name: str, path: Path) -> None:
        """What an attacker with write access to the run does after changing a document: its digest tag follows."""
        self.ledger.client.set_tag(self.run_id, f"revgate.digest.{name}", sha256_digest(path.read_bytes()))


def promote(root: Path, keys: dict[str, KeyPair], prefect_api: str) -> Promoted:
    """Two gate reports, a signed approval by alice, and the promotion the plan then decides, in one flow run."""
    from prefect import flow
    from prefect.runtime import flow_run

    from revgate.flows.promote import Promotion

    routes = str(root / "routes")
    open_route_store(routes).write(RouteSnapshot(route=ROUTE, generation=1, stable=STABLE, created_by="seed",
                                                 created_at=datetime.now(UTC)))
    token = processes.token_file(root / "token")
    ledger = EvidenceLedger(sqlite_uri(root / "mlflow.db"), root / "artifacts")
    run = ledger.open_run(ROUTE, CANDIDATE.fingerprint)
    plan = RolloutPlan.build(steps=[Approve()], approvers=["alice"], signed_approval=True,
                             approver_keys={"alice": str(keys["alice"].public)})
    flow_ids: list[Any] = []
    with processes.router(routes, ROUTE, root / "router", token) as (_, admin_url):
        settings = spec(root, ROUTE).model_copy(update={
            "plan": plan, "approval": "ui", "approval_timeout_s": 300, "router_admin_url": admin_url,
            "router_admin_token_file": str(token), "controller_key_file": str(keys["controller"].private)})

        @flow(name="attested-promotion")
        def promotion_flow() -> str:
            flow_ids.append(flow_run.id)
            ledger.tag(run, "prefect_flow_run_id", str(flow_run.id))
            driver = Promotion(settings, ledger, run, CANDIDATE)
            # No fleet here: the capacity rule at the promotion commit (tested in test_rollout_faults) holds.
            driver.ensure_capacity = lambda: True  # type: ignore[method-assign]
            gate_policy = policy()
            for stage, samples in enumerate((300, 600)):
                report = judge(gates_from_policy(gate_policy), gate_policy, evidence(EVEN, EVEN, n=samples,
                                                                                     final=stage == 1))
                driver.publish(report, f"step{stage:02d}")
            driver.state = replace(driver.state, evidence_digest=report.evidence_digest)
            ledger.register_version(run, settings.model_name, CANDIDATE.fingerprint)
            decided = driver.run_plan()
            follow_route(ledger, settings.model_name, driver.owner.read())  # the registry follows, as the flow's does
            ledger.log_json(run, "decision", {"decision": decided.status, "reason": decided.reason})
            ledger.close(run, decided.status)
            return decided.status

        answered: list[Any] = []

        def release_manager() -> None:
            answered.append(approve(prefect_api, str(wait_until_paused(flow_ids, timeout=180)), "--key",
                                    str(keys["alice"].private), "--as", "alice", "--comment", "both stages pass"))

        manager = threading.Thread(target=contextvars.copy_context().run, args=(release_manager,))
        manager.start()
        try:
            assert promotion_flow() == "promoted"
        finally:
            manager.join()
    assert answered and answered[0].returncode == 0, answered
    current = open_route_store(routes).read(ROUTE)
    assert current is not None and current.stable.fingerprint == CANDIDATE.fingerprint
    return Promoted(root, keys, ledger, run.run_id, current.generation)


@pytest.fixture(scope="module")
def promoted(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promoted]:
    root = tmp_path_factory.mktemp("attested")
    keys = {name: write_key(root / "keys", name)[0] for name in ("alice", "controller", "mallory")}
    yield promote(root, keys, prefect_api)


@pytest.mark.timeout(600)
def test_the_promotion_signs_its_decision_and_the_route_records_it(promoted: Promoted) -> None:
    history = open_route_store(promoted.routes).history(ROUTE)
    decided = history[-1]
    assert [s.decision_attestation is not None for s in history] == [False] * (len(history) - 1) + [True]
    envelope = json.loads((promoted.evidence / "release-attestation.json").read_text())
    import base64

    said = json.loads(base64.b64decode(envelope["dsseEnvelope"]["payload"]))
    assert sha256_digest(base64.b64decode(envelope["dsseEnvelope"]["payload"])) == decided.decision_attestation
    assert said["_type"] == "https://in-toto.io/Statement/v1"
    assert said["predicateType"] == "https://revgate.dev/release-decision/v1"
    predicate = said["predicate"]
    assert (predicate["decision"], predicate["route_generation"]) == ("promoted", decided.generation)
    assert [r["name"] for r in predicate["gate_reports"]] == [
        "gate-report-01-step00", "gate-report-01-step00.md", "gate-report-02-step01", "gate-report-02-step01.md"]
    [answer] = predicate["approvals"]
    assert (answer["document"], answer["approver"], answer["approve"]) == ("approval", "alice", True)
    assert answer["signature_digest"].startswith("sha256:")
    tags = promoted.ledger.client.get_run(promoted.run_id).data.tags
    assert tags["revgate.attestation"] == decided.decision_attestation
    assert "revgate.digest.release-attestation" in tags

    audited = promoted.audit()
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "release attestation evidence/release-attestation.json: promoted at route generation" in audited.stdout
    assert "verified, matches the run and the route history" in audited.stdout


@pytest.mark.timeout(300)
def test_a_gate_report_edited_with_its_digest_tag_fails_the_audit(promoted: Promoted) -> None:
    report = promoted.evidence / "gate-report-02-step01.json"
    original = report.read_bytes()
    try:
        data = json.loads(original)
        data["outcome"] = "pass" if data["outcome"] != "pass" else "fail"
        report.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")))
        promoted.retag("gate-report-02-step01", report)
        audited = promoted.audit()
        assert audited.returncode == 4, audited.stdout + audited.stderr
        assert "gate report evidence/gate-report-02-step01 in run" in audited.stdout
        assert "was changed after the decision" in audited.stdout
        assert "ok       evidence/gate-report-02-step01.json" in audited.stdout  # its tag agrees: only the attestation
    finally:
        report.write_bytes(original)
        promoted.retag("gate-report-02-step01", report)
    assert promoted.audit().returncode == 0


@pytest.mark.timeout(300)
def test_a_deleted_gate_report_fails_the_audit(promoted: Promoted) -> None:
    report = promoted.evidence / "gate-report-01-step00.md"
    saved = promoted.root / "saved-report.md"
    shutil.copy2(report, saved)
    tag = "revgate.digest.gate-report-01-step00.md"
    try:
        report.unlink()
        promoted.ledger.client.delete_tag(promoted.run_id, tag)  # no digest tag left to miss it
        audited = promoted.audit()
        assert audited.returncode == 4, audited.stdout + audited.stderr
        assert "gate report evidence/gate-report-01-step00.md, signed in the release attestation" in audited.stdout
        assert "is missing from run" in audited.stdout
    finally:
        shutil.copy2(saved, report)
        promoted.retag("gate-report-01-step00.md", report)
    assert promoted.audit().returncode == 0


@pytest.mark.timeout(300)
def test_a_route_history_without_the_decisions_attestation_fails_the_audit(promoted: Promoted) -> None:
    folder = Path(promoted.routes) / ROUTE
    files = [path for path in (folder / "history").iterdir() if path.stem.lstrip("0") == str(promoted.generation)]
    [entry] = files
    saved = {path: path.read_bytes() for path in (entry, folder / "current.json")}
    try:
        for path in saved:  # the attacker rewrites the decision's generation without its attestation
            document = json.loads(path.read_bytes())
            document["decision_attestation"] = None
            path.write_bytes(RouteSnapshot.build(**document).canonical())
        audited = promoted.audit()
        assert audited.returncode == 4, audited.stdout + audited.stderr
        assert f"route {ROUTE} generation {promoted.generation} in {promoted.routes} records attestation (none)" \
            in audited.stdout
        assert f"revgate route history {ROUTE} --routes" in audited.stdout
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
    assert promoted.audit().returncode == 0


@pytest.mark.timeout(300)
def test_an_attestation_the_route_records_but_the_run_lost_fails_the_audit(promoted: Promoted) -> None:
    envelope = promoted.evidence / "release-attestation.json"
    saved = envelope.read_bytes()
    try:
        envelope.unlink()
        promoted.ledger.client.delete_tag(promoted.run_id, "revgate.digest.release-attestation")
        audited = promoted.audit()
        assert audited.returncode == 4, audited.stdout + audited.stderr
        assert "holds no release attestation" in audited.stdout
        assert "no run of it holds that attestation" in audited.stdout
    finally:
        envelope.write_bytes(saved)
        promoted.retag("release-attestation", envelope)
    assert promoted.audit().returncode == 0


@pytest.mark.timeout(300)
def test_the_wrong_controller_key_fails_the_audit(promoted: Promoted) -> None:
    audited = promoted.audit(controller=promoted.keys["mallory"].public)
    assert audited.returncode == 4, audited.stdout + audited.stderr
    assert "does not verify with the trusted controller key" in audited.stdout
    assert "not the trusted controller key" in audited.stdout
