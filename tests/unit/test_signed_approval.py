"""Signed approvals: the plan's fields, the pure decision over a checked signature, the audit's reading of
it, and the signature itself (real EC keys, OpenSSF model-signing format)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from revgate.manifests import ManifestInvalid
from revgate.manifests.rollout import Analyze, ApprovalStatement, Approve, RolloutPlan
from revgate.promotion.approval import Answer, AnswerRefused, FormShown, SignatureCheck, decide
from revgate.promotion.machine import ApprovalGiven
from revgate.registry.audit import (
    ApprovalRecord,
    RunEvidence,
    SignatureAudit,
    audit_json,
    counted_approvals,
    render,
    statement_problem,
)
from revgate.registry.errors import SignatureInvalid, UntrustedSigner
from revgate.registry.signing import key_fingerprint, sign_approval, signature_key_hint, verify_approval
from tests.integration.signing_material import write_key

SHOWN = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
LIST = ("alice@example.com", "bob")
FORM = FormShown("chat", "run-1", SHOWN)
STEPS = (Analyze(max_samples=10), Approve())


def statement(**changes: object) -> ApprovalStatement:
    fields: dict[str, object] = {"route": "chat", "flow_run_id": "run-1", "evidence_digest": SHOWN,
                                 "approver": "alice@example.com", "approve": True, "comment": "fine"}
    return ApprovalStatement.build(**{**fields, **changes})


def answer(approve: bool = True, digest: str = SHOWN, approver: str = "alice@example.com") -> Answer:
    return Answer(approver, approve, digest, "fine")


def verified(**changes: object) -> SignatureCheck:
    return SignatureCheck("verified", statement(**changes), signer="sha256:" + "f" * 64)


def refusal(result: ApprovalGiven | AnswerRefused) -> str:
    assert isinstance(result, AnswerRefused), result
    return result.why


# --- the plan -------------------------------------------------------------------------------------


def test_old_plans_need_no_signature_and_a_signed_plan_names_a_key_for_each_approver() -> None:
    assert RolloutPlan(steps=STEPS).signed_approval is False
    plan = RolloutPlan(steps=STEPS, approvers=LIST, signed_approval=True,
                       approver_keys={"Alice@Example.com": "keys/alice.pub", "bob": "keys/bob.pub"})
    assert plan.approver_key(" ALICE@example.com ") == "keys/alice.pub"
    assert plan.approver_key("mallory") is None
    assert RolloutPlan.from_json(plan.canonical()) == plan  # the plan keeps its keys through its evidence copy


@pytest.mark.parametrize(("fields", "says"), [
    ({"approvers": LIST, "signed_approval": True, "approver_keys": {"alice@example.com": "a.pub"}},
     "no public key for bob"),
    ({"signed_approval": True}, "signed_approval needs approvers"),
    ({"approvers": ("bob",), "approver_keys": {"bob": "b.pub", "mallory": "m.pub"}}, "mallory, not in approvers"),
    ({"approvers": ("bob",), "signed_approval": True, "approver_keys": {"bob": " "}}, "not empty"),
])
def test_a_signed_plan_without_a_key_for_a_listed_approver_is_refused(fields: dict[str, object], says: str) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        RolloutPlan.build(steps=[step.model_dump() for step in STEPS], **fields)
    assert says in str(caught.value)


# --- the decision ---------------------------------------------------------------------------------


@pytest.mark.parametrize("approve", [True, False])
def test_a_verified_statement_that_says_what_the_answer_says_decides(approve: bool) -> None:
    given = decide(answer(approve), shown=SHOWN, approvers=LIST, signature=verified(approve=approve), form=FORM)
    assert given == ApprovalGiven(approve, SHOWN, by="alice@example.com")


@pytest.mark.parametrize(("check", "why"), [
    (SignatureCheck("unsigned"), "unsigned"),
    (SignatureCheck("invalid", detail="malformed bundle"), "bad-signature"),
    (SignatureCheck("wrong-key", detail="signed with key sha256:99"), "wrong-key"),
    (SignatureCheck("verified"), "bad-signature"),  # verified, yet nothing it vouches for: not a signature
])
@pytest.mark.parametrize("approve", [True, False])
def test_an_answer_without_a_good_signature_neither_approves_nor_rejects(
    check: SignatureCheck, why: str, approve: bool
) -> None:
    assert refusal(decide(answer(approve), shown=SHOWN, approvers=LIST, signature=check, form=FORM)) == why


def test_the_refusals_say_how_to_answer_and_which_key_signed() -> None:
    unsigned = decide(answer(), shown=SHOWN, approvers=LIST, signature=SignatureCheck("unsigned"), form=FORM)
    assert isinstance(unsigned, AnswerRefused) and "revgate approve" in unsigned.message
    wrong = decide(answer(), shown=SHOWN, approvers=LIST, form=FORM,
                   signature=SignatureCheck("wrong-key", detail="signed with key sha256:99"))
    assert isinstance(wrong, AnswerRefused) and "sha256:99" in wrong.message and "`alice@example.com`" in wrong.message


@pytest.mark.parametrize(("changes", "why"), [
    ({"approver": "bob"}, "other-statement"),
    ({"approve": False}, "other-statement"),
    ({"comment": "edited"}, "other-statement"),
    ({"evidence_digest": OTHER}, "other-statement"),  # the statement disagrees with the answer sent
    ({"route": "other-route"}, "other-statement"),
    ({"flow_run_id": "run-2"}, "other-statement"),  # signed for another paused run
])
def test_a_statement_about_something_else_decides_nothing(changes: dict[str, object], why: str) -> None:
    assert refusal(decide(answer(), shown=SHOWN, approvers=LIST, signature=verified(**changes), form=FORM)) == why


@pytest.mark.parametrize("approve", [True, False])
def test_a_signed_answer_about_other_evidence_decides_nothing_even_a_rejection(approve: bool) -> None:
    """Unsigned, a rejection of other evidence still stops; signed, the statement must name this form's evidence."""
    signed = verified(evidence_digest=OTHER, approve=approve)
    assert refusal(decide(answer(approve, digest=OTHER), shown=SHOWN, approvers=LIST, signature=signed,
                          form=FORM)) == "other-evidence"


