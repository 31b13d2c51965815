"""``promote_revision``: pin, verify, load and warm, shadow, approve, canary, promote or roll back.

The flow is a driver around pure parts: the rollout state machine decides, ``promotion.routes``
plans each route change, the gates judge evidence. The flow does the I/O and records everything
in MLflow (the audit trail) and as Prefect artifacts (what a release manager sees). Any error
after traffic moved routes back to stable before it propagates.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from evaluation.gates import gates_from_policy, judge
from evaluation.records import RequestRecord
from evaluation.traces import TraceEntry, read_trace
from flows import evidence, steps
from flows.report import report_markdown, slice_rows
from flows.spec import PromotionSpec
from manifests.errors import RevgateError
from manifests.gates import GateReport
from manifests.revision import ServiceRevision
from manifests.rollout import Analyze, Approve, Bake
from manifests.route import RevisionTarget
from promotion.machine import (
    Abort,
    ApprovalGiven,
    GateDecided,
    RolloutState,
    StepApplied,
    advance,
    current_step,
    resume,
    start,
)
from promotion.routes import desired_route, renew_leases
from registry.ledger import EvidenceLedger, EvidenceRun


class RolloutInProgress(RevgateError):
    """Another rollout holds the route's lock: one rollout per route at a time."""


class Approval(RunInput):
    """The release manager's answer; ``evidence_digest`` binds it to the report shown above the form."""

    approve: bool
    evidence_digest: str
    comment: str = ""


def lock_name(route: str) -> str:
    """The global concurrency limit that serialises rollouts of one route."""
    return f"revgate-route-{route}"


def ensure_route_lock(route: str) -> None:
    """Create the route's one-slot limit if missing (``strict=True`` refuses a missing one)."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(lock_name(route))
        except Exception:  # prefect raises ObjectNotFound; any read failure means create
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=lock_name(route), limit=1))


@task(name="pin")
def pin_task(spec: PromotionSpec) -> ServiceRevision:
    """Resolve the candidate's immutable documents."""
    return steps.pin(spec)


@task(name="verify")
def verify_task(spec: PromotionSpec, revision: ServiceRevision) -> dict[str, float]:
    """Digests, signature and compatibility, before anything is loaded."""
    return steps.verify(spec, revision, Path(spec.evidence_root) / "verify-cache")


@task(name="capacity")
def capacity_task(spec: PromotionSpec, stable: str) -> dict[str, Any]:
    """Stable's ready capacity must cover the traffic."""
    return steps.check_capacity(spec, stable)


@task(name="load-and-warm")
def load_task(spec: PromotionSpec, revision: ServiceRevision) -> dict[str, Any]:
    """The candidate's replica, verified again where it loads, warmed and ready."""
    return steps.load_candidate(spec, revision)


@task(name="isolated-check")
def isolated_task(view: dict[str, Any]) -> dict[str, float]:
    """The candidate alone, off the live path."""
    return steps.isolated_check(str(view["endpoint"]), str(view["served_model"]))


