"""Gate policy documents and the joint gates on synthetic records (the far side is simulated traffic)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from revgate.evaluation.gates import (
    AllOf,
    ErrorRateGate,
    Evidence,
    HardConstraintGate,
    LatencyGate,
    QualityGate,
    RejectionGate,
    SampleRatioGate,
    SloGate,
    attained,
    gates_from_policy,
    judge,
)
from revgate.evaluation.records import CALLER_DEADLINE, RequestRecord
from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.gates import GatePolicy, GateReport, SloTarget

SLICES = ("add", "rev", "sort")


def arm(
    name: str,
    n: int,
    quality: Mapping[str, float],
    *,
    seed: int,
    latency_s: float = 0.1,
    error_rate: float = 0.0,
    outcome_of: str = "ok",
) -> tuple[tuple[RequestRecord, ...], dict[str, float]]:
    """``n`` records round-robin over slices, arrivals 10 ms apart, lognormal latency, Bernoulli scores."""
    rng = np.random.default_rng(seed)
    records, scores = [], {}
    for i in range(n):
        family = SLICES[i % len(SLICES)]
        arrival = i * 0.01
        failed = rng.random() < error_rate
        ttft = latency_s * float(rng.lognormal(0.0, 0.3))
        record = RequestRecord(
            request_id=f"{name}-{i}",
            revision=f"rev-{name}",
            arm="stable" if name == "s" else "candidate",
            arrival_s=arrival,
            outcome="error" if failed else outcome_of,
            slices={"family": family},
            first_token_s=None if failed else arrival + ttft,
            last_token_s=None if failed else arrival + 2 * ttft,
            prompt_tokens=8,
            output_tokens=None if failed else 4,
        )
        records.append(record)
        scores[record.request_id] = float(rng.random() < quality[family])
    return tuple(records), scores


def policy(**overrides: object) -> GatePolicy:
    fields: dict[str, object] = {
        "slice_keys": ["family"],
        "max_samples_per_stage": 600,
        "look_every": 100,
        "min_samples_per_slice": 50,
    }
    return GatePolicy.build(**(fields | overrides))


def evidence(stable_q: Mapping[str, float], cand_q: Mapping[str, float], n: int = 1800, **kwargs: object) -> Evidence:
    stable, s_scores = arm("s", n, stable_q, seed=1)
    cand_kwargs = {k: v for k, v in kwargs.items() if k in {"latency_s", "error_rate", "outcome_of"}}
    candidate, c_scores = arm("c", n, cand_q, seed=2, **cand_kwargs)  # type: ignore[arg-type]
    return Evidence(stable, candidate, s_scores, c_scores, final=bool(kwargs.get("final", False)))


EVEN = {"add": 0.9, "rev": 0.9, "sort": 0.9}


# --- documents -----------------------------------------------------------------------------------


def test_policy_round_trips_through_canonical_json_with_a_stable_digest() -> None:
    p = policy(alpha="0.050", slo=[{"e2e_ms": 500, "attainment": "0.95"}])
    again = GatePolicy.from_json(p.canonical())
    assert again == p and again.digest == p.digest
    assert b'"alpha":"0.05"' in p.canonical()  # "0.050" and "0.05" are one identity


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"alpha": "1.5"}, "alpha"),
        ({"alpha": 0.05}, "alpha"),  # a float is refused: fractions are decimal strings
        ({"look_every": 5000}, "look_every"),
        ({"latency_look_every": 5000}, "latency_look_every"),
        ({"latency_max_samples_per_stage": 50}, "latency_look_every"),
        ({"latency_margin": "0.2", "latency_fail_above": "0.3"}, "latency_fail_above"),
        ({"slo": [{"attainment": "0.9"}]}, "at least one"),
        ({"slo": [{"e2e_ms": 10, "attainment": "0.9", "request_class": "long"}]}, "request_class"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_policy_is_refused_with_the_field_named(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ManifestInvalid, match=named):
        GatePolicy.build(**fields)


def test_report_round_trips_and_refuses_a_bad_digest() -> None:
    p = policy()
    report = judge(gates_from_policy(p), p, evidence(EVEN, EVEN))
    assert GateReport.from_json(report.canonical()) == report
    with pytest.raises(ManifestInvalid, match="evidence_digest"):
        GateReport.build(**(report.model_dump(mode="json") | {"evidence_digest": "sha256:abc"}))


# --- quality -----------------------------------------------------------------------------------


def test_quality_catches_one_regressed_slice_that_the_average_hides() -> None:
    candidate = {"add": 0.98, "rev": 0.7, "sort": 0.98}  # average 0.887 vs 0.9: within a 2-point margin
    ev = evidence(EVEN, candidate)
    assert np.mean(list(ev.candidate_scores.values())) > np.mean(list(ev.stable_scores.values())) - 0.03
    result = QualityGate(policy()).evaluate(ev)
    assert result.outcome == "fail"
    by_slice = {s.slice: s.outcome for s in result.slices}
    assert by_slice["family=rev"] == "fail"
    assert by_slice["family=add"] == "pass"


def test_quality_passes_an_improved_candidate() -> None:
    result = QualityGate(policy(quality_margin="0.05")).evaluate(
        evidence(EVEN, {"add": 0.97, "rev": 0.95, "sort": 0.96})
    )
    assert result.outcome == "pass", result


def test_small_slices_are_inconclusive_never_pass() -> None:
    result = QualityGate(policy(min_samples_per_slice=300)).evaluate(
        evidence(EVEN, {"add": 1.0, "rev": 1.0, "sort": 1.0}, n=600)
    )
    assert {s.outcome for s in result.slices} == {"inconclusive"}
    assert result.outcome == "inconclusive"


def test_missing_critical_slice_fails_at_the_end_of_the_stage_only() -> None:
    p = policy(critical_slices=["family=mul"], quality_margin="0.05")
    better = {"add": 0.97, "rev": 0.97, "sort": 0.97}
    assert QualityGate(p).evaluate(evidence(EVEN, better)).outcome == "inconclusive"
    final = QualityGate(p).evaluate(evidence(EVEN, better, final=True))
    assert final.outcome == "fail" and "family=mul" in final.reason


def test_looking_more_often_does_not_change_a_decision() -> None:
    # The decision depends only on the planned looks: evaluating every prefix agrees with the full run
    # wherever the prefix already contains the deciding look.
    ev = evidence(EVEN, {"add": 0.9, "rev": 0.75, "sort": 0.9})
    gate = QualityGate(policy())
    full = {s.slice: s for s in gate.evaluate(ev).slices}["family=rev"]
    assert full.outcome == "fail"
    decided_at = int(full.numbers["look_samples"])
    for cut in range(3 * decided_at, len(ev.candidate) + 1, 150):
        partial = Evidence(ev.stable[:cut], ev.candidate[:cut], ev.stable_scores, ev.candidate_scores)
        assert {s.slice: s for s in gate.evaluate(partial).slices}["family=rev"].numbers["look_samples"] == str(
            decided_at
        )


# --- errors, latency, SLO, split, hard constraints ---------------------------------------------------


def test_error_rate_increase_fails_and_equal_rates_pass() -> None:
    assert ErrorRateGate(policy()).evaluate(evidence(EVEN, EVEN, error_rate=0.08)).outcome == "fail"
    assert ErrorRateGate(policy()).evaluate(evidence(EVEN, EVEN)).outcome == "pass"


def callers(records: tuple[RequestRecord, ...], every: int, how: str) -> tuple[RequestRecord, ...]:
    """Every ``every``-th record made the caller's: a 400 answer, a 1 ms deadline of its own, or a 429."""
    made = {"4xx": {"outcome": "error", "status_code": 400, "error": "context length exceeded"},
            "deadline": {"outcome": "timeout", "error": CALLER_DEADLINE},
            "429": {"outcome": "rejected", "status_code": 429}}[how]
    return tuple(replace(r, **made, first_token_s=None, last_token_s=None) if i % every == 0 else r  # type: ignore[arg-type]
                 for i, r in enumerate(records))


