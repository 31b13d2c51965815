"""The rollout state machine: pure transitions over a rollout plan.

The flow (or the demo driver) does the I/O: it applies the route a state asks for, waits the bake
time, runs the gates, asks for approval, and feeds what happened back in as an event. Desired
traffic (this state) and observed traffic (the committed route snapshot) are kept apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from revgate.manifests.gates import Outcome
from revgate.manifests.rollout import Analyze, Approve, Bake, RolloutPlan, RolloutStep, SetWeight, Shadow

Status = Literal["running", "awaiting_approval", "paused", "promoted", "rolled_back"]
TERMINAL: frozenset[Status] = frozenset({"promoted", "rolled_back"})


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where a rollout is: the step it is on, the traffic it wants, and why it stopped if it did."""

    step_index: int = 0
    status: Status = "running"
    weight_ppm: int = 0
    shadow_ppm: int = 0
    reason: str = ""
    evidence_digest: str = ""
    approved_by: str = ""  # who gave the latest approval the rollout went on with


@dataclass(frozen=True, slots=True)
class StepApplied:
    """A shadow, set-weight or bake step has been carried out (route committed, bake elapsed)."""


@dataclass(frozen=True, slots=True)
class GateDecided:
    """The gates of an analyse step reached an outcome (``at_limit``: the stage's sample budget is spent)."""

    outcome: Outcome
    report_digest: str
    at_limit: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ApprovalGiven:
    """A release manager answered; the approval is valid only for the evidence it was shown.

    ``by`` names who answered (a person, or ``auto`` / ``timeout``); see ``promotion.approval.decide``.
    """

    approved: bool
    evidence_digest: str
    by: str = ""


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop now and route back to stable (operator abort, lease lost, worker failure)."""

    reason: str


Event = StepApplied | GateDecided | ApprovalGiven | Abort


class TransitionRefused(ValueError):
    """An event that does not fit the current step (a programming error in the driver)."""


def current_step(plan: RolloutPlan, state: RolloutState) -> RolloutStep | None:
    """The step the rollout is on, or None once it is past the last step or terminal."""
    if state.status in TERMINAL or state.step_index >= len(plan.steps):
        return None
    return plan.steps[state.step_index]


def start(plan: RolloutPlan) -> RolloutState:
    """The initial state: on the first step, no candidate traffic."""
    return _enter(plan, RolloutState())


def advance(plan: RolloutPlan, state: RolloutState, event: Event) -> RolloutState:
    """The next state after ``event``; terminal states absorb every event."""
    if state.status in TERMINAL:
        return state
    if isinstance(event, Abort):
        return _rolled_back(state, event.reason)
    step = current_step(plan, state)
    if isinstance(event, GateDecided) and isinstance(step, Analyze):
        return _after_gate(plan, state, event)
    if isinstance(event, ApprovalGiven) and isinstance(step, Approve):
        return _after_approval(plan, state, event)
    if isinstance(event, StepApplied) and isinstance(step, Shadow | SetWeight | Bake):
        return _next(plan, state)
    raise TransitionRefused(f"event {type(event).__name__} does not apply to step {step!r} in status {state.status}")


def _enter(plan: RolloutPlan, state: RolloutState) -> RolloutState:
    """Apply the traffic a step asks for as soon as the rollout reaches it."""
    step = current_step(plan, state)
    if step is None:
        return replace(state, status="promoted", reason="every step passed", shadow_ppm=0)
    if isinstance(step, Shadow):
        return replace(state, shadow_ppm=step.sample_ppm)
    if isinstance(step, SetWeight):
        # Canary traffic replaces mirroring: the candidate's answers are now live.
        return replace(state, weight_ppm=step.weight_ppm, shadow_ppm=0)
    if isinstance(step, Approve):
        return replace(state, status="awaiting_approval")
    return state


def _next(plan: RolloutPlan, state: RolloutState) -> RolloutState:
    return _enter(plan, replace(state, step_index=state.step_index + 1, status="running", reason=""))


def _after_gate(plan: RolloutPlan, state: RolloutState, event: GateDecided) -> RolloutState:
    state = replace(state, evidence_digest=event.report_digest)
    if event.outcome == "pass":
        return _next(plan, state)
    if event.outcome == "fail":
        return _rolled_back(state, event.reason or "a gate failed")
    if not event.at_limit:
        return state  # inconclusive, budget left: keep collecting evidence
    if plan.on_inconclusive == "fail":
        return _rolled_back(state, "gates still inconclusive at the stage's sample limit")
    return replace(state, status="paused", reason="gates inconclusive at the stage's sample limit: a human decides")


def _after_approval(plan: RolloutPlan, state: RolloutState, event: ApprovalGiven) -> RolloutState:
    if not event.approved:
        return _rolled_back(state, f"rejected by {event.by or 'a release manager'}")
    if event.evidence_digest != state.evidence_digest:
        raise TransitionRefused(
            f"approval was given for evidence {event.evidence_digest}, "
            f"but the current evidence is {state.evidence_digest}"
        )
    return _next(plan, replace(state, approved_by=event.by))


def commit_refused(state: RolloutState, reason: str) -> RolloutState:
    """The promotion commit cannot be made (the candidate's replicas cannot carry all the traffic): the
    rollout is rolled back instead, with the reason. Only a promotion not yet committed can be refused."""
    if state.status != "promoted":
        raise TransitionRefused(f"only a promotion can be refused at its commit; this rollout is {state.status}")
    return _rolled_back(state, reason)


def _rolled_back(state: RolloutState, reason: str) -> RolloutState:
    return replace(state, status="rolled_back", weight_ppm=0, shadow_ppm=0, reason=reason)


def resume(plan: RolloutPlan, state: RolloutState, *, proceed: bool, by: str = "") -> RolloutState:
    """A human's answer to a paused rollout: proceed past the analyse step, or roll back."""
    if state.status != "paused":
        raise TransitionRefused(f"only a paused rollout can be resumed; this one is {state.status}")
    if not proceed:
        return _rolled_back(state, f"stopped by {by or 'a release manager'} after inconclusive gates")
    return _next(plan, state)
