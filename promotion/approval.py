"""Whether a release manager's answer decides an approve step: who answered, and for which evidence.

An answer counts only when it names a person the rollout plan allows (``RolloutPlan.approvers``;
an empty list lets anyone answer). Then a rejection stops the rollout whatever evidence it names,
and an approval moves it on only for the evidence shown above the form. Any other answer decides
nothing: the flow keeps it in the evidence and asks again, saying why (``AnswerRefused.message``).

The name is what the person typed: the open-source Prefect server does not know who resumed a run.
The allow-list keeps an answer from the wrong person from counting; who may reach the form at all
is decided in front of the server (docs/release-manager.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from promotion.machine import ApprovalGiven

Refusal = Literal["unnamed", "not-allowed", "other-evidence"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back from the approval form."""

    approver: str
    approve: bool
    evidence_digest: str
    comment: str = ""


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


def decide(answer: Answer, *, shown: str, approvers: tuple[str, ...]) -> ApprovalGiven | AnswerRefused:
    """The state machine's event for ``answer`` to a form that showed evidence ``shown``, or why it counts for nothing.

    Who answered is checked first, for a rejection too: an answer from someone not allowed neither
    approves nor stops the rollout.
    """
    who = answer.approver.strip()
    if not who:
        return AnswerRefused("unnamed", "The last answer named nobody: say who you are in `approver`.")
    if not is_allowed(who, approvers):
        return AnswerRefused("not-allowed", f"The last answer came from {quoted(who)}, who is not on the rollout "
                                            "plan's allow-list of approvers: it neither approves nor rejects.")
    if answer.approve and answer.evidence_digest != shown:
        return AnswerRefused("other-evidence", f"The last answer approved evidence {quoted(answer.evidence_digest)}, "
                                               "not this evidence.")
    return ApprovalGiven(answer.approve, answer.evidence_digest, by=who)


def quoted(text: str) -> str:
    """Typed text as inline code in the form's markdown, so it shows as typed and never as markup."""
    return "`" + " ".join(text.replace("`", "'").split())[:200] + "`"


def allow_list_line(approvers: tuple[str, ...]) -> str:
    """The line above the form that says who may answer."""
    if not approvers:
        return "Any release manager may answer (the rollout plan names no approvers); say who you are in `approver`."
    return "Only these approvers may answer (rollout plan `approvers`): " + ", ".join(map(quoted, approvers)) + "."