@pytest.mark.parametrize("how", ["4xx", "deadline"])
def test_a_callers_own_failures_are_never_the_revisions(how: str) -> None:
    # The defect: one tenant's malformed requests or 1 ms deadlines, all landing on the canary (it picks
    # its arm by its session id), failed the error and SLO gates of a revision as good as stable.
    ev = evidence(EVEN, EVEN)
    hostile = Evidence(ev.stable, callers(ev.candidate, 10, how), ev.stable_scores, ev.candidate_scores)
    p = policy(slo=[{"e2e_ms": 1000, "attainment": "0.95"}])
    report = {g.name: g for g in gates_from_policy(p).gates}  # type: ignore[attr-defined]
    assert report["errors"].evaluate(hostile).outcome == "pass"
    slo = report["slo-*"].evaluate(hostile)
    assert slo.outcome == "pass" and int(slo.numbers["not_counted_callers"]) == len(ev.candidate) // 10
    # Spent on one arm only, the callers' outcomes are named for what they are, in their own gate.
    assert report["caller-outcomes"].evaluate(hostile).outcome == "fail"
    # Spread over both arms, as traffic the router splits is, they agree: nothing fails.
    spread = Evidence(callers(ev.stable, 10, how), callers(ev.candidate, 10, how), ev.stable_scores,
                      ev.candidate_scores)
    assert all(report[name].evaluate(spread).outcome == "pass" for name in ("errors", "caller-outcomes", "slo-*"))


