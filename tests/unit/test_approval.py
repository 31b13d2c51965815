"""Whether an answer to the approval form counts: who answered, and for which evidence (pure logic)."""

from __future__ import annotations

import pytest

from revgate.manifests import ManifestInvalid
from revgate.manifests.rollout import Analyze, Approve, RolloutPlan, SetWeight, Shadow
from revgate.promotion.approval import Answer, AnswerRefused, allow_list_line, decide, is_allowed
from revgate.promotion.machine import ApprovalGiven, GateDecided, StepApplied, advance, start

SHOWN = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
LIST = ("alice@example.com", "Bob Builder")


def answer(approver: str, approve: bool = True, digest: str = SHOWN) -> Answer:
    return Answer(approver=approver, approve=approve, evidence_digest=digest, comment="c")


def test_an_approval_by_a_listed_person_of_the_evidence_shown_names_them() -> None:
    assert decide(answer("alice@example.com"), shown=SHOWN, approvers=LIST) == ApprovalGiven(
        True, SHOWN, by="alice@example.com")


def test_names_are_compared_trimmed_and_case_insensitively_and_recorded_trimmed() -> None:
    given = decide(answer("  ALICE@Example.com "), shown=SHOWN, approvers=LIST)
    assert given == ApprovalGiven(True, SHOWN, by="ALICE@Example.com")
    assert is_allowed("bob builder", LIST) and not is_allowed("bob", LIST)


@pytest.mark.parametrize("approve", [True, False])
def test_an_answer_from_someone_not_on_the_list_decides_nothing_and_says_who(approve: bool) -> None:
    refused = decide(answer("mallory@example.com", approve=approve), shown=SHOWN, approvers=LIST)
    assert isinstance(refused, AnswerRefused) and refused.why == "not-allowed"
    assert "`mallory@example.com`" in refused.message and "allow-list" in refused.message


def test_an_empty_list_lets_anyone_named_answer() -> None:
    assert decide(answer("carol"), shown=SHOWN, approvers=()) == ApprovalGiven(True, SHOWN, by="carol")
    assert decide(answer("carol", approve=False), shown=SHOWN, approvers=()) == ApprovalGiven(False, SHOWN, by="carol")


@pytest.mark.parametrize("approvers", [(), LIST])
def test_an_answer_that_names_nobody_decides_nothing(approvers: tuple[str, ...]) -> None:
    refused = decide(answer("   "), shown=SHOWN, approvers=approvers)
    assert isinstance(refused, AnswerRefused) and refused.why == "unnamed"


def test_an_approval_of_other_evidence_decides_nothing_but_a_rejection_of_it_stops() -> None:
    refused = decide(answer("Bob Builder", digest=OTHER), shown=SHOWN, approvers=LIST)
    assert isinstance(refused, AnswerRefused) and refused.why == "other-evidence" and OTHER in refused.message
    assert decide(answer("Bob Builder", approve=False, digest=OTHER), shown=SHOWN, approvers=LIST) == ApprovalGiven(
        False, OTHER, by="Bob Builder")


def test_the_person_is_checked_before_the_evidence() -> None:
    refused = decide(answer("mallory", digest=OTHER), shown=SHOWN, approvers=LIST)
    assert isinstance(refused, AnswerRefused) and refused.why == "not-allowed"


def test_typed_names_show_as_text_in_the_form_not_as_markup() -> None:
    refused = decide(answer("<img src=x>`**boss**`\n# heading"), shown=SHOWN, approvers=LIST)
    assert isinstance(refused, AnswerRefused)
    assert "`<img src=x>'**boss**' # heading`" in refused.message and "\n" not in refused.message


def test_the_form_says_who_may_answer() -> None:
    assert "`alice@example.com`, `Bob Builder`" in allow_list_line(LIST)
    assert "Any release manager" in allow_list_line(())


def test_the_plan_holds_the_allow_list_empty_by_default_and_refuses_blank_or_repeated_names() -> None:
    steps = [Shadow(sample_ppm=100_000), Analyze(max_samples=100), Approve(), SetWeight(weight_ppm=50_000)]
    assert RolloutPlan.build(steps=steps).approvers == ()
    plan = RolloutPlan.build(steps=steps, approvers=list(LIST))
    assert RolloutPlan.from_json(plan.canonical()) == plan and plan.approvers == LIST
    for bad in (["alice", " "], [" alice"], ["alice", "ALICE"]):
        with pytest.raises(ManifestInvalid, match="approvers"):
            RolloutPlan.build(steps=steps, approvers=bad)


def test_the_state_machine_keeps_who_approved() -> None:
    steps = [Shadow(sample_ppm=100_000), Analyze(max_samples=100), Approve(), SetWeight(weight_ppm=50_000)]
    plan = RolloutPlan.build(steps=steps, approvers=list(LIST))
    state = advance(plan, advance(plan, start(plan), StepApplied()), GateDecided("pass", report_digest=SHOWN))
    given = decide(answer("alice@example.com"), shown=state.evidence_digest, approvers=plan.approvers)
    assert isinstance(given, ApprovalGiven)
    after = advance(plan, state, given)
    assert after.approved_by == "alice@example.com" and after.weight_ppm == 50_000
    rejected = decide(answer("Bob Builder", approve=False), shown=SHOWN, approvers=plan.approvers)
    assert isinstance(rejected, ApprovalGiven)
    assert advance(plan, state, rejected).reason == "rejected by Bob Builder"
