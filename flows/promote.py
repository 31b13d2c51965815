"""``promote_revision``: pin, verify, load and warm, shadow, approve, canary, promote, watch, drain.

The flow is a driver around pure parts: the rollout state machine decides, ``promotion.routes``
plans each route change, ``promotion.capacity`` checks every increase of candidate traffic,
``promotion.window`` judges the promoted revision in the rollback window, the gates judge evidence.
The flow owns its route only from one of its own writes to the next (``flows.route_owner``): any
other writer ends the rollout, which then never writes the route again. Whatever ends the flow,
the replicas it started or retired that no router may send to are drained, by replica, and the
decision recorded is what the route says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from revgate.evaluation.evidence import build_evidence
from revgate.evaluation.gates import gates_from_policy, judge
from revgate.evaluation.gates import settled as stage_settled
from revgate.evaluation.graders import JudgeEndpoint, answer_pairs, exact_match, grade_pairs, pair_graders
from revgate.evaluation.traces import TraceEntry, read_trace
from revgate.flows import approval, evidence, sizing, steps
from revgate.flows.attest import Attestor, Signed, controller_key
from revgate.flows.auditor import log_stage_plots, plot_stage, version_facts
from revgate.flows.report import report_markdown, slice_rows
from revgate.flows.route_lock import (
    RouteLock,
    lock_name,
    release_route_lock,
    taken_by_another,
)
from revgate.flows.route_owner import Heartbeat, RolloutStopped, RouteOwner, RouteTakenOver
from revgate.flows.sizing import Measured
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GateReport
from revgate.manifests.revision import ServiceRevision
from revgate.manifests.rollout import Analyze, Approve, Bake
from revgate.manifests.route import PPM, RevisionTarget, RouteSnapshot
from revgate.promotion.fleet import routers_behind
from revgate.promotion.machine import (
    TERMINAL,
    Abort,
    ApprovalGiven,
    GateDecided,
    RolloutState,
    StepApplied,
    advance,
    commit_refused,
    current_step,
    resume,
    start,
)
from revgate.promotion.ownership import Takeover, decision_of, drainable, lease_end
from revgate.promotion.routes import RolloutKeys, as_evidence, desired_route
from revgate.promotion.window import OPEN_UNTIL, WINDOW_TAG, WindowTally, WindowVerdict, tally, window_verdict
from revgate.registry.auditor_view import IN_ROLLOUT
from revgate.registry.follow import follow_route
from revgate.registry.ledger import EvidenceLedger, EvidenceRun
from revgate.registry.outbox import EvidenceOutbox
from revgate.registry.record_store import StageWindow
from revgate.rollback.plan import revert_to
from revgate.serving.worker.client import AgentEngine
from revgate.serving.worker.views import ReplicaView

log = logging.getLogger(__name__)


@task(name="pin")
def pin_task(spec: PromotionSpec) -> tuple[ServiceRevision, AgentEngine]:
    """Resolve the candidate's immutable documents, on the agents' engine build."""
    return steps.pin(spec)


@task(name="verify")
def verify_task(spec: PromotionSpec, revision: ServiceRevision) -> dict[str, float]:
    """The manifest's signature and the candidate's fit on every agent's engine, before anything is loaded
    (the agents check the bytes they load)."""
    figures = steps.verify(spec, revision, Path(spec.evidence_root) / "signatures")
    steps.check_fit(spec, revision, steps.fleet_engines(spec))
    return figures


@task(name="capacity")
def capacity_task(spec: PromotionSpec, stable: RevisionTarget) -> dict[str, Any]:
    """Stable's ready capacity must carry the traffic."""
    return steps.check_stable_capacity(spec, stable)


@task(name="start-candidate")
def start_task(spec: PromotionSpec, revision: ServiceRevision) -> list[ReplicaView]:
    """Ask the fleet's workers for the candidate's replicas (each verifies again where it loads)."""
    return steps.start_candidates(spec, revision)


@task(name="load-and-warm")
def load_task(spec: PromotionSpec, replica: ReplicaView) -> ReplicaView:
    """The started replica, loaded, warmed and ready."""
    return steps.wait_ready(spec, replica)


# What the evidence keeps of each candidate replica the rollout started.
REPLICA_FACTS = ("worker_url", "replica_id", "endpoint", "served_model", "cpu_cores", "timings_s")


def slowest(figures: list[dict[str, Any]]) -> dict[str, float]:
    """Per figure, the largest over the replicas: a step is as ready as its slowest replica."""
    return {key: max(float(each[key]) for each in figures if key in each) for key in {k for f in figures for k in f}}


@task(name="isolated-check")
def isolated_task(view: ReplicaView) -> dict[str, float]:
    """The candidate alone, off the live path."""
    return steps.isolated_check(view.endpoint, view.served_model)


@task(name="analyze")
def analyze_task(
    spec: PromotionSpec, state: RolloutState, step: Analyze, stage: str, *, stable: str, candidate: str,
    generation: int = 0, keys: RolloutKeys | None = None,
) -> tuple[GateReport, bool, Measured | None]:
    """Judge the stage's traffic in batches, looking at the gates after each; stop once decided.

    Returns the report, whether the stage ended at its limit (its last batch, or every undecided gate
    futile), and what the stage measured of stable for the next stage's power check.
    """
    credential = keys.probe_credential if keys is not None else ""
    return analyze_live(spec, state, step, stage, revisions=(stable, candidate), generation=generation,
                        credential=credential)


