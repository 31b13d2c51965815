"""The release manager's approval form in the Prefect UI, and the loop that asks until an answer counts.

The flow run pauses with the gate report above a form (``Approval``); whoever answers names
themselves. ``promotion.approval.decide`` says whether the answer counts: one from a person not on
the rollout plan's allow-list, or an approval of other evidence than the report shown, decides
nothing; it is kept in the evidence run and the form is asked again with the reason above it.

Where the rollout plan asks for signed approvals, the answer must come from ``revgate approve``,
which sends the signed approval statement and its signature with it (fields ``statement`` and
``signature``). The signature is checked here, at the flow's edge, against the named approver's
public key in the plan (``registry.signing.verify_approval``); what it means is decided in
``promotion.approval.decide``. A counted signed answer is kept with its statement, signature and
the key that verified it (``approval-statement``, ``approval-signature``, ``approval-signer``).
"""

from __future__ import annotations

import contextvars
import ctypes
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.input.run_input import keyset_from_paused_state
from prefect.runtime import flow_run
from pydantic import Field

from revgate.flows.outage import asking_once, prefect_unreachable
from revgate.manifests.errors import RevgateError
from revgate.manifests.rollout import ApprovalStatement, RolloutPlan
from revgate.promotion.approval import (
    Answer,
    AnswerRefused,
    FormShown,
    Refusal,
    SignatureCheck,
    allow_list_line,
    decide,
)
from revgate.promotion.machine import ApprovalGiven
from revgate.registry.errors import UntrustedSigner
from revgate.registry.ledger import EvidenceLedger, EvidenceRun
from revgate.registry.signing import public_key_pem, signature_key_hint, verify_approval

# Evidence names of answers that counted for nothing, numbered per kind (``approval-of-other-evidence-1``).
REFUSED_EVIDENCE: dict[Refusal, str] = {
    "unnamed": "approval-unnamed",
    "not-allowed": "approval-not-on-allow-list",
    "other-evidence": "approval-of-other-evidence",
    "unsigned": "approval-unsigned",
    "bad-signature": "approval-bad-signature",
    "wrong-key": "approval-signed-with-another-key",
    "other-statement": "approval-signed-for-another-form",
}
SIGNED_FIELDS = {"statement", "signature"}


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


class SignedApproval(Approval):
    """The form of a plan that requires signed approvals: the answer with its signed statement (``revgate approve``)."""

    route: str = Field(default="", description="The route this form is for: filled in.")
    statement: str = Field(default="", max_length=20_000, description=(
        "The approval statement `revgate approve` signed. An answer typed here without one counts for nothing."))
    signature: str = Field(default="", max_length=100_000, description=(
        "The statement's signature (a Sigstore bundle in the OpenSSF model-signing format) from `revgate approve`."))


STOPPED_BY = "the rollout's stop"  # who "answered" a pause that a cancel, a takeover or a fault ended


def ask(
    ledger: EvidenceLedger, run: EvidenceRun, *, question: str, markdown: str, shown: str,
    plan: RolloutPlan, route: str, timeout_s: int, stopped: Callable[[], bool] = lambda: False,
) -> ApprovalGiven:
    """Pause until a counted answer about the evidence ``shown`` (the report ``markdown``), or the timeout.

    ``timeout_s`` bounds the whole wait: answers that count for nothing do not extend it. No counted
    answer in time is a rejection by ``timeout``. Each answer is kept under a name of its own, so a
    later one (in this pause or a later approve step) never overwrites an earlier one. Once ``stopped()``
    (the run cancelled, the route taken over, a watch's fault) the pause ends within a poll, a rejection
    by STOPPED_BY: the caller then stops the rollout for the reason it was stopped.
    """
    deadline = time.monotonic() + timeout_s
    header = f"## {question}\n\n{allow_list_line(plan.approvers)}{signed_line(plan)}"
    prompt = f"{header}\n\n{markdown}"
    form_shown = FormShown(route, flow_run.get_id() or "", shown)
    while deadline - time.monotonic() > 0:
        form = (SignedApproval.with_initial_data(description=prompt, evidence_digest=shown, approve=False, route=route)
                if plan.signed_approval else
                Approval.with_initial_data(description=prompt, evidence_digest=shown, approve=False))
        try:
            given = paused_for(form, deadline, stopped)
        except PauseStopped:
            return ApprovalGiven(False, shown, by=STOPPED_BY)
        if given is None:
            break
        signature = check_signature(given, plan) if isinstance(given, SignedApproval) else None
        verdict = decide(given.answer(), shown=shown, approvers=plan.approvers, signature=signature, form=form_shown)
        if isinstance(verdict, ApprovalGiven):
            record_counted(ledger, run, given, verdict, signature)
            return verdict
        ledger.log_json_new(run, REFUSED_EVIDENCE[verdict.why], given.model_dump(mode="json"))
        get_run_logger().warning("approval form answered by %r counted for nothing (%s): asking again",
                                 given.approver, verdict.why)
        prompt = retry_prompt(verdict, header, markdown)
    return ApprovalGiven(False, shown, by="timeout")


