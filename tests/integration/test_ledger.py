"""The MLflow evidence ledger on a real SQLite tracking store: what an auditor reads back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from revgate.manifests import ArtifactManifest
from revgate.manifests.canonical import sha256_digest
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from tests.conftest import ROOT
from tests.integration.browser import browser_page
from tests.integration.commands import revgate

pytestmark = pytest.mark.servers




def manifest() -> ArtifactManifest:
    return ArtifactManifest.build(entries=[{"path": "config.json", "size": 3, "sha256": "b" * 64, "role": "config"}])


def test_an_auditor_can_check_evidence_against_its_digest(tmp_path: Path) -> None:
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("chat", "sha256:" + "2" * 64)
    digest = ledger.log_document(run, "artifact-manifest", manifest())
    ledger.log_step(run, "verify", "pass", {"seconds": 1.5})
    ledger.close(run, "promoted")

    stored = ledger.client.get_run(run.run_id)
    assert stored.data.tags["revgate.digest.artifact-manifest"] == digest
    assert stored.data.tags["revgate.step.verify"] == "pass"
    assert stored.data.tags["revgate.decision"] == "promoted"
    assert stored.info.status == "FINISHED"
    local = ledger.client.download_artifacts(run.run_id, "evidence/artifact-manifest.json", str(tmp_path))
    assert sha256_digest(Path(local).read_bytes()) == digest  # the bytes are the canonical document


def test_aliases_move_and_their_history_is_kept(tmp_path: Path) -> None:
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    first = ledger.open_run("chat", "sha256:" + "1" * 64)
    second = ledger.open_run("chat", "sha256:" + "2" * 64)
    v1 = ledger.register_version(first, "chat-model", "sha256:" + "1" * 64)
    v2 = ledger.register_version(second, "chat-model", "sha256:" + "2" * 64)
    ledger.move_alias("chat-model", "stable", v1, by="flow", generation=1)
    ledger.move_alias("chat-model", "stable", v2, by="flow", generation=4)

    assert str(ledger.client.get_model_version_by_alias("chat-model", "stable").version) == v2
    history = ledger.alias_history("chat-model")
    assert [(move["version"], move["route_generation"]) for move in history] == [(v1, 1), (v2, 4)]
    version = ledger.client.get_model_version("chat-model", v2)
    assert version.run_id == second.run_id
    assert version.tags["revgate.fingerprint"] == "sha256:" + "2" * 64


def promoted_run(tmp_path: Path, fingerprint: str) -> tuple[str, Path]:
    """A closed, promoted run with a manifest, a step, an approval and a registered version."""
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("chat", fingerprint)
    ledger.log_document(run, "artifact-manifest", manifest())
    ledger.log_document(run, "service-revision", manifest())
    ledger.log_step(run, "verify", "pass")
    answer = {"approve": True, "evidence_digest": "sha256:" + "e" * 64, "comment": "checked sort/long"}
    ledger.log_json(run, "approval", answer)
    version = ledger.register_version(run, "chat-model", fingerprint)
    ledger.move_alias("chat-model", "stable", version, by="flow", generation=3)
    ledger.close(run, "promoted")
    return run.run_id, Path(ledger.client.get_run(run.run_id).info.artifact_uri.removeprefix("file://"))


def test_an_auditor_traces_a_revision_and_finds_its_evidence_intact(tmp_path: Path) -> None:
    fingerprint = "sha256:" + "7" * 64
    run_id, _ = promoted_run(tmp_path, fingerprint)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    result = revgate("evidence", fingerprint[:19], "--tracking-uri", uri, "--model", "chat-model")
    assert result.returncode == 0, result.stderr
    assert f"run {run_id}  route chat  decision promoted" in result.stdout
    assert "steps: verify=pass" in result.stdout and "approval: approved for sha256:eeee" in result.stdout
    assert "bound to NO gate report of this run" in result.stdout  # this run logged none
    assert "ok       evidence/artifact-manifest.json" in result.stdout
    assert "alias stable -> version 1" in result.stdout
    assert result.stdout.rstrip().endswith("evidence intact: 3 document(s) in 1 run(s) match their recorded digests")
    as_json = revgate("evidence", fingerprint, "--tracking-uri", uri, "--model", "chat-model", "--json")
    audit = json.loads(as_json.stdout)
    assert [d["status"] for d in audit["runs"][0]["documents"]] == ["ok", "ok", "ok"]


def test_an_altered_or_lost_evidence_document_fails_the_audit(tmp_path: Path) -> None:
    fingerprint = "sha256:" + "8" * 64
    _, artifacts = promoted_run(tmp_path, fingerprint)
    edited = artifacts / "evidence" / "artifact-manifest.json"
    edited.write_bytes(edited.read_bytes().replace(b'"size":3', b'"size":4'))
    (artifacts / "evidence" / "service-revision.json").unlink()
    approval = artifacts / "evidence" / "approval.json"  # a comment changed after the fact
    approval.write_text(approval.read_text().replace("checked sort/long", "did not look"))
    result = revgate("evidence", fingerprint, "--tracking-uri", sqlite_uri(tmp_path / "mlflow.db"))
    assert result.returncode == 4, result.stdout + result.stderr
    assert f"mismatch evidence/artifact-manifest.json  expected {manifest().digest}, stored sha256:" in result.stdout
    assert "missing  evidence/service-revision.json" in result.stdout
    assert "mismatch evidence/approval.json" in result.stdout
    assert "EVIDENCE ALTERED OR LOST: 3 document(s)" in result.stdout


def test_auditing_an_unknown_revision_says_where_it_looked(tmp_path: Path) -> None:
    promoted_run(tmp_path, "sha256:" + "9" * 64)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    result = revgate("evidence", "sha256:0000", "--tracking-uri", uri)
    assert result.returncode == 2
    assert f"EvidenceNotFound: no promotion run of revision 'sha256:0000' at {uri}" in result.stderr


@pytest.mark.timeout(300)
def test_an_auditor_follows_a_model_version_to_its_evidence_in_the_mlflow_ui(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from revgate.flows.processes import mlflow_ui

    fingerprint = "sha256:" + "6" * 64
    promoted_run(tmp_path, fingerprint)
    with mlflow_ui(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "mlflow-server.log") as ui, browser_page() as page:
        # The registered version names the revision and links to the run that promoted it.
        page.goto(f"{ui}/#/models/chat-model/versions/1")
        expect(page.get_by_text(fingerprint[:20]).first).to_be_visible(timeout=60_000)
        page.get_by_role("link", name=f"promote {fingerprint[7:19]}").click(timeout=60_000)
        page.get_by_role("tab", name="Artifacts").click(timeout=60_000)
        # The run's evidence: the approval with the release manager's comment, readable in place.
        page.get_by_text("approval.json").click(timeout=60_000)
        expect(page.get_by_text('"checked sort/long"')).to_be_visible(timeout=60_000)
        page.get_by_text("artifact-manifest.json").click()
        expect(page.get_by_text('"config.json"')).to_be_visible(timeout=60_000)


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
folder, route = Path(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 120
while not (folder / "go").exists():  # every process opens the new store at the same moment
    if time.monotonic() > deadline:
        sys.exit("no start signal within 120 s")
    time.sleep(0.005)
ledger = EvidenceLedger(sqlite_uri(folder / "mlflow.db"), folder / "artifacts")
ledger.close(ledger.open_run(route, "sha256:" + "3" * 64), "promoted")
"""