def analyze_live(
    spec: PromotionSpec, state: RolloutState, step: Analyze, stage: str, *, revisions: tuple[str, str],
    generation: int, credential: str = "",
) -> tuple[GateReport, bool, Measured | None]:
    """The stage's evidence from the record sink: every router's records of the stage's generations.

    Users' requests and the flow's probes (when on) both count, each once; the shadow stage is
    judged on pairs (both revisions answered the same request) where the policy has paired gates.
    """
    logger = get_run_logger()
    trace = read_trace(Path(spec.trace)) if spec.probes else []
    share = state.weight_ppm / 1_000_000 if state.weight_ppm else None
    shadow = bool(state.shadow_ppm)
    gate = gates_from_policy(spec.gate_policy, share, paired_evidence=shadow)
    window = StageWindow(first_generation=generation, since_s=time.time())
    started = time.monotonic()
    records = steps.record_source(spec).stage(window, paired=shadow)
    grading = PairGrading(spec) if shadow and spec.gate_policy.paired is not None else None
    labels: dict[str, TraceEntry] = {}
    batches = max(1, -(-step.max_samples // spec.batch_size))
    report: GateReport | None = None
    for batch in range(batches):
        if trace:
            entries = evidence.stage_batch(trace, stage, batch, spec.batch_size)
            sent = evidence.send_batch(spec.router_url, entries, max_in_flight=spec.probe_concurrency,
                                       credential=credential)
            fresh = evidence.probe_labels(sent, entries)
            labels.update(fresh)
            records.settle(fresh)
        else:
            records.wait_for(spec.batch_size, spec.user_wait_s)
        arms = records.shadow(labels) if shadow else records.canary(*revisions, labels)
        final = batch == batches - 1
        proof = build_evidence(arms.stable, arms.candidate, exact_match, expected_candidate_share=share, final=final,
                               pair_scores=grading.scores(arms) if grading is not None else None)
        report = with_provenance(judge(gate, spec.gate_policy, proof), arms, records.refused)
        logger.info("%s batch %d/%d: %s; %s", stage, batch + 1, batches, report.outcome, arms.note())
        if stage_settled(report) or final:
            plot_stage(spec, stage, proof)  # the deciding look's figures, for the evidence run
            measured = sizing.measure(proof, spec.gate_policy, stage, time.monotonic() - started)
            return report, final or report.outcome == "inconclusive", measured
    assert report is not None
    return report, True, None


class PairGrading:
    """The policy's label-free pair graders, each pair graded once however many looks read it."""

    def __init__(self, spec: PromotionSpec) -> None:
        assert spec.gate_policy.paired is not None
        judge_at = JudgeEndpoint(spec.judge_url, spec.judge_model) if spec.judge_url else None
        self.graders = pair_graders(spec.gate_policy.paired.graders, judge_at)
        self.table: dict[str, dict[str, tuple[float, float]]] = {name: {} for name in self.graders}
        self.graded: set[str] = set()

    def scores(self, arms: evidence.StageArms) -> dict[str, dict[str, tuple[float, float]]]:
        """Grade the pairs not graded before; every grade so far, by grader and request id."""
        fresh = [r for r in arms.stable if r.request_id not in self.graded]
        for name, table in grade_pairs(answer_pairs(fresh, arms.candidate, arms.prompts), self.graders).items():
            self.table[name].update(table)
        self.graded.update(r.request_id for r in fresh)
        return self.table


def with_provenance(report: GateReport, arms: evidence.StageArms, refused: Sequence[str] = ()) -> GateReport:
    """The report with where its evidence came from; lost evidence turns a pass into inconclusive.

    Objects and records refused as evidence (forged, from a router the route does not name, duplicates)
    are named in the notes but change no outcome: whoever can write to the store cannot hold a rollout.
    """
    notes = (*report.notes, arms.note(), *(f"missing evidence: {problem}" for problem in arms.lost[:5]),
             *(f"refused as evidence: {item}" for item in refused[:5]),
             *((f"refused as evidence: {len(refused) - 5} more",) if len(refused) > 5 else ()))
    if arms.lost and report.outcome == "pass":
        return report.model_copy(update={"outcome": "inconclusive", "notes": notes})
    return report.model_copy(update={"notes": notes})


class Promotion:
    """The mutable driver of one promotion: its spec, ledger run, candidate target, state and route hold."""

    def __init__(self, spec: PromotionSpec, ledger: EvidenceLedger, run: EvidenceRun, target: RevisionTarget,
                 owner: RouteOwner | None = None, *, domains: dict[str, str] | None = None,
                 outbox: EvidenceOutbox | None = None) -> None:
        self.spec = spec
        self.ledger = ledger
        # Evidence after the decision's commit; the ledger is asked only once a write fails (tests drive bakes
        # with none).
        self.outbox = outbox or EvidenceOutbox(lambda: ledger.reachable())  # noqa: PLW0108
        self.run = run
        self.target = target
        self.domains = domains or {}  # each candidate endpoint's failure domain, for the snapshot
        self.state = start(spec.plan)
        self.before = steps.current_route(spec)  # its stable is what the rollback window returns to
        # The window compares with the old stable's traffic while both served: read from here on.
        self.started_s = time.time()
        self.owner = owner or RouteOwner(spec, self.before.generation)
        self.stable = self.before.stable.fingerprint
        self.reports = 0
        self.capacity_checks = 0
        self.latest_report = "No gate report yet."
        self.measured: Measured | None = None  # stable as the last stage measured it, for the next power check
        self.keys = RolloutKeys.new()  # the cohort's secret and the probes' credential, for this rollout only
        self.attestor = Attestor(spec, ledger, run, controller_key(spec))  # signs each decision
        # The old stable's replicas, asked for before the promotion's commit: what its window drains after.
        self.retiring: dict[steps.ReplicaKey, str] | None = None
        self.routers_behind: int | None = None  # a decision's generation some router did not serve in time

    def wait(self, seconds: float) -> None:
        """Sleep, cut short as soon as another writer takes the route (RouteTakenOver) or the run is cancelled."""
        if self.owner.wake.wait(seconds):
            self.owner.stop_if_ended()

    def apply_route(self) -> None:
        """Commit the route this state asks for, fenced on the rollout's own last write.

        Before candidate traffic goes up, the capacity rule must hold; while it does not, the
        rollout pauses, and rolls back if it does not come back within the plan's wait.
        """
        current = self.owner.check()
        if self._commits_promotion(current) and not self.ensure_capacity():
            self.state = commit_refused(self.state, "not enough ready capacity for the candidate's replicas to carry "
                                                    "all the traffic: the promotion was not committed")
        elif self._raises_candidate_traffic(current) and not self.ensure_capacity():
            self.state = advance(self.spec.plan, self.state, Abort("not enough ready capacity to move traffic"))
        if self.state.status in TERMINAL:
            self._before_decision(current)
        now = datetime.now(UTC)
        signed: list[Signed | None] = []  # a decision, signed for the generation its write commits

        def change(current: RouteSnapshot) -> RouteSnapshot | None:
            if self.state.status in TERMINAL:
                signed.append(self.sign_decision(current.generation + 1))
            return desired_route(current, self.state, self.target, lease_seconds=self.spec.plan.lease_seconds,
                                 by=self.spec.created_by, now=now, keys=self.keys, domains=self.domains,
                                 attestation=signed[-1].digest if signed and signed[-1] else None)

        proposed = self.owner.commit(change)
        if proposed is not None:
            decision = signed[-1] if signed else None
            self.outbox.write(f"route generation {proposed.generation}", partial(self._log_route, proposed, decision,
                                                                                   bool(signed)))
            self.await_routers(proposed.generation)

    def _before_decision(self, current: RouteSnapshot) -> None:
        """What a decision's commit needs known before it is made: from it on, the route is the truth and the
        evidence follows (held while the ledger is away); a promotion knows which replicas it retires."""
        self.outbox.defer()
        if self._commits_promotion(current) and self.retiring is None:
            try:
                self.retiring = steps.replicas_serving(self.spec, current.stable.endpoints)
            except Exception:  # asked again after the window; never a reason to hold the promotion back
                log.exception("the old stable's replicas could not be listed before the promotion's commit")

    def _log_route(self, written: RouteSnapshot, decision: Signed | None, attested: bool) -> None:
        self.ledger.log_document(self.run, f"route-generation-{written.generation:06d}", as_evidence(written))
        if attested:
            self.attestor.record(decision)

    def sign_decision(self, generation: int) -> Signed | None:
        """The decision this state states, signed for route generation ``generation`` (None without a key)."""
        return self.attestor.sign(self.state, generation, candidate=self.target.fingerprint, stable=self.stable,
                                  flow_run_id=flow_run.get_id() or "")

    def await_routers(self, generation: int) -> None:
        """A step counts as applied once every router serves its generation; a router behind stops the rollout."""
        try:
            served: dict[str, int | None] = steps.await_routers(self.spec, generation)
        except steps.RoutersBehind as behind:
            if self.state.status not in TERMINAL:
                raise RolloutStopped(behind.what, where=behind.where, fix=behind.fix) from None
            # A decision stands once committed: a router behind catches up from the store, and nothing the
            # decision retires is drained before every router serves it (Rollout._cleanup waits).
            get_run_logger().warning("%s; the decision stands, and what it retires is drained only once every "
                                     "router serves it", behind.what)
            self.routers_behind = generation
            served = steps.served_generations(self.spec)
        self.outbox.write(f"routers at generation {generation}", partial(
            self.ledger.log_json, self.run, f"routers-generation-{generation:06d}", {"served": served}))

    def _commits_promotion(self, current: RouteSnapshot) -> bool:
        """The write that moves all traffic to the candidate's replicas, not yet made."""
        return self.state.status == "promoted" and current.stable.fingerprint != self.target.fingerprint

    def _raises_candidate_traffic(self, current: RouteSnapshot) -> bool:
        if self.state.status in TERMINAL:
            return False
        # Canary weight and mirror rate each on their own: a canary after a 100% shadow is still an increase.
        weight = current.candidate.weight_ppm if current.candidate else 0
        sample = current.shadow.sample_ppm if current.shadow else 0
        return self.state.weight_ppm > weight or self.state.shadow_ppm > sample

    def ensure_capacity(self) -> bool:
        """The capacity rule for the traffic this state asks for; waits (paused) up to the plan's limit."""
        # Live traffic only: mirrored copies go through a bounded queue that drops (and counts) what the
        # shadow cannot take, so they never hold up a caller; the canary's share is callers' traffic.
        weight = PPM if self.state.status == "promoted" else self.state.weight_ppm  # the commit: all of it
        shares = {self.stable: 1 - weight / PPM, self.target.fingerprint: weight / PPM}
        deadline = time.monotonic() + self.spec.plan.capacity_wait_seconds
        first = True
        while True:
            check = steps.capacity(self.spec, shares, (self.before.stable, self.target))
            if check.ok or first or time.monotonic() >= deadline:
                self.capacity_checks += 1
                # Through the outbox like every other write: straight through before a decision (a ledger that
                # cannot take it stops the rollout), held and retried once a decision has committed.
                self.outbox.write(f"capacity check {self.capacity_checks}", partial(
                    self.ledger.log_json, self.run, f"capacity-{self.capacity_checks:02d}",
                    {"weight_ppm": self.state.weight_ppm, "shadow_ppm": self.state.shadow_ppm, **check.evidence()}))
            if check.ok:
                return True
            if time.monotonic() >= deadline:
                get_run_logger().warning("capacity still short after %d s: %s", self.spec.plan.capacity_wait_seconds,
                                         check.reason)
                return False
            if first:
                get_run_logger().warning("rollout paused, capacity short: %s", check.reason)
            first = False
            self.wait(min(self.spec.plan.renew_every_s, max(0.0, deadline - time.monotonic())))

    def publish(self, report: GateReport, stage: str) -> str:
        """Record a gate report in MLflow and as Prefect artifacts; the markdown shown to humans."""
        self.reports += 1
        markdown = report_markdown(report, stage)
        # JSON, readable markdown beside it, and the stage's figures as metrics (the auditor's view).
        name = f"gate-report-{self.reports:02d}-{stage}"
        digest = self.ledger.log_gate_report(self.run, name, report, markdown, self.state.step_index)
        self.attestor.note_report(name, digest, markdown)
        log_stage_plots(self.ledger, self.run, self.spec, stage)
        create_markdown_artifact(markdown, key=f"gate-report-{self.spec.route}", description=f"gates at {stage}")
        create_table_artifact(slice_rows(report), key=f"gate-slices-{self.spec.route}", description=stage)
        self.latest_report = markdown
        return markdown

    def ask_approval(self, step: Approve, markdown: str) -> ApprovalGiven:
        """Pause for a release manager on the plan's allow-list (flows.approval), or approve automatically
        where the spec says so."""
        if self.spec.approval == "auto":
            get_run_logger().warning("approval given automatically (spec.approval == 'auto')")
            return ApprovalGiven(True, self.state.evidence_digest, by="auto")
        given = approval.ask(self.ledger, self.run, question=step.prompt, markdown=markdown,
                             shown=self.state.evidence_digest, plan=self.spec.plan, route=self.spec.route,
                             timeout_s=self.spec.approval_timeout_s, stopped=self.owner.wake.is_set)
        self.owner.stop_if_ended()  # a cancel, a takeover or a fault during the pause decides, not the form
        self.attestor.note_answer(given)
        return given

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
            self.analyze(step, stage)
        elif isinstance(step, Approve):
            # The form shows the report whose digest the answer is bound to.
            self.state = advance(self.spec.plan, self.state, self.ask_approval(step, self.latest_report))
        elif isinstance(step, Bake):
            self.wait(step.seconds)  # the heartbeat keeps the leases; another writer ends the bake at once
            self.state = advance(self.spec.plan, self.state, StepApplied())
        else:
            self.state = advance(self.spec.plan, self.state, StepApplied())

    def analyze(self, planned: Analyze, stage: str) -> None:
        """Size the stage (the power check), wait for both arms to drain, judge it, and feed the decision on."""
        size = self.size(planned, stage)
        if size.refusal is not None:
            get_run_logger().warning("%s refused: %s", stage, size.refusal)
            self.state = advance(self.spec.plan, self.state, Abort(size.refusal))
            return
        endpoints = (*self.before.stable.endpoints, *self.target.endpoints)
        drained = steps.await_idle_replicas(self.spec, endpoints, limit_s=self.spec.drain_wait_s)
        self.ledger.log_json(self.run, f"drained-{stage}", drained)
        report, at_limit, self.measured = analyze_task(
            self.spec, self.state, size.step, stage, stable=self.stable, candidate=self.target.fingerprint,
            generation=self.owner.generation, keys=self.keys,
        )
        waited = f"counting began once both arms' replicas were idle ({drained['waited_s']} s)" if drained["idle"] \
            else f"both arms' replicas were still busy after {drained['waited_s']} s: {drained['busy']}"
        if drained["unwatched"]:
            waited += f" (not watched, served by no agent of this rollout: {', '.join(drained['unwatched'])})"
        report = report.model_copy(update={"notes": (*report.notes, size.line(), waited)})
        self.publish(report, stage)
        reason = "; ".join(f"{g.gate}: {g.reason}" for g in report.failed())
        if at_limit and report.outcome != "pass" and not report.failed():
            reason = self.inconclusive_rule(report, stage)
        event = GateDecided(report.outcome, report.evidence_digest, at_limit=at_limit, reason=reason)
        self.state = advance(self.spec.plan, self.state, event)

    def size(self, planned: Analyze, stage: str) -> sizing.Sizing:
        """The power check of the stage from stable's last measurement; logged with the evidence."""
        trace = read_trace(Path(self.spec.trace)) if self.spec.probes else []
        paired_stage = bool(self.state.shadow_ppm) and not self.state.weight_ppm
        shape = sizing.stage_shape(self.spec, trace, planned.max_samples, weight_ppm=self.state.weight_ppm,
                                   shadow_ppm=self.state.shadow_ppm,
                                   pace=self.measured.samples_per_second if self.measured else None)
        size = sizing.size_stage(self.spec, planned, shape, sizing.sized_policy(self.spec.gate_policy, paired_stage),
                                 self.measured)
        size = replace(size, note=sizing.paired_note(self.spec.gate_policy, paired_stage))
        self.ledger.log_json(self.run, f"power-{stage}", size.record())
        get_run_logger().info("%s %s", stage, size.line())
        return size

    def inconclusive_rule(self, report: GateReport, stage: str) -> str:
        """Undecided at the stage's limit: the policy's stated rule decides, and says that it did."""
        rule = (f"the rollout plan's on_inconclusive={self.spec.plan.on_inconclusive}"
                if report.outcome == "inconclusive" else "the gate policy's on_inconclusive=fail")
        undecided = ", ".join(g.gate for g in report.gates if g.outcome == "inconclusive") or "none"
        reason = f"inconclusive at the stage's limit (undecided: {undecided}); decided by {rule}"
        self.ledger.log_json(self.run, f"decision-rule-{stage}", {"rule": rule, "undecided": undecided,
                                                                   "outcome": report.outcome})
        return reason

    def run_plan(self) -> RolloutState:
        """Walk the plan to a terminal state, committing each route change as it is asked for."""
        self.apply_route()
        while self.state.status not in TERMINAL:
            self.owner.stop_if_ended()
            if self.state.status == "paused":
                self.state = self.decide_paused()
            else:
                self.step_once()
            self.apply_route()
        return self.state

    def roll_back(self, reason: str) -> None:
        """Route back to stable (fenced: never on top of another writer's change)."""
        if self.state.status not in TERMINAL:
            self.state = advance(self.spec.plan, self.state, Abort(reason))
            self.apply_route()

    def watch_window(self, promoted_at_s: float) -> WindowVerdict | None:
        """The rollback window: the old stable stays ready and routable; a failing promoted revision is reverted.

        Runs without the route lock, so an operator's rollback is never blocked; it ends the watch.
        """
        plan, check = self.spec.plan, self.spec.plan.post_promotion
        records = steps.record_source(self.spec).tail(self.started_s)
        deadline = time.monotonic() + plan.rollback_window_seconds
        verdict: WindowVerdict | None = None
        seen = WindowTally()
        while (left := deadline - time.monotonic()) > 0:
            self.wait(min(1.0, left))
            self.owner.check()
            seen = tally(seen, records.poll(), check, promoted=self.target.fingerprint,
                         old_stable=self.before.stable.fingerprint, promoted_at_s=promoted_at_s)
            verdict = window_verdict(check, seen)
            if verdict.outcome == "fail":
                get_run_logger().warning("rollback window: %s; reverting to the old stable", verdict.reason)
                self.revert(f"rollback window: {verdict.reason}")
                return verdict
        return verdict

    def revert(self, reason: str) -> None:
        """After promotion: the old stable alone again, on its endpoints (still ready in the window); a decision
        of its own, signed like the promotion."""
        decided = replace(self.state, status="rolled_back", reason=reason)
        signed: list[Signed | None] = []

        def reverted(current: RouteSnapshot) -> RouteSnapshot:
            back = revert_to(current, self.before, by=self.spec.created_by, now=datetime.now(UTC))
            signed.append(self.attestor.sign(decided, back.generation, candidate=self.target.fingerprint,
                                             stable=self.stable, flow_run_id=flow_run.get_id() or ""))
            if signed[-1] is None:
                return back
            return RouteSnapshot.build(**{**back.model_dump(), "decision_attestation": signed[-1].digest})

        self.outbox.defer()
        written = self.owner.commit(reverted)
        if written is not None:
            self.outbox.write(f"route generation {written.generation}",
                              partial(self._log_route, written, signed[-1] if signed else None, True))
        self.state = decided


QUIET_FLUSH_S = 10.0  # held evidence that lands within this is not worth a word
DECIDED = "decided: "  # the log line a follower returns at, before the rollback window ends


def window_outcome(verdict: WindowVerdict | None, ended_by: str) -> str:
    """How the rollback window ended, in a few words."""
    if ended_by:
        return f"ended: {ended_by}"
    if verdict is None:
        return "ended: no live traffic of the promoted revision was read from the record sink"
    return f"ended {verdict.outcome}: {verdict.reason}"


def run_cancelled() -> Callable[[], bool] | None:
    """Whether this flow run was cancelled (None outside a flow run): a run started in-process has no
    runner to kill it, so the heartbeat asks the API."""
    run_id = flow_run.get_id()
    if run_id is None:
        return None

    def cancelled() -> bool:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(run_id)).state
        return state is not None and (state.is_cancelling() or state.is_cancelled())

    return cancelled


def hold_route_lock(spec: PromotionSpec) -> RouteLock:
    """Take the route's one-slot lock (``flows.route_lock``); RolloutInProgress when another rollout holds it.

    The lock's lease outlives a killed controller by at most the rollout's lease (Prefect's floor is 60 s).
    Kept by this process through a Prefect outage, and taken again if its lease ended meanwhile: the
    lock only keeps a second rollout from starting; the route's fence is what keeps two from writing.
    """
    try:
        say = get_run_logger().warning
    except Exception:  # outside a flow run (a test, a script): the module's log
        say = log.warning
    return RouteLock(spec.route, spec.plan.lease_seconds, say=say).take()


def give_back_route_lock(spec: PromotionSpec, lock: RouteLock) -> None:
    """:func:`release_route_lock`, warning when the lock stays held until its lease ends."""
    why = release_route_lock(lock)
    if why:
        get_run_logger().warning("the route lock %s could not be given back (%s): it ends with its lease within "
                                 "%d s; a new rollout of the route is refused until then", lock_name(spec.route),
                                 why, max(60, spec.plan.lease_seconds))


@flow(name="promote-revision", log_prints=True)
def promote_revision(spec: PromotionSpec) -> str:
    """Promote ``spec.candidate_manifest`` on ``spec.route`` or roll it back; returns the decision."""
    lock = hold_route_lock(spec)
    try:
        return Rollout(spec, lock).run()
    finally:
        give_back_route_lock(spec, lock)


def replica_key(view: ReplicaView) -> steps.ReplicaKey:
    """A replica's key in the fleet: its worker agent and its id there."""
    return view.worker_url.rstrip("/"), view.replica_id


class Rollout:
    """One run of the flow: its evidence run, the replicas it started or retired, and the cleanup that always runs."""

    def __init__(self, spec: PromotionSpec, lock: RouteLock) -> None:
        self.spec = spec
        self.lock = lock
        self.ledger = EvidenceLedger(spec.tracking_uri, Path(spec.evidence_root) / "mlflow-artifacts")
        self.outbox = EvidenceOutbox(self.ledger.reachable, say=get_run_logger().warning)
        self.driver: Promotion | None = None
        self.heartbeat: Heartbeat | None = None
        self.started: dict[steps.ReplicaKey, str] = {}  # (worker, replica) -> endpoint: the candidate's replicas
        self.retired: dict[steps.ReplicaKey, str] = {}  # the old stable's replicas, once the promotion retired them
        self.candidate = ""
        self.windowing = False
        self.version = ""  # the candidate's model version, once registered
        self.recorded = ""  # the decision its version page states

    def run(self) -> str:
        """Pin and open the evidence run, then everything else; the decision the route shows at the end."""
        spec = self.spec
        controller_key(spec)  # a controller key that cannot sign fails the rollout here, before anything moves
        revision, engine = pin_task(spec)
        self.candidate = revision.fingerprint
        run = self.ledger.open_run(spec.route, revision.fingerprint, {"revgate.candidate_name": spec.candidate_name,
                                                                      "prefect_flow_run_id": flow_run.get_id() or ""})
        for name, document in (("service-revision", revision), ("gate-policy", spec.gate_policy), ("plan", spec.plan)):
            self.ledger.log_document(run, name, document)
        # Whose engine the runtime was pinned from, and what it said it can run.
        self.ledger.log_json(run, "agent-engine", {"agent": engine.url, "device": engine.device,
                                                   "capabilities": engine.capabilities})
        decision = "failed"
        try:
            self._promote(run, revision)
        except RouteTakenOver as taken:
            self._record_takeover(run, taken.taken)
        except RolloutStopped as stopped:  # a cancel, a dead candidate: a decision, not a crash
            get_run_logger().warning("rollout stopped: %s", stopped.what)
            self.outbox.write("the stop", partial(self.ledger.log_step, run, "stopped", stopped.what))
            self._stop_traffic(run, stopped.what, fault=True)
        except BaseException as error:
            self._stop_traffic(run, f"the promotion flow failed: {type(error).__name__}")
            raise
        finally:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            decision = self._decision()
            self.outbox.defer()  # the route's decision stands: its evidence follows, whatever the ledger does
            self._settle_registry(run, decision)
            self._cleanup()
            reason = self.driver.state.reason if self.driver is not None else ""
            self.outbox.write("the decision", partial(self.ledger.log_json, run, "decision",
                                                      {"decision": decision, "reason": reason}))
            self.outbox.write("the run's close", partial(self.ledger.close, run, decision))
            self._flush(run, decision)
        return decision

    def _flush(self, run: EvidenceRun, decision: str) -> None:
        """Wait for the held evidence to land (the ledger may be away); say what never did."""
        held = self.outbox.wait(QUIET_FLUSH_S)
        if held:
            get_run_logger().warning("waiting up to %.0f s for the evidence ledger to take %d held writes "
                                     "(the run closes with %r when it does)", self.spec.ledger_wait_s, len(held),
                                     decision)
        left = self.outbox.flush(self.spec.ledger_wait_s)
        if left:
            get_run_logger().error("the evidence ledger did not take %d writes within %.0f s: %s; run %s stays open. "
                                   "The route's decision stands (%s); `revgate evidence` names the gap", len(left),
                                   self.spec.ledger_wait_s, ", ".join(left), run.run_id, decision)
        if self.outbox.dropped:
            get_run_logger().error("evidence writes dropped as broken: %s", ", ".join(self.outbox.dropped))

    def _promote(self, run: EvidenceRun, revision: ServiceRevision) -> None:
        spec, ledger = self.spec, self.ledger
        ledger.log_step(run, "verify", "pass", verify_task(spec, revision))
        ledger.log_json(run, "capacity-00", capacity_task(spec, steps.current_route(spec).stable))
        replicas = start_task(spec, revision)
        self.started.update((replica_key(r), r.endpoint.rstrip("/")) for r in replicas)
        views = [load_task(spec, replica) for replica in replicas]  # they load in parallel, on their own agents
        self.started.update((replica_key(v), v.endpoint.rstrip("/")) for v in views)
        for index, view in enumerate(views, 1):  # each replica's own record; the steps below sum them up
            ledger.log_json(run, f"replica-{index:02d}", {key: getattr(view, key) for key in REPLICA_FACTS})
        ledger.log_step(run, "load", "ready", {**slowest([view.timings_s for view in views]),
                                               "replicas": float(len(views))})
        ledger.log_step(run, "isolated-check", "pass", slowest([isolated_task(view) for view in views]))
        driver = self.driver = Promotion(spec, ledger, run, steps.candidate_target(views, revision),
                                         domains=steps.failure_domains(views), outbox=self.outbox)
        self.heartbeat = Heartbeat(driver.owner, lease_seconds=spec.plan.lease_seconds,
                                   period_s=spec.plan.renew_every_s, by=spec.created_by, cancelled=run_cancelled(),
                                   watch_every_s=spec.plan.watch_every_s,
                                   watches=[steps.CandidateWatch([replica_key(v) for v in views],
                                                                 silence_s=float(spec.plan.lease_seconds),
                                                                 ask=partial(steps.replica_view, spec)),
                                            taken_by_another(self.lock)])
        self.heartbeat.__enter__()
        self._register_candidate(run, driver)
        if driver.run_plan().status != "promoted":
            return
        promoted_at = time.time()
        self.retired = driver.retiring if driver.retiring is not None else \
            steps.replicas_serving(spec, driver.before.stable.endpoints)
        self._record_decision(run, "promoted")
        give_back_route_lock(spec, self.lock)  # the window never holds the route against an operator's rollback
        self._announce_window(run)
        self.windowing = True
        verdict = driver.watch_window(promoted_at)
        self.windowing = False
        if verdict is not None:
            self.outbox.write("the window's verdict", partial(ledger.log_json, run, "rollback-window",
                                                              verdict.evidence()))
        outcome = window_outcome(verdict, driver.state.reason if driver.state.status != "promoted" else "")
        self.outbox.write("the window's end", partial(ledger.tag, run, WINDOW_TAG, outcome))

    def _announce_window(self, run: EvidenceRun) -> None:
        """The decision is made: say so now (``revgate promote`` returns here) and when the window ends."""
        seconds = self.spec.plan.rollback_window_seconds
        # Final unless the window reverts it.
        self.outbox.write("the decision's tag", partial(self.ledger.tag, run, "revgate.decision", "promoted"))
        if seconds <= 0:
            return
        # Whoever returns at the line below (revgate promote) reads the registry next: let the decision's writes
        # land first, unless the ledger is away.
        self.outbox.wait(QUIET_FLUSH_S)
        until = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="seconds")
        self.outbox.write("the window's start", partial(self.ledger.tag, run, WINDOW_TAG, f"{OPEN_UNTIL}{until}"))
        get_run_logger().info("%s%s; the rollback window watches until %s (revgate status shows how it ends)",
                              DECIDED, "promoted", until)

    def _register_candidate(self, run: EvidenceRun, driver: Promotion) -> None:
        """A model version for the candidate before it reaches traffic, named by the ``candidate`` alias: every
        revision that served users has a version, whatever its rollout decided."""
        model = self.spec.model_name
        self.version = self.ledger.register_version(run, model, driver.target.fingerprint)
        self.ledger.describe_version(model, self.version, version_facts(self.ledger, run, self.spec, IN_ROLLOUT))
        self.ledger.move_alias(model, "candidate", self.version, by=self.spec.created_by,
                               generation=driver.owner.generation)

    def _record_decision(self, run: EvidenceRun, decision: str) -> None:
        """The candidate's version page says the decision, the ``candidate`` alias goes, and the ``stable``
        alias follows the route (onto the candidate when promoted; back where a revert or rollback put it)."""
        if not self.version:
            return
        generation = self.driver.owner.generation if self.driver is not None else 0
        self.recorded = decision
        self.outbox.write(f"the registry's {decision!r}", partial(self._describe_decision, run, decision, generation))
        self._follow_route()

    def _describe_decision(self, run: EvidenceRun, decision: str, generation: int) -> None:
        model, ledger = self.spec.model_name, self.ledger
        ledger.describe_version(model, self.version, version_facts(ledger, run, self.spec, decision))
        ledger.drop_alias(model, "candidate", by=self.spec.created_by, generation=generation)

    def _follow_route(self) -> None:
        """The registry's ``stable`` alias onto what the route serves now (read when the write is made)."""
        logger = get_run_logger()

        def follow() -> None:
            logger.info("%s", follow_route(self.ledger, self.spec.model_name, steps.current_route(self.spec)).line())

        self.outbox.write("the registry's stable alias", follow)

    def _record_takeover(self, run: EvidenceRun, taken: Takeover) -> None:
        """Another writer ended the rollout: say who and where, in the rollout's own evidence run."""
        get_run_logger().warning("rollout stopped: %s", taken.reason)
        self.outbox.defer()  # another writer's route is the truth now
        if self.windowing:
            self.outbox.write("the window's end", partial(self.ledger.tag, run, WINDOW_TAG, f"ended: {taken.reason}"))
        self.outbox.write("the takeover", partial(self.ledger.log_step, run, "route", taken.reason))
        self.outbox.write("the takeover's writer", partial(self.ledger.log_json, run, "aborted", {
            "writer": taken.writer, "generation": taken.generation, "reason": taken.reason}))
        if self.driver is not None:
            self.driver.state = replace(self.driver.state, reason=taken.reason)

    def _stop_traffic(self, run: EvidenceRun, reason: str, *, fault: bool = False) -> None:
        """An error ends the rollout: candidate traffic back to stable, unless the route is not ours any more.

        In the rollback window only a fault of the promoted revision reverts it (the old stable is
        still ready); an error of the controller itself leaves a promotion standing.
        """
        if self.driver is None:
            return
        try:
            if self.windowing and fault:
                self.driver.revert(reason)
                self.outbox.write("the window's end", partial(self.ledger.tag, run, WINDOW_TAG,
                                                              f"ended: reverted: {reason}"))
            elif not self.windowing:
                self.driver.roll_back(reason)
        except RouteTakenOver as taken:
            self._record_takeover(run, taken.taken)
        except Exception:  # the original error is the one to report; the leases still run out
            log.exception("could not route back to stable after the failure")

    def _settle_registry(self, run: EvidenceRun, decision: str) -> None:
        """After the window (or a rollout that ended short of promotion): the registry says what the route
        serves. A registry that cannot be written is logged, never a change of the decision."""
        if not self.version:
            return
        try:
            if decision != self.recorded:
                self._record_decision(run, decision)
            else:
                self._follow_route()
        except Exception:
            log.exception("the model registry could not follow route %s; `revgate evidence` names the gap",
                          self.spec.route)

    def _routers_caught_up(self, generation: int) -> bool:
        """Whether every router serves ``generation``: asked again (up to one lease) only when a decision's
        commit left some router behind; otherwise each step already waited for them."""
        if self.driver is None or self.driver.routers_behind is None:
            return True
        deadline = time.monotonic() + self.spec.plan.lease_seconds
        while routers_behind(steps.served_generations(self.spec), generation):
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)
        return True

    def _decision(self) -> str:
        """What the route says: promoted only while the candidate is its stable revision."""
        if self.driver is None:
            return "failed"  # nothing was ever routed
        try:
            return decision_of(steps.current_route(self.spec), self.candidate)
        except Exception:
            log.exception("route unreadable; the decision is the rollout's own state")
            return self.driver.state.status if self.driver.state.status in TERMINAL else "failed"

    def _cleanup(self) -> None:
        """Drain, by replica, what this rollout started or retired that no router may send new requests to.

        A candidate still named under a live lease (another writer kept it) is drained once that lease ends.
        """
        replicas = {**self.started, **self.retired}
        if not replicas:
            return
        try:
            route: RouteSnapshot | None = steps.current_route(self.spec)
        except Exception:
            route = None
        if route is not None and (end := lease_end(route, [url for url in replicas.values() if url])) is not None:
            wait_s = min((end - datetime.now(UTC)).total_seconds(), float(self.spec.plan.lease_seconds))
            time.sleep(max(0.0, wait_s) + 1)
        if route is None:  # the candidate may be stable by now: leave every replica up rather than guess
            log.warning("route %s unreadable: replicas %s left running", self.spec.route, sorted(replicas.values()))
            return
        if not self._routers_caught_up(route.generation):
            log.warning("a router does not serve generation %d of route %s: replicas %s left running, since it may "
                        "still send to them", route.generation, self.spec.route, sorted(replicas.values()))
            return
        others = steps.other_routes(self.spec)  # routes of the same store may share a stable replica
        now = datetime.now(UTC)
        for key, url in replicas.items():
            # A replica with no endpoint yet never took traffic.
            if url and not drainable([route, *(others or [])], [url], now):
                continue
            if others is None and key in self.retired:
                continue  # other routes unknown: never drain what one of them may serve
            try:
                steps.drain_replica(self.spec, key)
            except Exception:
                log.exception("could not drain replica %s on %s", key[1], key[0])