PAUSE_POLL_S = 2  # how often a paused run asks Prefect whether it was resumed (and, in an outage, whether it is back)


class PauseStopped(Exception):
    """The rollout was stopped while paused: its pause ends without an answer."""


def paused_for(form: type[Approval], deadline: float, stopped: Callable[[], bool] = lambda: False) -> Approval | None:
    """The run paused with ``form`` until it is answered (the answer) or ``deadline`` (None), through Prefect API
    outages: the pause goes on where Prefect left it once the API answers again (or is asked again if it never
    reached Prefect). Meanwhile the heartbeat renews the leases; the candidate stays watched. PauseStopped once
    ``stopped()``."""
    while (left := deadline - time.monotonic()) > 0:
        asked_at = datetime.now(UTC) - timedelta(seconds=1)  # Prefect's clock is this host's, within a second
        try:
            return watched_pause(form, max(1, round(left)), stopped)
        except FlowPauseTimeout:
            return None
        except Exception as error:
            if not prefect_unreachable(error):
                raise
            get_run_logger().warning("the Prefect API is away during the approval pause (%s: %s): the leases are "
                                     "renewed meanwhile; waiting for it until the pause's timeout",
                                     type(error).__name__, error)
        outcome = after_outage(form, asked_at, deadline)
        if not isinstance(outcome, Repause):
            return outcome
    return None


def watched_pause(form: type[Approval], timeout_s: int, stopped: Callable[[], bool]) -> Approval | None:
    """``pause_flow_run`` in a thread of its own (with this thread's Prefect context), while this one looks at
    ``stopped()`` every poll: Prefect's pause blocks until it is resumed or times out, and would keep a cancelled
    or taken-over rollout waiting for the whole approval timeout. Raises what the pause raised."""
    done: Future[Approval | None] = Future()
    context = contextvars.copy_context()

    def pause() -> None:
        try:
            done.set_result(context.run(pause_flow_run, wait_for_input=form, timeout=timeout_s,
                                        poll_interval=PAUSE_POLL_S))
        except BaseException as error:  # handed to the flow's thread, which raises it (unless it stopped waiting)
            if not done.done():
                done.set_exception(error)

    thread = threading.Thread(target=pause, name="approval-pause", daemon=True)
    thread.start()
    while True:
        try:
            return done.result(timeout=PAUSE_POLL_S)
        except TimeoutError:
            if stopped():
                end_pause(thread)
                raise PauseStopped from None


def end_pause(thread: threading.Thread, within_s: float = 3 * PAUSE_POLL_S) -> None:
    """End an abandoned pause's thread: Prefect's pause has no way to be told to stop, and left alone it polls a
    run that no longer waits for an hour, then logs to an API that has gone. PauseStopped is raised in the thread
    at its next step (after its current poll), and the thread is given ``within_s`` to end."""
    if thread.ident is None or not thread.is_alive():
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(PauseStopped))
    thread.join(within_s)


