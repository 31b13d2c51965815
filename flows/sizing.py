"""Sizing a stage before it starts: the power check's inputs from the spec, the trace and the last stage.

``evaluation.power`` does the arithmetic; this module gathers what it needs (what the stage will
deliver per arm and slice, stable's rates and latency spread as the previous stage measured them,
the pace it ran at) and turns the answer into the stage to run: as planned, extended up to the
step's ``extend_to``, or refused with the reason.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from revgate.evaluation import power
from revgate.evaluation.gates import Evidence as GateEvidence
from revgate.evaluation.gates import scores_by_slice, slice_function
from revgate.evaluation.traces import TraceEntry
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.rollout import Analyze
from revgate.manifests.route import PPM

TARGET_WHEN_UNSET = 0.9  # the report's power line compares with this when the plan sets no target


@dataclass(frozen=True, slots=True)
class Measured:
    """What one stage measured of stable (for the next stage's check) and the pace it ran at."""

    profile: power.StableProfile
    samples_per_second: float | None


@dataclass(frozen=True, slots=True)
class Sizing:
    """The stage to run, the check behind it, and the refusal when no stage within the limits can decide."""

    step: Analyze
    check: power.StagePower
    extended_from: int | None = None
    refusal: str | None = None
    note: str = ""

    def line(self) -> str:
        """The power line for the report and the log, with any extension."""
        line = self.check.line() + (f"; {self.note}" if self.note else "")
        if self.extended_from is not None:
            line += (f"; extended from {self.extended_from} to {self.step.max_samples} samples so that every "
                     f"cell can reach its horizon")
        return line

    def record(self) -> dict[str, object]:
        """The check as JSON, for the evidence run."""
        return {"target": self.check.target, "ok": self.check.ok, "line": self.line(), "refusal": self.refusal,
                "max_samples": self.step.max_samples, "extended_from": self.extended_from,
                "expected_seconds": self.check.expected_seconds, "notes": list(self.check.notes),
                "cells": [{"gate": c.gate, "cell": c.cell, "samples_per_arm": c.samples, "horizon": c.horizon,
                           "pass_probability_if_equal": round(c.passed, 4), "samples_needed": c.needed,
                           "basis": c.basis} for c in self.check.cells]}


PAIRED_LATENCY_OFF = ("paired latency is off in this policy: in shadow the candidate answers the mirror's copy "
                      "after stable has answered the caller, under another load, so a pair would compare loads")


def paired_note(policy: GatePolicy, paired_stage: bool) -> str:
    """What the shadow stage's report says of paired latency when the policy leaves it off."""
    off = paired_stage and policy.paired is not None and not policy.paired.latency_metrics
    return PAIRED_LATENCY_OFF if off else ""


def sized_policy(policy: GatePolicy, paired_stage: bool) -> GatePolicy:
    """The two-sample gates that judge this stage: none of quality and latency where pairs replace them."""
    if paired_stage and policy.paired is not None:
        return policy.model_copy(update={"two_sample_quality": False, "latency_metrics": ()})
    return policy


def stage_shape(spec: PromotionSpec, trace: Sequence[TraceEntry], samples: int, *, weight_ppm: int,
                shadow_ppm: int, pace: float | None) -> power.StageShape:
    """Samples per arm the stage sends (the smaller arm of a canary, the mirrored share of a shadow) and the
    probe trace's share of each quality slice."""
    share = min(weight_ppm, PPM - weight_ppm) / PPM if weight_ppm else shadow_ppm / PPM
    policy = spec.gate_policy
    counts = Counter(_slice_of(entry, policy.slice_keys) for entry in trace) if policy.slicing is None else Counter()
    total = sum(counts.values())
    shares = {name: count / total for name, count in counts.items()} if total else {}
    return power.StageShape(samples_per_arm=int(samples * share), slice_shares=shares, samples_per_second=pace)


def _slice_of(entry: TraceEntry, keys: Sequence[str]) -> str:
    if not keys:
        return "all"
    return ",".join(f"{key}={entry.slices.get(key, '?')}" for key in keys)


def size_stage(spec: PromotionSpec, step: Analyze, shape: power.StageShape, policy: GatePolicy,
               measured: Measured | None) -> Sizing:
    """Check the stage; with the plan's power target, extend it (up to ``extend_to``) or refuse it."""
    target = float(spec.plan.power_target) if spec.plan.power_target is not None else None
    profile = measured.profile if measured is not None else None
    check = power.stage_power(policy, shape, profile, target or TARGET_WHEN_UNSET)
    if target is None or check.ok:
        return Sizing(step, check)
    arm_share = shape.samples_per_arm / step.max_samples if step.max_samples else 0.0
    most = int((step.extend_to or step.max_samples) * arm_share)
    wanted = power.samples_to_reach(check, shape, most)
    if wanted is not None and arm_share > 0:
        longer = power.StageShape(wanted, shape.slice_shares, shape.samples_per_second)
        extended = Analyze(max_samples=math.ceil(wanted / arm_share), extend_to=step.extend_to)
        return Sizing(extended, power.stage_power(policy, longer, profile, target), extended_from=step.max_samples)
    weakest = check.weakest
    assert weakest is not None  # a check below its target has a weakest cell
    limit = step.extend_to or step.max_samples
    return Sizing(step, check, refusal=(
        f"the plan cannot decide: {weakest.describe()}, below the power target {target:.2f} within the stage's "
        f"limit of {limit} samples; lengthen the stage (Analyze.extend_to), raise the policy's horizon, or widen "
        f"the margin"))


def measure(evidence: GateEvidence, policy: GatePolicy, stage: str, elapsed_s: float) -> Measured:
    """Stable's graded rate per slice and latency spread in this stage, and the stage's pace."""
    by_slice = scores_by_slice(evidence.stable, evidence.stable_scores, policy.slice_keys, slice_function(policy))
    rates = {name: [score for _, score in pairs] for name, pairs in by_slice.items()}
    latency = policy.latency_metrics or ("ttft", "e2e")
    profile = power.profile_of(evidence.stable, rates, latency, f"measured in {stage}")
    count = len(evidence.stable) + len(evidence.candidate)
    return Measured(profile, count / elapsed_s if elapsed_s > 0 and count else None)

