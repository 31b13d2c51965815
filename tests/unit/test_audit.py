"""The auditor's verdict on evidence documents, from recorded digests and the bytes stored now."""

from __future__ import annotations

from revgate.manifests.canonical import sha256_digest
from revgate.registry.audit import RunEvidence, check_documents, recorded_digests, recorded_steps, render, report_for

STORED = {"gate-report-01-step01": b'{"outcome":"pass"}', "artifact-manifest": b'{"entries":[]}'}


def run_with(documents: dict[str, bytes | None], recorded: dict[str, str]) -> RunEvidence:
    checks = check_documents(recorded, documents.get)
    return RunEvidence("r1", "chat", "sha256:" + "2" * 64, "promoted", 1, (("verify", "pass"),), checks, None)


def test_tags_name_the_documents_and_steps() -> None:
    tags = {"revgate.digest.a": "sha256:1", "revgate.step.verify": "pass", "revgate.route": "chat"}
    assert recorded_digests(tags) == {"a": "sha256:1"}
    assert recorded_steps(tags) == (("verify", "pass"),)


def test_untouched_documents_are_intact() -> None:
    run = run_with(dict(STORED), {name: sha256_digest(data) for name, data in STORED.items()})
    assert run.intact and {c.status for c in run.documents} == {"ok"}
    assert render([run], {"stable": "3"}).splitlines()[-2:] == [
        "alias stable -> version 3",
        "evidence intact: 2 document(s) in 1 run(s) match their recorded digests",
    ]


def test_an_edited_byte_or_a_lost_document_is_named_with_both_digests() -> None:
    recorded = {name: sha256_digest(data) for name, data in STORED.items()}
    run = run_with({"gate-report-01-step01": b'{"outcome":"fail"}'}, recorded)
    statuses = {c.name: c.status for c in run.documents}
    assert statuses == {"gate-report-01-step01": "mismatch", "artifact-manifest": "missing"} and not run.intact
    text = render([run], {})
    assert f"mismatch evidence/gate-report-01-step01.json  expected {recorded['gate-report-01-step01']}" in text
    assert "missing  evidence/artifact-manifest.json" in text and "stored nothing" in text
    assert text.endswith("EVIDENCE ALTERED OR LOST: 2 document(s); the decisions above are unproven")


def test_an_approval_is_tied_to_the_gate_report_whose_evidence_it_names() -> None:
    reports = {
        "gate-report-01-step01": b'{"evidence_digest":"sha256:aaa","outcome":"pass"}',
        "gate-report-02-step04": b'{"evidence_digest":"sha256:bbb","outcome":"pass"}',
        "plan": b'{"evidence_digest":"sha256:bbb"}',
    }
    assert report_for({"approve": True, "evidence_digest": "sha256:bbb"}, reports) == "gate-report-02-step04"
    assert report_for({"approve": True, "evidence_digest": "sha256:ccc"}, reports) is None
    assert report_for(None, reports) is None
