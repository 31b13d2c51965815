"""The gates on real traffic: the reference models served by vLLM, graded against reference answers.

Reads the zoo's evaluation records (ZOO/eval/<revision>.jsonl: the balanced evaluation set as
greedy completions; ZOO/eval/<revision>.latency.jsonl: streamed requests with real TTFT and TPOT),
made once per run by the session fixtures ``zoo_dir`` and ``zoo_eval``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evaluation import metrics
from evaluation.evidence import build_evidence, read_records, reference_task_grade
from evaluation.gates import Evidence, QualityGate, gates_from_policy, judge
from evaluation.records import Arm, RequestRecord
from manifests.gates import GatePolicy, GateReport

pytestmark = pytest.mark.engine

REGRESSED = "family=sort,length=long"  # the zoo's slice-regressed revision down-weighted sort/long


def load(zoo_dir: Path, revision: str, kind: str, arm: Arm) -> tuple[RequestRecord, ...]:
    suffix = ".jsonl" if kind == "quality" else f".{kind}.jsonl"
    return tuple(replace(r, arm=arm) for r in read_records(zoo_dir / "eval" / f"{revision}{suffix}"))


def quality_evidence(zoo_dir: Path, candidate: str) -> Evidence:
    stable = load(zoo_dir, "stable", "quality", "stable")
    return build_evidence(stable, load(zoo_dir, candidate, "quality", "candidate"), reference_task_grade, final=True)


def quality_policy(evidence: Evidence, slice_keys: tuple[str, ...]) -> GatePolicy:
    """The stage plan fits the evaluation set: its per-slice size is the horizon, four looks."""
    per_slice = _per_slice(evidence, slice_keys)
    return GatePolicy.build(
        slice_keys=list(slice_keys),
        quality_margin="0.1",
        max_samples_per_stage=per_slice,
        look_every=max(1, per_slice // 4),
        min_samples_per_slice=min(30, per_slice),
        latency_metrics=[],
    )


def _per_slice(evidence: Evidence, keys: tuple[str, ...]) -> int:
    counts: dict[str, int] = {}
    for record in evidence.stable:
        name = metrics.slice_name(record, keys)
        counts[name] = counts.get(name, 0) + 1
    return min(counts.values())


def test_slice_regression_is_caught_on_its_slice_while_the_average_passes(zoo_dir: Path, zoo_eval: object) -> None:
    evidence = quality_evidence(zoo_dir, "slice-regressed")
    per_slice = quality_policy(evidence, ("family", "length"))
    result = QualityGate(per_slice).evaluate(evidence)
    outcomes = {s.slice: s.outcome for s in result.slices}
    assert result.outcome == "fail", result
    assert outcomes[REGRESSED] == "fail"
    assert [name for name, outcome in outcomes.items() if outcome == "fail"] == [REGRESSED]
    # The same test on the pooled average (one slice, the whole evaluation set) does not fail it.
    pooled = quality_policy(evidence, ())
    average = QualityGate(pooled).evaluate(evidence)
    assert average.outcome != "fail", average
    stable_mean = np.mean(list(evidence.stable_scores.values()))
    assert np.mean(list(evidence.candidate_scores.values())) >= stable_mean - float(pooled.quality_margin)


def test_improved_revision_passes_every_slice(zoo_dir: Path, zoo_eval: object) -> None:
    evidence = quality_evidence(zoo_dir, "improved")
    policy = quality_policy(evidence, ("family", "length"))
    report = judge(gates_from_policy(policy), policy, evidence)
    assert report.gates[0].outcome == "pass", report.gates[0]
    assert {s.outcome for s in report.gates[0].slices} == {"pass"}


def slo_policy(stable: tuple[RequestRecord, ...]) -> GatePolicy:
    """An SLO the stable revision meets with room: TPOT and E2E within 1.5x stable's own p90."""
    tpot = float(np.quantile(metrics.latencies_ms(stable, "tpot"), 0.9))
    e2e = float(np.quantile(metrics.latencies_ms(stable, "e2e"), 0.9))
    n = len(stable)
    return GatePolicy.build(
        slo=[{"tpot_ms": math.ceil(1.5 * tpot), "e2e_ms": math.ceil(1.5 * e2e), "attainment": "0.75"}],
        latency_metrics=["tpot"],
        latency_margin="0.25",
        max_samples_per_stage=n,
        look_every=max(1, n // 4),
        min_samples_per_slice=min(30, n),
    )


def latency_report(zoo_dir: Path, candidate: str, policy: GatePolicy | None = None) -> GateReport:
    stable = load(zoo_dir, "stable", "latency", "stable")
    policy = policy or slo_policy(stable)
    evidence = Evidence(stable, load(zoo_dir, candidate, "latency", "candidate"), final=True)
    return judge(gates_from_policy(policy), policy, evidence)


def test_slow_revision_fails_on_slo_and_latency(zoo_dir: Path, zoo_eval: object) -> None:
    report = latency_report(zoo_dir, "slow")
    by_gate = {g.gate: g for g in report.gates}
    assert by_gate["slo-*"].outcome == "fail", by_gate["slo-*"]
    assert by_gate["latency-tpot"].outcome == "fail", by_gate["latency-tpot"]
    assert report.outcome == "fail"
    # Its answers are stable's (zero-initialised extra layers): quality alone would have passed it.
    evidence = quality_evidence(zoo_dir, "slow")
    assert QualityGate(quality_policy(evidence, ("family", "length"))).evaluate(evidence).outcome != "fail"


def test_stable_meets_the_slo_it_is_measured_against(zoo_dir: Path, zoo_eval: object) -> None:
    stable = load(zoo_dir, "stable", "latency", "stable")
    evidence = Evidence(stable, tuple(replace(r, arm="candidate") for r in stable), final=True)
    policy = slo_policy(stable)
    report = judge(gates_from_policy(policy), policy, evidence)
    assert {g.gate: g.outcome for g in report.gates}["slo-*"] == "pass"