def test_names_are_compared_case_insensitively_and_the_allow_list_comes_first() -> None:
    given = decide(answer(approver="ALICE@example.com"), shown=SHOWN, approvers=LIST, signature=verified(), form=FORM)
    assert given == ApprovalGiven(True, SHOWN, by="ALICE@example.com")
    stranger = decide(answer(approver="mallory"), shown=SHOWN, approvers=LIST, signature=verified(), form=FORM)
    assert refusal(stranger) == "not-allowed"


def test_without_a_signature_check_the_plan_asks_for_none() -> None:
    assert decide(answer(), shown=SHOWN, approvers=LIST) == ApprovalGiven(True, SHOWN, by="alice@example.com")


# --- the signature ------------------------------------------------------------------------------


def test_an_approval_signature_verifies_only_over_its_statement_with_its_key(tmp_path: Path) -> None:
    alice = write_key(tmp_path, "alice")[0]
    mallory = write_key(tmp_path, "mallory")[0]
    signed = statement().canonical()
    bundle = sign_approval(signed, alice.private)
    fingerprint = key_fingerprint(alice.public.read_text())
    assert signature_key_hint(bundle) == fingerprint
    assert verify_approval(signed, bundle, alice.public.read_text()).fingerprint == fingerprint
    with pytest.raises(UntrustedSigner):
        verify_approval(signed, bundle, mallory.public.read_text())
    with pytest.raises(SignatureInvalid, match="other bytes"):
        verify_approval(statement(approve=False).canonical(), bundle, alice.public.read_text())
    with pytest.raises(SignatureInvalid):
        verify_approval(signed, bundle.replace('"', "'", 3), alice.public.read_text())


# --- the audit ------------------------------------------------------------------------------------


def test_counted_answers_are_read_in_order_apart_from_refused_ones_and_signature_files() -> None:
    names = ["approval-10", "approval-2", "approval", "approval-2-signature", "approval-unsigned-1",
             "approval-statement", "approval-of-other-evidence-3"]
    assert counted_approvals(names) == ["approval", "approval-2", "approval-10"]


def test_a_statement_that_disagrees_with_the_recorded_answer_is_named() -> None:
    recorded = {"approver": "Alice@example.com", "approve": True, "evidence_digest": SHOWN, "comment": "fine"}
    assert statement_problem(recorded, statement().canonical()) == ""
    assert "approve" in statement_problem(recorded, statement(approve=False).canonical())
    assert "another approver" in statement_problem(recorded, statement(approver="bob").canonical())
    assert "not JSON" in statement_problem(recorded, b"{")


def run_with(*records: ApprovalRecord) -> RunEvidence:
    first = records[0].answer if records else None
    return RunEvidence("r1", "chat", "sha256:" + "2" * 64, "promoted", 1, (), (), first, approvals=records)


def test_the_audit_shows_who_signed_with_which_key_and_whether_it_verifies() -> None:
    answer_json = {"approver": "alice@example.com", "approve": True, "evidence_digest": SHOWN, "comment": "fine"}
    good = ApprovalRecord("approval", answer_json, "gate-report-01-step01", SignatureAudit("sha256:ff", True))
    typed = ApprovalRecord("approval-2", {**answer_json, "approver": "bob"}, None, None)
    text = render([run_with(good, typed)], {})
    assert "approval: approved by alice@example.com" in text
    assert "signed with key sha256:ff: signature verified" in text
    assert "approval-2: approved by bob" in text and "unsigned" in text
    assert "evidence intact" in text and run_with(good, typed).intact
    bad = ApprovalRecord("approval", answer_json, None, SignatureAudit("sha256:ff", False, "over other bytes"))
    broken = run_with(bad)
    assert not broken.intact
    assert "SIGNATURE DOES NOT VERIFY (key sha256:ff): over other bytes" in render([broken], {})
    assert "evidence intact" not in render([broken], {})
    listed = audit_json([broken], {})["runs"][0]["approvals"][0]
    assert (listed["signed"], listed["key_fingerprint"], listed["signature_verified"]) == (True, "sha256:ff", False)
    assert json.dumps(listed)  # JSON-ready