def test_a_candidate_that_sheds_load_fails_the_rejection_gate() -> None:
    ev = evidence(EVEN, EVEN)
    shedding = Evidence(ev.stable, callers(ev.candidate, 10, "429"), ev.stable_scores, ev.candidate_scores)
    assert RejectionGate(policy()).evaluate(shedding).outcome == "fail"
    assert RejectionGate(policy()).evaluate(ev).outcome == "pass"
    assert ErrorRateGate(policy()).evaluate(shedding).outcome == "pass"  # refusals are not errors...
    assert gates_from_policy(policy()).evaluate(shedding).outcome == "fail"  # ...but the joint gate fails


def test_latency_regression_on_log_latency() -> None:
    slow = LatencyGate(policy(), "ttft", 0.025).evaluate(evidence(EVEN, EVEN, latency_s=0.13))
    assert slow.outcome == "fail" and float(slow.numbers["ratio"]) > 1.2
    assert LatencyGate(policy(), "e2e", 0.025).evaluate(evidence(EVEN, EVEN)).outcome == "pass"


def test_a_slowdown_below_latency_fail_above_is_not_failed() -> None:
    # 1.15x slower on every request: shown slower, so the default (a 10% margin) fails it; with 1.25x
    # accepted as noise it does not fail, and within a 1.5x margin it passes. 2x still fails, saying why.
    slower = evidence(EVEN, EVEN, latency_s=0.115)
    failed = LatencyGate(policy(), "ttft", 0.025).evaluate(slower)
    assert failed.outcome == "fail" and failed.reason.startswith("worse than stable"), failed
    noisy = policy(latency_margin="0.5", latency_fail_above="0.25")
    assert LatencyGate(noisy, "ttft", 0.025).evaluate(slower).outcome == "pass"
    slow = LatencyGate(noisy, "ttft", 0.025).evaluate(evidence(EVEN, EVEN, latency_s=0.2))
    assert slow.outcome == "fail" and "more than 0.25" in slow.reason and float(slow.numbers["ratio"]) > 1.8


def test_latency_gates_follow_their_own_look_plan() -> None:
    # 200 samples per arm of a clearly slower candidate: the policy's own looks (every 100) fail it,
    # a latency plan whose first look is at 300 has not looked yet, and decides once it has.
    early = evidence(EVEN, EVEN, n=200, latency_s=0.2)
    assert LatencyGate(policy(), "ttft", 0.025).evaluate(early).outcome == "fail"
    later = policy(latency_look_every=300, latency_max_samples_per_stage=900)
    assert (later.latency_horizon, later.latency_look_interval) == (900, 300)
    waiting = LatencyGate(later, "ttft", 0.025).evaluate(early)
    assert waiting.outcome == "inconclusive" and "look_samples" not in waiting.numbers
    decided = LatencyGate(later, "ttft", 0.025).evaluate(evidence(EVEN, EVEN, n=400, latency_s=0.2))
    assert decided.outcome == "fail" and decided.numbers["look_samples"] == "300"
    assert policy().latency_horizon == 600 and b"latency_look_every" not in policy().canonical()  # digest kept


def test_slo_attainment_pass_fail_and_rejections_reported_apart() -> None:
    target = SloTarget.build(ttft_ms=200, attainment="0.9")
    assert SloGate(policy(), target, 0.05).evaluate(evidence(EVEN, EVEN)).outcome == "pass"
    slow = SloGate(policy(), target, 0.05).evaluate(evidence(EVEN, EVEN, latency_s=0.2))
    assert slow.outcome == "fail"
    rejected = SloGate(policy(), target, 0.05).evaluate(evidence(EVEN, EVEN, outcome_of="rejected"))
    assert rejected.numbers["admitted"] == "0" and rejected.numbers["rejected"] == "1800"
    assert rejected.outcome == "inconclusive"