class Repause:
    """The pause never reached Prefect: ask for it again."""


def after_outage(form: type[Approval], asked_at: datetime, deadline: float) -> Approval | Repause | None:
    """Once Prefect answers again: the answer given in the pause begun at ``asked_at`` (if the run was resumed),
    after waiting while it is still paused; Repause when no such pause is on record; None at ``deadline``."""
    run_id = UUID(flow_run.get_id() or "")
    while time.monotonic() < deadline:
        try:
            with asking_once() as client:
                run = client.read_flow_run(run_id)
                pauses = [state for state in client.read_flow_run_states(run_id)
                          if state.is_paused() and state.timestamp >= asked_at]
                if not pauses:
                    return Repause()
                if run.state is not None and run.state.is_running():
                    get_run_logger().info("the Prefect API is back: the approval pause was answered")
                    return cast(Approval, form.load(keyset_from_paused_state(pauses[-1]), flow_run_id=run_id))
        except Exception as error:
            if not prefect_unreachable(error):
                raise
        time.sleep(PAUSE_POLL_S)
    return None


def signed_line(plan: RolloutPlan) -> str:
    """The line above the form that says a signed answer is needed, and how to give one."""
    if not plan.signed_approval:
        return ""
    return ("\n\nThe rollout plan requires **signed approvals**: an answer typed here counts for nothing. Answer with "
            "`revgate approve RUN --key YOUR_PRIVATE_KEY --as YOUR_NAME` (add `--reject` to reject).")


def check_signature(given: SignedApproval, plan: RolloutPlan) -> SignatureCheck:
    """Check the answer's signed statement against the public key the plan gives for the named approver."""
    if not given.statement.strip() or not given.signature.strip():
        return SignatureCheck("unsigned")
    key = plan.approver_key(given.approver)
    if key is None:
        return SignatureCheck("wrong-key", detail="the plan gives no key for this approver")
    statement_bytes = given.statement.encode("utf-8")
    try:
        pem = public_key_pem(key)
        statement = ApprovalStatement.from_canonical(statement_bytes, source="the answer's statement")
        signed = verify_approval(statement_bytes, given.signature, pem)
    except UntrustedSigner:
        hint = signature_key_hint(given.signature) or "(unnamed)"
        return SignatureCheck("wrong-key", detail=f"signed with key {hint}")
    except RevgateError as error:
        return SignatureCheck("invalid", detail=error.what)
    return SignatureCheck("verified", statement, signer=signed.fingerprint, public_key=pem)


def record_counted(
    ledger: EvidenceLedger, run: EvidenceRun, given: Approval, verdict: ApprovalGiven,
    signature: SignatureCheck | None = None,
) -> None:
    """The answer that decided, as the evidence run's ``approval`` (``approval-2``, ... after the first; the
    version page names its approver). A signed answer's statement, signature and signer are kept beside it."""
    name = ledger.log_json_new(run, "approval", given.model_dump(mode="json", exclude=SIGNED_FIELDS), plain_first=True)
    outcome = f"{'approved' if verdict.approved else 'rejected'} by {verdict.by}"
    if isinstance(given, SignedApproval) and signature is not None and signature.statement is not None:
        ledger.log_document(run, f"{name}-statement", signature.statement)
        ledger.log_json(run, f"{name}-signature", json.loads(given.signature))
        ledger.log_json(run, f"{name}-signer", {"approver": verdict.by, "fingerprint": signature.signer,
                                                "public_key": signature.public_key, "verified": True})
        ledger.tag(run, "revgate.approval.signer", f"{verdict.by} (key {signature.signer})")
        outcome += f", signed with key {signature.signer}"
    ledger.log_step(run, "approval", outcome)
    get_run_logger().info("%s", outcome)


def retry_prompt(refused: AnswerRefused, header: str, markdown: str) -> str:
    """The form's description when it is asked again: why the last answer counted for nothing, first."""
    return f"## {refused.message} Answer again.\n\n{header}\n\n{markdown}"