@task(name="analyze")
def analyze_task(
    spec: PromotionSpec, state: RolloutState, step: Analyze, stage: str, *, stable: str, candidate: str
) -> tuple[GateReport, bool]:
    """Replay labelled traffic in batches, looking at the gates after each; stop once decided."""
    logger = get_run_logger()
    trace = read_trace(Path(spec.trace))
    share = state.weight_ppm / 1_000_000 if state.weight_ppm else None
    gate = gates_from_policy(spec.gate_policy, share)
    stable_arm: list[RequestRecord] = []
    candidate_arm: list[RequestRecord] = []
    sent: list[RequestRecord] = []
    replayed: list[TraceEntry] = []
    batches = max(1, -(-step.max_samples // spec.batch_size))
    pairs = evidence.PairedRecordsTail(Path(spec.paired_records), f"{stage}-")
    report: GateReport | None = None
    for batch in range(batches):
        entries = evidence.stage_batch(trace, stage, batch, spec.batch_size)
        records = evidence.send_batch(spec.router_url, entries)
        if state.shadow_ppm:
            # Re-pair everything sent so far: copies of earlier batches may have landed since.
            sent += records
            replayed += entries
            expected = round(len(sent) * state.shadow_ppm / 1_000_000)
            settled = evidence.settled_pairs(pairs, expected)
            stable_arm, candidate_arm = evidence.shadow_arms(sent, settled, replayed)
        else:
            arms = evidence.canary_arms(records, stable, candidate)
            stable_arm += arms[0]
            candidate_arm += arms[1]
        final = batch == batches - 1
        proof = evidence.build_evidence(stable_arm, candidate_arm, expected_candidate_share=share, final=final)
        report = judge(gate, spec.gate_policy, proof)
        logger.info("%s batch %d/%d: %s (stable %d, candidate %d)", stage, batch + 1, batches, report.outcome,
                    len(stable_arm), len(candidate_arm))
        if report.outcome != "inconclusive":
            return report, final
    assert report is not None
    return report, True


class Promotion:
    """The mutable driver of one promotion: its spec, ledger run, candidate target and state."""

    def __init__(self, spec: PromotionSpec, ledger: EvidenceLedger, run: EvidenceRun, target: RevisionTarget) -> None:
        self.spec = spec
        self.ledger = ledger
        self.run = run
        self.target = target
        self.state = start(spec.plan)
        self.stable = steps.current_route(spec).stable.fingerprint
        self.reports = 0
        self.latest_report = "No gate report yet."

    def apply_route(self) -> None:
        """Commit the route this state asks for (nothing when it already routes that way)."""
        now = datetime.now(UTC)
        current = steps.current_route(self.spec)
        proposed = desired_route(current, self.state, self.target, lease_seconds=self.spec.plan.lease_seconds,
                                 by=self.spec.created_by, now=now)
        if proposed is not None:
            steps.commit_route(self.spec, proposed)
            self.ledger.log_document(self.run, f"route-generation-{proposed.generation:06d}", proposed)

    def renew(self) -> None:
        """Extend the candidate and shadow leases (the dead-man switch stays armed)."""
        current = steps.current_route(self.spec)
        if current.candidate is not None or current.shadow is not None:
            renewed = renew_leases(current, lease_seconds=self.spec.plan.lease_seconds, by=self.spec.created_by,
                                   now=datetime.now(UTC))
            steps.commit_route(self.spec, renewed)

    def publish(self, report: GateReport, stage: str) -> str:
        """Record a gate report in MLflow and as Prefect artifacts; the markdown shown to humans."""
        self.reports += 1
        self.ledger.log_document(self.run, f"gate-report-{self.reports:02d}-{stage}", report)
        markdown = report_markdown(report, stage)
        create_markdown_artifact(markdown, key=f"gate-report-{self.spec.route}", description=f"gates at {stage}")
        create_table_artifact(slice_rows(report), key=f"gate-slices-{self.spec.route}", description=stage)
        self.latest_report = markdown
        return markdown

    def ask_approval(self, step: Approve, markdown: str) -> ApprovalGiven:
        """Pause for a release manager (or approve automatically where the spec says so)."""
        if self.spec.approval == "auto":
            get_run_logger().warning("approval given automatically (spec.approval == 'auto')")
            return ApprovalGiven(True, self.state.evidence_digest, by="auto")
        shown = self.state.evidence_digest
        prompt = f"## {step.prompt}\n\n{markdown}"
        refused = 0
        while True:
            form = Approval.with_initial_data(description=prompt, evidence_digest=shown, approve=False)
            answer = pause_flow_run(wait_for_input=form, timeout=self.spec.approval_timeout_s, poll_interval=2)
            if answer is None:
                return ApprovalGiven(False, shown, by="timeout")
            if not answer.approve or answer.evidence_digest == shown:
                self.ledger.log_json(self.run, "approval", answer.model_dump(mode="json"))
                return ApprovalGiven(answer.approve, answer.evidence_digest, by="release manager")
            # An approval of other evidence (an edited digest, a stale tab) approves nothing: ask again.
            refused += 1
            self.ledger.log_json(self.run, f"approval-of-other-evidence-{refused}", answer.model_dump(mode="json"))
            get_run_logger().warning("approval named evidence %s, not the evidence shown: asking again",
                                     answer.evidence_digest)
            prompt = (f"## The last answer approved evidence {answer.evidence_digest}, not this evidence."
                      f" Answer again.\n\n## {step.prompt}\n\n{markdown}")

    def decide_paused(self) -> RolloutState:
        """Inconclusive at the stage's limit: a human may proceed; automatic mode never does."""
        if self.spec.approval == "auto":
            # Not enough evidence is never a pass: without a human, the rollout stops here.
            get_run_logger().warning("gates inconclusive at the stage's limit: rolling back (no human to decide)")
            return resume(self.spec.plan, self.state, proceed=False, by="auto")
        answer = self.ask_approval(Approve(prompt="Gates are inconclusive. Proceed anyway?"), self.state.reason)
        return resume(self.spec.plan, self.state, proceed=answer.approved, by=answer.by)

    def step_once(self) -> None:
        """Carry out the current step and feed what happened into the state machine."""
        step = current_step(self.spec.plan, self.state)
        stage = f"step{self.state.step_index:02d}"
        if isinstance(step, Analyze):
            report, at_limit = analyze_task(
                self.spec, self.state, step, stage, stable=self.stable, candidate=self.target.fingerprint
            )
            self.publish(report, stage)
            reason = "; ".join(f"{g.gate}: {g.reason}" for g in report.failed())
            event = GateDecided(report.outcome, report.evidence_digest, at_limit=at_limit, reason=reason)
            self.state = advance(self.spec.plan, self.state, event)
        elif isinstance(step, Approve):
            # The form shows the report whose digest the answer is bound to.
            self.state = advance(self.spec.plan, self.state, self.ask_approval(step, self.latest_report))
        elif isinstance(step, Bake):
            time.sleep(step.seconds)
            self.renew()
            self.state = advance(self.spec.plan, self.state, StepApplied())
        else:
            self.state = advance(self.spec.plan, self.state, StepApplied())

    def run_plan(self) -> RolloutState:
        """Walk the plan to a terminal state, committing each route change as it is asked for."""
        self.apply_route()
        while self.state.status not in ("promoted", "rolled_back"):
            if self.state.status == "paused":
                self.state = self.decide_paused()
            else:
                self.step_once()
            self.apply_route()
        return self.state


def _finish(spec: PromotionSpec, driver: Promotion, old_stable: str) -> None:
    """Drain whichever revision left the route, after the rollback window for the old stable."""
    if driver.state.status == "promoted":
        version = driver.ledger.register_version(driver.run, spec.registered_model, driver.target.fingerprint)
        generation = steps.current_route(spec).generation
        driver.ledger.move_alias(spec.registered_model, "stable", version, by=spec.created_by, generation=generation)
        time.sleep(spec.rollback_window_s)
        steps.drain(spec, old_stable)
    else:
        steps.drain(spec, driver.target.fingerprint)


@flow(name="promote-revision", log_prints=True)
def promote_revision(spec: PromotionSpec) -> str:
    """Promote ``spec.candidate_manifest`` on ``spec.route`` or roll it back; returns the decision."""
    ensure_route_lock(spec.route)
    try:
        with concurrency(lock_name(spec.route), occupy=1, strict=True, timeout_seconds=5):
            return _promote(spec)
    except TimeoutError:
        raise RolloutInProgress(
            f"route {spec.route!r} already has a rollout in progress", where=lock_name(spec.route),
            fix="Wait for it to finish or roll it back; one rollout per route at a time.",
        ) from None


def _promote(spec: PromotionSpec) -> str:
    ledger = EvidenceLedger(spec.tracking_uri, Path(spec.evidence_root) / "mlflow-artifacts")
    revision = pin_task(spec)
    run = ledger.open_run(spec.route, revision.fingerprint, {"revgate.candidate_name": spec.candidate_name})
    for name, document in (("service-revision", revision), ("gate-policy", spec.gate_policy), ("plan", spec.plan)):
        ledger.log_document(run, name, document)
    decision = "failed"
    driver: Promotion | None = None
    try:
        ledger.log_step(run, "verify", "pass", verify_task(spec, revision))
        old_stable = steps.current_route(spec).stable.fingerprint
        capacity_task(spec, old_stable)
        view = load_task(spec, revision)
        ledger.log_step(run, "load", "ready", {k: float(v) for k, v in view.get("timings_s", {}).items()})
        ledger.log_step(run, "isolated-check", "pass", isolated_task(view))
        driver = Promotion(spec, ledger, run, steps.candidate_target(view, revision))
        decision = driver.run_plan().status
        ledger.log_json(run, "decision", {"decision": decision, "reason": driver.state.reason})
        _finish(spec, driver, old_stable)
        return decision
    except BaseException:
        if driver is not None and driver.state.status != "rolled_back":
            driver.state = advance(spec.plan, driver.state, Abort("the promotion flow failed"))
            driver.apply_route()  # traffic back to stable before the error propagates
            decision = "rolled_back"
        raise
    finally:
        ledger.close(run, decision)
