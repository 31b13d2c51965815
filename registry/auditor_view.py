"""What an auditor reads in the MLflow UI, derived from the evidence: metric series and the version's description.

Pure: the ledger writes what these functions compute. Metrics are logged with the stage's index as
their step, so MLflow's own charts put the stages of one rollout on one axis and compare rollouts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from revgate.manifests.gates import GateReport, GateResult

UNSAFE = re.compile(r"[^\w.\-/ ]")  # MLflow metric names allow word characters, '.', '-', '/', ' '
INTERVAL = ("estimate", "lower", "upper")


def metric_name(*parts: str) -> str:
    """A metric key MLflow accepts: parts joined by '.', other characters (``=``, ``*``) as '_'."""
    return ".".join(UNSAFE.sub("_", part) for part in parts)


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _pick(numbers: Mapping[str, str], prefix: tuple[str, ...], keys: Sequence[str]) -> dict[str, float]:
    picked = {metric_name(*prefix, key): _number(numbers.get(key)) for key in keys}
    return {key: value for key, value in picked.items() if value is not None}


def _gate_metrics(gate: GateResult) -> dict[str, float]:
    if gate.gate in ("quality", "quality-paired"):
        found: dict[str, float] = {}
        for result in gate.slices:
            # Two-sample slices carry an interval; paired ones their pair count and z statistics.
            found |= _pick(result.numbers, ("quality", result.slice), (*INTERVAL, "candidate_samples",
                                                                         "stable_samples", "pairs", "z_worse"))
        return found
    if gate.gate.startswith("slo-"):
        request_class = gate.gate.removeprefix("slo-").replace("*", "all")
        return _pick(gate.numbers, ("slo", request_class), ("attainment", "lower", "upper", "stable_attainment"))
    if gate.gate == "errors":
        rates = [key for key in gate.numbers if key.startswith(("candidate_", "stable_")) and
                 not key.endswith("_samples")]
        return _pick(gate.numbers, ("errors",), (*INTERVAL, *sorted(rates)))
    if gate.gate.startswith("latency-"):
        return _pick(gate.numbers, (gate.gate,), INTERVAL)
    return {}


def stage_metrics(report: GateReport) -> dict[str, float]:
    """One stage's figures: samples per arm, quality per slice with its interval, SLO attainment, error rates."""
    found = {
        "samples.stable": float(report.stable.requests),
        "samples.candidate": float(report.candidate.requests),
        "gates.passed": float(sum(gate.outcome == "pass" for gate in report.gates)),
        "gates.failed": float(sum(gate.outcome == "fail" for gate in report.gates)),
    }
    for gate in report.gates:
        found |= _gate_metrics(gate)
    return found


@dataclass(frozen=True, slots=True)
class StageSummary:
    """One gate report, as the version's description lists it."""

    stage: str
    outcome: str
    stable_samples: int
    candidate_samples: int
    failed: tuple[str, ...]


def summarize(report: GateReport, stage: str) -> StageSummary:
    """The line a version's description gives a stage."""
    return StageSummary(stage, report.outcome, report.stable.requests, report.candidate.requests,
                        tuple(gate.gate for gate in report.failed()))


IN_ROLLOUT = "in rollout"  # the decision a candidate's version states while its rollout runs


@dataclass(frozen=True, slots=True)
class VersionFacts:
    """What the model version page states about the promotion that registered it."""

    decision: str
    decided_at: str  # ISO 8601, UTC
    approver: str
    signer: str
    manifest_digest: str
    run_id: str
    experiment_id: str
    stages: tuple[StageSummary, ...]


def version_tags(facts: VersionFacts) -> dict[str, str]:
    """The version's tags: searchable in the registry and shown on its page."""
    return {"revgate.manifest_digest": facts.manifest_digest, "revgate.signer": facts.signer,
            "revgate.decision": facts.decision, "revgate.approver": facts.approver,
            "revgate.run_id": facts.run_id}


def version_description(facts: VersionFacts) -> str:
    """Markdown for the version page: decision, when, who approved, the gates per stage, the run's link."""
    link = f"#/experiments/{facts.experiment_id}/runs/{facts.run_id}"
    head = (f"**In rollout** since {facts.decided_at}: no decision yet." if facts.decision == IN_ROLLOUT else
            f"**Decision: {facts.decision}** at {facts.decided_at}, approved by **{facts.approver}**.")
    lines = [
        head,
        "",
        f"- manifest digest `{facts.manifest_digest}`, signed by `{facts.signer}`",
        f"- evidence: [run {facts.run_id}]({link}) (gate reports under `evidence/`, digests in its tags;"
        " check them with `revgate evidence`)",
        "",
        "| stage | gates | stable samples | candidate samples | failed gates |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {s.stage} | {s.outcome} | {s.stable_samples} | {s.candidate_samples} | "
              f"{', '.join(s.failed) or '-'} |" for s in facts.stages]
    if not facts.stages:
        lines.append("| - | no gate report | - | - | - |")
    return "\n".join(lines)
