"""The MLflow evidence ledger on a real SQLite tracking store: what an auditor reads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifests import ArtifactManifest
from manifests.canonical import sha256_digest
from registry.ledger import EvidenceLedger, sqlite_uri

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