def test_errors_never_attain_an_slo_and_one_token_answers_have_no_tpot() -> None:
    target = SloTarget.build(tpot_ms=5, e2e_ms=1000, attainment="0.9")
    one_token = RequestRecord("r", "x", "candidate", 0.0, "ok", first_token_s=0.1, last_token_s=0.1, output_tokens=1)
    failed = RequestRecord("e", "x", "candidate", 0.0, "error")
    assert attained(one_token, target) and not attained(failed, target)


def test_sample_ratio_mismatch_fails_a_skewed_split() -> None:
    ev = evidence(EVEN, EVEN, n=900)
    assert SampleRatioGate(policy(), 0.5).evaluate(ev).outcome == "pass"
    assert SampleRatioGate(policy(), 0.1).evaluate(ev).outcome == "fail"


def test_hard_constraint_with_unknown_evidence_fails() -> None:
    p = policy(
        hard_constraints=[{"metric": "ttft_p99_ms", "maximum": "1000"}, {"metric": "error_rate", "maximum": "0"}]
    )
    assert HardConstraintGate(p).evaluate(evidence(EVEN, EVEN)).outcome == "pass"
    empty = Evidence((), ())
    result = HardConstraintGate(p).evaluate(empty)
    assert result.outcome == "fail" and "unknown" in result.reason


# --- joint report -------------------------------------------------------------------------------


def test_joint_report_fails_on_any_gate_and_binds_the_evidence() -> None:
    p = policy(slo=[{"ttft_ms": 200, "attainment": "0.9"}], quality_margin="0.05")
    gate = gates_from_policy(p)
    good = evidence(EVEN, EVEN)
    slow = evidence(EVEN, EVEN, latency_s=0.2)
    assert judge(gate, p, good).outcome == "pass"
    report = judge(gate, p, slow)
    assert report.outcome == "fail" and {g.gate for g in report.failed()} >= {"slo-*", "latency-ttft"}
    assert report.evidence_digest != judge(gate, p, good).evidence_digest
    assert report.candidate.requests == 1800 and report.candidate.output_tokens == 1800 * 4


def test_inconclusive_at_the_end_follows_the_policy() -> None:
    p = policy(min_samples_per_slice=500, on_inconclusive="fail")
    ev = evidence(EVEN, EVEN, n=600, final=True)
    assert judge(gates_from_policy(p), p, ev).outcome == "fail"
    ev_open = evidence(EVEN, EVEN, n=600)
    assert judge(gates_from_policy(p), p, ev_open).outcome == "inconclusive"


def test_all_of_needs_every_member() -> None:
    ev = evidence(EVEN, EVEN, error_rate=0.08)
    combined = AllOf((QualityGate(policy(quality_margin="0.1")), ErrorRateGate(policy()))).evaluate(ev)
    assert combined.outcome == "fail" and combined.numbers["errors"] == "fail"


def test_a_relative_margin_judges_a_99_percent_slice_by_its_own_error_rate() -> None:
    # the candidate makes 3x stable's wrong answers on a 99% slice: within 8 points, not within half its errors
    stable_q, candidate_q = {"add": 0.99, "rev": 0.24, "sort": 0.9}, {"add": 0.97, "rev": 0.24, "sort": 0.9}
    absolute = QualityGate(policy(quality_margin="0.08")).evaluate(evidence(stable_q, candidate_q))
    relative = QualityGate(policy(quality_margin="0.08", quality_margin_relative="0.5")).evaluate(
        evidence(stable_q, candidate_q))
    outcome = {s.slice: s.outcome for s in absolute.slices}
    assert outcome["family=add"] == "pass"
    by_slice = {s.slice: s for s in relative.slices}
    assert by_slice["family=add"].outcome != "pass"
    assert float(by_slice["family=add"].numbers["margin"]) < 0.01  # half of stable's 1% wrong answers
    assert by_slice["family=rev"].numbers["margin"] == "0.0800"  # half of 76% is beyond the 8-point ceiling
    assert abs(float(by_slice["family=sort"].numbers["margin"]) - 0.05) < 0.01


def test_a_relative_margin_floor_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ManifestInvalid, match="quality_margin_min"):
        policy(quality_margin="0.02", quality_margin_relative="0.5", quality_margin_min="0.05")
