"""The signed release decision: the statement built from frozen facts, its DSSE signature (real EC keys), the
route field that records it on the deciding write only, and the audit's check of it against the run and the
route's history, each way of tampering with either."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from revgate.manifests import ManifestInvalid
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.promotion.machine import RolloutState
from revgate.promotion.routes import desired_route, renew_leases
from revgate.registry.attestation import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    ApprovalEntry,
    AttestationUnreadable,
    Digested,
    ReleaseDecision,
    RunFacts,
    attestation_names,
    attested_at,
    history_problem,
    parse_statement,
    predicate_problems,
    statement,
    statement_bytes,
    statement_digest,
    unheld_attestations,
)
from revgate.registry.audit import AttestationCheck, RunEvidence, anchor_in_history, render
from revgate.registry.errors import SignatureInvalid, SigningError, UntrustedSigner
from revgate.registry.signing import load_controller_key, sign_statement, verify_statement
from tests.integration.signing_material import write_key

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))
REPORT, MARKDOWN = "sha256:" + "a" * 64, "sha256:" + "b" * 64
ANSWER, SIGNATURE = "sha256:" + "c" * 64, "sha256:" + "d" * 64
EVIDENCE = "sha256:" + "e" * 64
ATTESTED = "sha256:" + "f" * 64


def decision(**changes: object) -> ReleaseDecision:
    fields: dict[str, object] = dict(
        route="chat", generation=4, candidate=CANDIDATE.fingerprint, stable=STABLE.fingerprint,
        evidence_digest=EVIDENCE,
        gate_reports=(Digested("gate-report-01-step01", REPORT), Digested("gate-report-01-step01.md", MARKDOWN)),
        approvals=(ApprovalEntry("approval", ANSWER, "alice@example.com", True, "2026-12-01T11:59:00+00:00",
                                 SIGNATURE),),
        decision="promoted", reason="every step passed", evidence_run="run-1", flow_run_id="flow-1",
        decided_at="2026-12-01T12:00:00+00:00")
    return ReleaseDecision(**{**fields, **changes})  # type: ignore[arg-type]


def facts(**changes: object) -> RunFacts:
    stored = {"gate-report-01-step01": REPORT, "gate-report-01-step01.md": MARKDOWN, "approval": ANSWER,
              "approval-signature": SIGNATURE, "plan": "sha256:" + "9" * 64}
    fields: dict[str, object] = dict(
        run_id="run-1", route="chat", candidate=CANDIDATE.fingerprint, flow_run_id="flow-1", decision="promoted",
        stored=stored, report_evidence={"gate-report-01-step01": EVIDENCE}, counted=("approval",))
    return RunFacts(**{**fields, **changes})  # type: ignore[arg-type]


def history(attestation: str | None = ATTESTED) -> list[RouteSnapshot]:
    first = RouteSnapshot(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    second = successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 100_000, NOW, 60))
    third = successor(second, by="flow", now=NOW, candidate=canary(CANDIDATE, 500_000, NOW, 60))
    promoted = desired_route(third, RolloutState(status="promoted"), CANDIDATE, lease_seconds=60, by="flow", now=NOW,
                             attestation=attestation)
    assert promoted is not None
    return [first, second, third, promoted]


# --- the statement ------------------------------------------------------------------------------


def test_the_statement_is_an_in_toto_v1_statement_about_the_candidate_with_the_decisions_facts() -> None:
    said = statement(decision())
    assert said["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert said["predicateType"] == PREDICATE_TYPE
    assert said["subject"] == [{"name": "service-revision", "digest": {"sha256": "2" * 64}}]
    predicate = said["predicate"]
    assert (predicate["route"], predicate["route_generation"], predicate["decision"]) == ("chat", 4, "promoted")
    assert (predicate["candidate"], predicate["stable"]) == (CANDIDATE.fingerprint, STABLE.fingerprint)
    assert predicate["evidence_digest"] == EVIDENCE
    assert predicate["gate_reports"][0] == {"name": "gate-report-01-step01", "digest": REPORT}
    assert predicate["approvals"][0]["approver"] == "alice@example.com"
    assert predicate["approvals"][0]["signature_digest"] == SIGNATURE


def test_the_statement_reads_back_as_the_decision_it_was_built_from() -> None:
    payload = statement_bytes(decision())
    assert json.loads(payload) == statement(decision())
    assert parse_statement(payload, where="x") == decision()
    assert statement_digest(payload).startswith("sha256:") and len(statement_digest(payload)) == 71


def test_another_statement_or_a_subject_that_is_not_the_candidate_is_unreadable() -> None:
    other = {**statement(decision()), "predicateType": "https://slsa.dev/provenance/v1"}
    with pytest.raises(AttestationUnreadable, match="not a release decision"):
        parse_statement(json.dumps(other).encode(), where="x")
    moved = {**statement(decision()), "subject": [{"name": "service-revision", "digest": {"sha256": "3" * 64}}]}
    with pytest.raises(AttestationUnreadable, match="subject is not the candidate"):
        parse_statement(json.dumps(moved).encode(), where="x")


def test_attestations_of_a_run_are_in_the_order_they_were_made() -> None:
    names = ["release-attestation-2", "approval", "release-attestation", "release-attestation-10"]
    assert attestation_names(names) == ["release-attestation", "release-attestation-2", "release-attestation-10"]


# --- the signature ------------------------------------------------------------------------------


def test_a_signed_statement_verifies_only_with_the_controllers_key_and_only_unchanged(tmp_path: Path) -> None:
    controller = write_key(tmp_path, "controller")[0]
    mallory = write_key(tmp_path, "mallory")[0]
    key = load_controller_key(controller.private)
    payload = statement_bytes(decision())
    bundle = sign_statement(payload, key)
    envelope = json.loads(bundle)["dsseEnvelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(envelope["payload"]) == payload
    verified = verify_statement(bundle, controller.public.read_text())
    assert (verified.payload, verified.fingerprint) == (payload, key.fingerprint)
    with pytest.raises(UntrustedSigner, match="not the trusted controller key"):
        verify_statement(bundle, mallory.public.read_text())
    edited = json.loads(bundle)
    edited["dsseEnvelope"]["payload"] = base64.b64encode(statement_bytes(decision(decision="rolled_back"))).decode()
    with pytest.raises(SignatureInvalid, match="does not verify"):
        verify_statement(json.dumps(edited), controller.public.read_text())
    # A forger's own key, named in the bundle as the controller's, still fails the trusted key's check.
    forged = json.loads(sign_statement(payload, load_controller_key(mallory.private)))
    forged["verificationMaterial"]["publicKey"]["hint"] = key.fingerprint.removeprefix("sha256:")
    with pytest.raises(SignatureInvalid, match="does not verify"):
        verify_statement(json.dumps(forged), controller.public.read_text())
    with pytest.raises(SignatureInvalid, match="not a DSSE bundle"):
        verify_statement("{}", controller.public.read_text())


def test_a_controller_key_that_cannot_sign_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="cannot read the controller's signing key") as caught:
        load_controller_key(tmp_path / "missing.pem")
    assert "missing.pem" in str(caught.value.where) and "controller_key_file" in caught.value.fix
    public_only = write_key(tmp_path, "c")[0].public
    with pytest.raises(SigningError):
        load_controller_key(public_only)


# --- the route field ----------------------------------------------------------------------------


def test_only_the_deciding_write_carries_the_attestation_and_every_later_write_clears_it() -> None:
    written = history()
    assert [s.decision_attestation for s in written] == [None, None, None, ATTESTED]
    promoted = written[-1]
    assert promoted.stable.fingerprint == CANDIDATE.fingerprint
    # Another rollout's next write, an operator's change, a lease renewal: none copies the old decision's digest.
    later = successor(promoted, by="oncall", now=NOW, max_retries=2)
    assert later.decision_attestation is None
    leased = successor(promoted, by="flow", now=NOW, candidate=canary(STABLE, 100_000, NOW, 60))
    assert renew_leases(leased, lease_seconds=60, by="flow", now=NOW).decision_attestation is None
    running = desired_route(promoted, RolloutState(weight_ppm=100_000), STABLE, lease_seconds=60, by="flow", now=NOW,
                            attestation=ATTESTED)
    assert running is not None and running.decision_attestation is None  # not a decision: never attested


def test_a_rollback_with_nothing_to_take_away_still_writes_its_attestation() -> None:
    first = history()[0]
    rolled = desired_route(first, RolloutState(status="rolled_back"), CANDIDATE, lease_seconds=60, by="f", now=NOW,
                           attestation=ATTESTED)
    assert rolled is not None and rolled.generation == 2 and rolled.decision_attestation == ATTESTED
    assert desired_route(first, RolloutState(status="rolled_back"), CANDIDATE, lease_seconds=60, by="f",
                         now=NOW) is None  # unsigned: no write, as before


def test_the_route_refuses_an_attestation_that_is_not_a_digest() -> None:
    with pytest.raises(ManifestInvalid, match="decision_attestation must be sha256"):
        RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="t", created_at=NOW,
                            decision_attestation="sha256:short")


# --- the audit: the signed predicate against the run ----------------------------------------------


def test_a_run_that_holds_what_was_signed_has_no_problem() -> None:
    assert predicate_problems(decision(), facts(), where="the attestation", final=True) == []


def test_a_gate_report_edited_with_its_digest_tag_is_caught_by_the_signed_digest() -> None:
    edited = facts(stored={**facts().stored, "gate-report-01-step01": "sha256:" + "0" * 64})
    [problem] = predicate_problems(decision(), edited, where="the attestation", final=True)
    assert "gate report evidence/gate-report-01-step01 in run run-1 hashes to sha256:000" in problem
    assert f"the attestation signed {REPORT}" in problem and "Restore the original" in problem


def test_a_deleted_gate_report_is_missing_from_the_run() -> None:
    stored = {name: digest for name, digest in facts().stored.items() if name != "gate-report-01-step01.md"}
    [problem] = predicate_problems(decision(), facts(stored=stored), where="the attestation", final=True)
    assert "gate report evidence/gate-report-01-step01.md, signed in the attestation, is missing from run run-1" \
        in problem and "deleted after the decision" in problem


def test_an_approval_or_its_signature_changed_or_an_answer_added_after_the_decision() -> None:
    changed = facts(stored={**facts().stored, "approval-signature": "sha256:" + "0" * 64})
    [problem] = predicate_problems(decision(), changed, where="the attestation", final=True)
    assert "approval signature evidence/approval-signature in run run-1 hashes to" in problem
    added = facts(stored={**facts().stored, "approval-2": ANSWER}, counted=("approval", "approval-2"))
    [problem] = predicate_problems(decision(), added, where="the attestation", final=True)
    assert "approval evidence/approval-2 in run run-1 is not in the attestation: it was added after" in problem


def test_a_gate_report_added_after_the_decision_or_another_decision_tag() -> None:
    added = facts(stored={**facts().stored, "gate-report-02-step03": REPORT})
    [problem] = predicate_problems(decision(), added, where="the attestation", final=True)
    assert "gate report evidence/gate-report-02-step03 in run run-1 is not in the attestation" in problem
    assert predicate_problems(decision(), added, where="the attestation", final=False) == []  # an earlier decision
    [problem] = predicate_problems(decision(), facts(decision="rolled_back"), where="the attestation", final=True)
    assert "tagged decision rolled_back, but the attestation signs promoted (every step passed)" in problem


def test_an_attestation_copied_from_another_run_or_route_is_refused() -> None:
    problems = predicate_problems(decision(evidence_run="run-0", route="other"), facts(), where="it", final=True)
    assert any("for evidence run run-0, but run run-1 is for run-1: it was copied" in p for p in problems)
    assert any("for route other" in p for p in problems)


def test_the_signed_evidence_digest_must_be_the_latest_reports() -> None:
    [problem] = predicate_problems(decision(evidence_digest=ATTESTED), facts(), where="it", final=True)
    assert f"signs evidence {ATTESTED}, but the latest gate report it lists" in problem


# --- the audit: the signed decision against the route's history -------------------------------------


def test_the_route_records_the_decision_at_its_generation() -> None:
    assert history_problem(decision(), ATTESTED, attested_at(history()), where="it", store="routes") == ""


def test_a_history_without_the_attestation_or_with_another_is_caught() -> None:
    stripped = history(attestation=None)
    problem = history_problem(decision(), ATTESTED, attested_at(stripped), where="it", store="routes")
    assert f"route chat generation 4 in routes records attestation (none), not it's {ATTESTED}" in problem
    assert "revgate route history chat --routes routes" in problem
    altered = history(attestation="sha256:" + "0" * 64)
    assert "records attestation sha256:000" in history_problem(decision(), ATTESTED, attested_at(altered), where="it",
                                                               store="routes")
    assert "has no generation 4 in routes" in history_problem(decision(), ATTESTED, attested_at(history()[:3]),
                                                              where="it", store="routes")
    wrong = history_problem(decision(decision="rolled_back"), ATTESTED, attested_at(history()), where="it",
                            store="routes")
    assert "serves 222222222222 as stable, which is not what it decided (rolled_back)" in wrong


def test_a_decision_the_history_records_that_no_run_holds_is_caught_and_others_decisions_are_not() -> None:
    [problem] = unheld_attestations(history(), CANDIDATE.fingerprint, [], store="routes")
    assert f"route chat generation 4 in routes records release attestation {ATTESTED}" in problem
    assert "no run of it holds that attestation" in problem
    assert unheld_attestations(history(), CANDIDATE.fingerprint, [ATTESTED], store="routes") == []
    # The next rollout's decision, about another revision, is that revision's audit's.
    other = RevisionTarget(fingerprint="sha256:" + "3" * 64, endpoints=("http://127.0.0.1:8003",))
    trying = successor(history()[-1], by="flow", now=NOW, candidate=canary(other, 100_000, NOW, 60))
    back = desired_route(trying, RolloutState(status="rolled_back"), other, lease_seconds=60, by="flow", now=NOW,
                         attestation="sha256:" + "4" * 64)
    assert back is not None
    assert unheld_attestations([*history(), trying, back], CANDIDATE.fingerprint, [ATTESTED], store="routes") == []


def run_evidence(check: AttestationCheck | None) -> RunEvidence:
    return RunEvidence(run_id="run-1", route="chat", candidate=CANDIDATE.fingerprint, decision="promoted",
                       started_ms=1, steps=(), documents=(), approval=None,
                       attestations=(check,) if check is not None else ())


def test_the_audit_of_a_run_fails_on_each_problem_and_says_which() -> None:
    verified = AttestationCheck("release-attestation", ATTESTED, "promoted", 4, "sha256:" + "7" * 64, (), decision())
    [good] = anchor_in_history([run_evidence(verified)], history(), "routes")
    assert good.intact
    assert "signed with controller key sha256:777" in render([good], {})
    [stripped] = anchor_in_history([run_evidence(verified)], history(attestation=None), "routes")
    assert not stripped.intact and "RELEASE DECISIONS THAT DO NOT VERIFY: 1" in render([stripped], {})
    [unanchored] = anchor_in_history([run_evidence(verified)], None, "")
    assert not unanchored.intact and "give --routes STORE" in unanchored.attestations[0].problems[0]
    [lost] = anchor_in_history([run_evidence(None)], history(), "routes")
    assert not lost.intact and "no run of it holds that attestation" in lost.attestation_problems[0]
    unsigned = replace(run_evidence(None), unattested="no controller key given")
    [accepted] = anchor_in_history([unsigned], history(attestation=None), "routes")
    assert accepted.intact and "release decision not attested: no controller key given" in render([accepted], {})


def test_an_auditor_trusts_the_sites_controller_key_never_a_private_one(tmp_path: Path) -> None:
    from revgate.cli.evidence import ControllerKeyInvalid, read_public_key
    from revgate.flows.site import RouteSite

    pair = write_key(tmp_path, "controller")[0]
    assert "controller_public_key" in RouteSite.model_fields and "controller_key_file" in RouteSite.model_fields
    assert read_public_key(str(pair.public), "--controller-key") == pair.public.read_text()
    with pytest.raises(ControllerKeyInvalid, match="holds no PEM public key") as caught:
        read_public_key(str(pair.private), "--controller-key")
    assert "never its private key" in caught.value.fix
    with pytest.raises(ControllerKeyInvalid, match="cannot read the controller's public key"):
        read_public_key(str(tmp_path / "none.pub"), "--controller-key")