def test_promotions_that_start_together_share_a_new_store(tmp_path: Path) -> None:
    # Two routes promoted at once on one worker both open the embedded store; the first use of a new
    # SQLite file creates MLflow's tables, and two creators at once broke one of the promotions.
    routes = [f"route-{index}" for index in range(4)]
    processes = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(tmp_path), route], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for route in routes]
    (tmp_path / "go").touch()
    printed = [process.communicate(timeout=240)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * len(routes), printed
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    assert {ledger.latest_run(route).data.tags["revgate.decision"] for route in routes} == {"promoted"}


def test_evidence_written_through_a_tracking_server_is_kept_by_the_server_not_the_writer(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from revgate.flows.processes import mlflow_ui

    kept = tmp_path / "ledger-host" / "artifacts"
    writer = tmp_path / "controller" / "evidence"  # the flow's evidence_root, on the controller's own disk
    with mlflow_ui(sqlite_uri(tmp_path / "ledger-host" / "mlflow.db"), tmp_path / "ledger-host" / "mlflow.log",
                   artifacts=kept) as url:
        ledger = EvidenceLedger(url, writer)
        run = ledger.open_run("chat", "sha256:" + "2" * 64)
        digest = ledger.log_document(run, "artifact-manifest", manifest())
        ledger.close(run, "promoted")
        # The experiment names the server's own artifact store, so any client of the server reads the files.
        experiment = MlflowClient(url).get_experiment(run.experiment_id)
        assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
        local = MlflowClient(url).download_artifacts(run.run_id, "evidence/artifact-manifest.json", str(tmp_path))
        assert sha256_digest(Path(local).read_bytes()) == digest
    assert [path.name for path in kept.rglob("artifact-manifest.json")] == ["artifact-manifest.json"]
    assert not writer.exists() or not any(writer.rglob("*.json")), list(writer.rglob("*"))


@pytest.mark.timeout(90)
def test_a_tracking_server_that_never_answers_is_an_error_within_the_ledgers_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The defect: the ledger's MLflow client kept MLflow's defaults (120 s for each answer, 7 retries with a
    # growing backoff): one unanswered request held the flow for many minutes before anything was said.
    import socket

    from mlflow.exceptions import MlflowException

    from revgate.registry import ledger

    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.setenv(name, "unset")  # restored to what it was (unset, here) after the test
        monkeypatch.delenv(name)
    monkeypatch.setattr(ledger, "HTTP_TIMEOUT_S", 2)
    monkeypatch.setattr(ledger, "HTTP_RETRIES", 0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # takes connections in, never answers
        with pytest.raises(MlflowException, match=r"(?i)timed out|timeout"):
            EvidenceLedger(f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path / "artifacts")
