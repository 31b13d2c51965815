"""Whether a release manager's answer decides an approve step: who answered, and for which evidence.

An answer counts only when it names a person the rollout plan allows (``RolloutPlan.approvers``;
an empty list lets anyone answer). Then a rejection stops the rollout whatever evidence it names,
and an approval moves it on only for the evidence shown above the form. Any other answer decides
nothing: the flow keeps it in the evidence and asks again, saying why (``AnswerRefused.message``).

The name is what the person typed: the open-source Prefect server does not know who resumed a run.
The allow-list keeps an answer from the wrong person from counting; who may reach the form at all
is decided in front of the server (docs/release-manager.md).

Where the plan asks for signed approvals (``RolloutPlan.signed_approval``), a typed name is not
enough: the answer must carry an approval statement signed with the named approver's key
(``revgate approve``). The flow checks the signature at its edge (``SignatureCheck``); here an
unsigned answer, a signature that does not verify or was made with another key, or a statement
that says something else than the answer (another run, route, person, decision or evidence)
decides nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from revgate.manifests.rollout import ApprovalStatement
from revgate.promotion.machine import ApprovalGiven

Refusal = Literal["unnamed", "not-allowed", "other-evidence", "unsigned", "bad-signature", "wrong-key",
                  "other-statement"]
SignatureStatus = Literal["verified", "unsigned", "invalid", "wrong-key"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back from the approval form."""

    approver: str
    approve: bool
    evidence_digest: str
    comment: str = ""


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What checking an answer's signature against the named approver's key found.

    ``statement`` is what a verified signature vouches for; ``signer`` the fingerprint of the key
    that verified it, ``public_key`` that key (PEM); ``detail`` why it did not verify.
    """

    status: SignatureStatus
    statement: ApprovalStatement | None = None
    signer: str = ""
    detail: str = ""
    public_key: str = ""


@dataclass(frozen=True, slots=True)
class FormShown:
    """The paused form an answer is for: its route, flow run and the evidence digest it showed."""

    route: str
    flow_run_id: str
    evidence_digest: str


@dataclass(frozen=True, slots=True)
class AnswerRefused:
    """An answer that decides nothing; ``message`` is shown above the form when it is asked again."""

    why: Refusal
    message: str


def same_person(name: str) -> str:
    """The form of a name or e-mail that allow-list entries are compared in: trimmed, case-folded."""
    return name.strip().casefold()


def is_allowed(approver: str, approvers: Iterable[str]) -> bool:
    """Whether ``approver`` may answer: anyone named when the list is empty, else only those listed."""
    allowed = {same_person(name) for name in approvers}
    return bool(same_person(approver)) and (not allowed or same_person(approver) in allowed)


def decide(
    answer: Answer, *, shown: str, approvers: tuple[str, ...], signature: SignatureCheck | None = None,
    form: FormShown | None = None,
) -> ApprovalGiven | AnswerRefused:
    """The state machine's event for ``answer`` to a form that showed evidence ``shown``, or why it counts for nothing.

    Who answered is checked first, for a rejection too: an answer from someone not allowed neither
    approves nor stops the rollout. ``signature`` is given when the plan requires signed approvals
    (then ``form`` says which form was shown): only a verified statement that says what the answer
    says, about this form, counts.
    """
    who = answer.approver.strip()
    if not who:
        return AnswerRefused("unnamed", "The last answer named nobody: say who you are in `approver`.")
    if not is_allowed(who, approvers):
        return AnswerRefused("not-allowed", f"The last answer came from {quoted(who)}, who is not on the rollout "
                                            "plan's allow-list of approvers: it neither approves nor rejects.")
    if signature is not None and (refused := signature_refusal(answer, signature, form)) is not None:
        return refused
    if answer.approve and answer.evidence_digest != shown:
        return AnswerRefused("other-evidence", f"The last answer approved evidence {quoted(answer.evidence_digest)}, "
                                               "not this evidence.")
    return ApprovalGiven(answer.approve, answer.evidence_digest, by=who)


def signature_refusal(answer: Answer, signature: SignatureCheck, form: FormShown | None) -> AnswerRefused | None:
    """Why a signed answer counts for nothing, or None when its signature and statement hold."""
    who = quoted(answer.approver.strip())
    if signature.status == "unsigned":
        return AnswerRefused("unsigned", f"The last answer, from {who}, was not signed; the rollout plan requires "
                                         "signed approvals: answer with `revgate approve RUN --key KEY --as NAME`.")
    if signature.status == "wrong-key":
        return AnswerRefused("wrong-key", f"The last answer was signed with another key than {who}'s key in the "
                                          f"rollout plan ({quoted(signature.detail)}): it decides nothing.")
    statement = signature.statement
    if signature.status != "verified" or statement is None:
        return AnswerRefused("bad-signature", f"The signature of the last answer, from {who}, does not verify "
                                              f"({quoted(signature.detail)}): it decides nothing.")
    return statement_refusal(answer, statement, form)


def statement_refusal(answer: Answer, statement: ApprovalStatement, form: FormShown | None) -> AnswerRefused | None:
    """Why a verified statement does not back the answer sent with it, or None when it does."""
    who = quoted(answer.approver.strip())
    says = (same_person(statement.approver), statement.approve, statement.evidence_digest, statement.comment)
    if says != (same_person(answer.approver), answer.approve, answer.evidence_digest, answer.comment):
        return AnswerRefused("other-statement", f"The signed statement of the last answer, from {who}, says something "
                                                "else than the answer sent with it: it decides nothing.")
    if form is not None and (statement.route, statement.flow_run_id) != (form.route, form.flow_run_id):
        return AnswerRefused("other-statement", f"The last answer, from {who}, was signed for route "
                                                f"{quoted(statement.route)}, flow run {quoted(statement.flow_run_id)}, "
                                                "not this form: it decides nothing.")
    if form is not None and statement.evidence_digest != form.evidence_digest:
        return AnswerRefused("other-evidence", f"The last answer, from {who}, was signed for evidence "
                                               f"{quoted(statement.evidence_digest)}, not this evidence.")
    return None


def quoted(text: str) -> str:
    """Typed text as inline code in the form's markdown, so it shows as typed and never as markup."""
    return "`" + " ".join(text.replace("`", "'").split())[:200] + "`"


def allow_list_line(approvers: tuple[str, ...]) -> str:
    """The line above the form that says who may answer."""
    if not approvers:
        return "Any release manager may answer (the rollout plan names no approvers); say who you are in `approver`."
    return "Only these approvers may answer (rollout plan `approvers`): " + ", ".join(map(quoted, approvers)) + "."
