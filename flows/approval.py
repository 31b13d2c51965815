"""The release manager's approval form in the Prefect UI, and the loop that asks until an answer counts.

The flow run pauses with the gate report above a form (``Approval``); whoever answers names
themselves. ``promotion.approval.decide`` says whether the answer counts: one from a person not on
the rollout plan's allow-list, or an approval of other evidence than the report shown, decides
nothing; it is kept in the evidence run and the form is asked again with the reason above it.
"""

from __future__ import annotations

import time
from collections import Counter

from prefect import get_run_logger
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field

from promotion.approval import Answer, AnswerRefused, Refusal, allow_list_line, decide
from promotion.machine import ApprovalGiven
from registry.ledger import EvidenceLedger, EvidenceRun

# Evidence names of answers that counted for nothing, numbered per kind (``approval-of-other-evidence-1``).
REFUSED_EVIDENCE: dict[Refusal, str] = {
    "unnamed": "approval-unnamed",
    "not-allowed": "approval-not-on-allow-list",
    "other-evidence": "approval-of-other-evidence",
}


class Approval(RunInput):
    """The release manager's answer; ``evidence_digest`` binds it to the report shown above the form."""

    approver: str = Field(min_length=1, max_length=200, description=(
        "Who answers: your name or e-mail, as the rollout plan's allow-list of approvers names you. "
        "Recorded with the decision."))
    approve: bool = Field(description="On: approve the candidate for the next stage. Off: reject it (roll back).")
    evidence_digest: str = Field(description=(
        "The evidence this answer is for: filled in with the digest of the report above. An approval of other "
        "evidence approves nothing."))
    comment: str = Field(default="", max_length=4000, description="Why; kept in the evidence run.")

    def answer(self) -> Answer:
        """The frozen answer the pure decision reads."""
        return Answer(self.approver, self.approve, self.evidence_digest, self.comment)


def ask(
    ledger: EvidenceLedger, run: EvidenceRun, *, question: str, markdown: str, shown: str,
    approvers: tuple[str, ...], timeout_s: int,
) -> ApprovalGiven:
    """Pause until a counted answer about the evidence ``shown`` (the report ``markdown``), or the timeout.

    ``timeout_s`` bounds the whole wait: answers that count for nothing do not extend it. No counted
    answer in time is a rejection by ``timeout``.
    """
    deadline = time.monotonic() + timeout_s
    header = f"## {question}\n\n{allow_list_line(approvers)}"
    prompt = f"{header}\n\n{markdown}"
    refused: Counter[Refusal] = Counter()
    while (left := deadline - time.monotonic()) > 0:
        form = Approval.with_initial_data(description=prompt, evidence_digest=shown, approve=False)
        given = pause_flow_run(wait_for_input=form, timeout=max(1, round(left)), poll_interval=2)
        if given is None:
            break
        verdict = decide(given.answer(), shown=shown, approvers=approvers)
        if isinstance(verdict, ApprovalGiven):
            record_counted(ledger, run, given, verdict)
            return verdict
        refused[verdict.why] += 1
        ledger.log_json(run, f"{REFUSED_EVIDENCE[verdict.why]}-{refused[verdict.why]}", given.model_dump(mode="json"))
        get_run_logger().warning("approval form answered by %r counted for nothing (%s): asking again",
                                 given.approver, verdict.why)
        prompt = retry_prompt(verdict, header, markdown)
    return ApprovalGiven(False, shown, by="timeout")


def record_counted(ledger: EvidenceLedger, run: EvidenceRun, given: Approval, verdict: ApprovalGiven) -> None:
    """The answer that decided, as the evidence run's ``approval`` (the version page names its approver)."""
    ledger.log_json(run, "approval", given.model_dump(mode="json"))
    ledger.log_step(run, "approval", f"{'approved' if verdict.approved else 'rejected'} by {verdict.by}")
    get_run_logger().info("%s by %s", "approved" if verdict.approved else "rejected", verdict.by)


def retry_prompt(refused: AnswerRefused, header: str, markdown: str) -> str:
    """The form's description when it is asked again: why the last answer counted for nothing, first."""
    return f"## {refused.message} Answer again.\n\n{header}\n\n{markdown}"