# ---------------------------------------------------------------------------------------------
# Answering a paused run from outside it (``revgate approve``), through the API the UI's form posts to


class ApprovalRunError(RevgateError):
    """The flow run named cannot take an approval: no such run, not paused, or not paused at the form."""


@dataclass(frozen=True, slots=True)
class PausedForm:
    """The approval form a paused flow run waits on: the run, and what the form is bound to."""

    flow_run_id: str
    flow_run_name: str
    route: str
    evidence_digest: str


def find_flow_run(reference: str) -> Any:
    """The flow run whose id, or else whose name, is ``reference`` (a name matching several: the paused one)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_flow_run(UUID(reference))
        except ValueError:
            pass  # not an id: a name
        except ObjectNotFound:
            raise no_such_run(reference) from None
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[reference])))
    paused = [run for run in runs if run.state is not None and run.state.is_paused()]
    if len(paused) > 1:
        raise ApprovalRunError(f"{len(paused)} paused flow runs are named {reference!r}", where=reference,
                               fix="Name the run by its id (the UI's address of the run ends with it).")
    if paused or runs:
        return (paused or runs)[0]
    raise no_such_run(reference)


def no_such_run(reference: str) -> ApprovalRunError:
    """The error for a run id or name the Prefect API does not know."""
    return ApprovalRunError(f"no flow run {reference!r}", where=reference,
                            fix="Give the paused run's id or name (`revgate promote` prints it, the UI shows it) and "
                                "check PREFECT_API_URL names the server the run is on.")


def paused_form(reference: str) -> PausedForm:
    """The approval form the flow run ``reference`` is paused at, with the evidence digest it shows."""
    from prefect.client.orchestration import get_client
    from prefect.input.actions import read_flow_run_input
    from prefect.input.run_input import keyset_from_paused_state

    try:
        run = find_flow_run(reference)
    except httpx.HTTPError as error:
        raise ApprovalRunError(f"cannot reach the Prefect API ({type(error).__name__}: {error})",
                               where="PREFECT_API_URL", fix="Check the address and that the server is up; "
                                                            "nothing was sent.") from None
    state = run.state
    if state is None or not state.is_paused():
        raise ApprovalRunError(f"flow run {run.name!r} ({run.id}) is not paused for approval: it is "
                               f"{state.name if state is not None else 'without a state'}", where=str(run.id),
                               fix="Answer when the run shows Paused (`revgate promote` prints when it pauses); "
                                   "nothing was sent.")
    with get_client(sync_client=True):
        schema = read_flow_run_input(keyset_from_paused_state(state)["schema"], flow_run_id=run.id)
    fields = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if "evidence_digest" not in fields:
        raise ApprovalRunError(f"flow run {run.name!r} ({run.id}) is paused, but not at revgate's approval form",
                               where=str(run.id), fix="Answer it in the Prefect UI; nothing was sent.")
    if "signature" not in fields:
        raise ApprovalRunError(f"flow run {run.name!r} ({run.id}) asks for an unsigned approval: its rollout plan "
                               "does not require signed approvals (signed_approval), so it would keep no signature",
                               where=str(run.id), fix="Answer on the Prefect UI's Resume form; nothing was sent.")
    return PausedForm(str(run.id), str(run.name), str(fields.get("route", {}).get("default", "")),
                      str(fields["evidence_digest"].get("default", "")))


def send_answer(form: PausedForm, answer: SignedApproval) -> None:
    """Resume the paused run with ``answer`` as its input, as the UI's Resume form does."""
    from prefect.exceptions import FlowPauseTimeout, NotPausedError
    from prefect.flow_runs import resume_flow_run

    try:
        resume_flow_run(UUID(form.flow_run_id), run_input=answer.model_dump(mode="json"))
    except (NotPausedError, FlowPauseTimeout, RuntimeError) as error:
        raise ApprovalRunError(f"flow run {form.flow_run_name!r} did not take the answer ({error})",
                               where=form.flow_run_id, fix="Check the run's state; it may have been answered or "
                                                           "timed out meanwhile.") from None
