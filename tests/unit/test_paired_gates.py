"""Paired shadow gates on simulated pairs: both revisions answered the same requests."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest
from scipy import optimize

from revgate.evaluation import paired
from revgate.evaluation.gates import Evidence, PairedLatencyGate, PairedQualityGate, QualityGate, gates_from_policy
from revgate.evaluation.records import Arm, RequestRecord
from revgate.manifests.gates import GatePolicy, PairedPolicy

FAMILIES = ("add", "rev", "sort")


def outcomes(rng: np.random.Generator, n: int, p_stable: float, p_candidate: float, agree: float) -> np.ndarray:
    """(n, 2) 0/1 outcomes with the given marginals and probability of the same outcome."""
    disc = 1.0 - agree
    lost, won = (disc + p_stable - p_candidate) / 2, (disc - p_stable + p_candidate) / 2
    cells = np.array([[1, 1], [1, 0], [0, 1], [0, 0]], dtype=float)
    probs = [p_stable - lost, lost, won, 1 - p_stable - won]
    return cells[rng.choice(4, size=n, p=probs)]


def shadow(
    n: int,
    quality: Mapping[str, tuple[float, float]],
    *,
    agree: float = 0.95,
    slowdown: float = 1.0,
    seed: int = 7,
    pair_noise: float = 0.2,
) -> Evidence:
    """``n`` mirrored requests round-robin over families; stable and candidate records share request ids."""
    rng = np.random.default_rng(seed)
    graded = {f: outcomes(rng, n, *quality[f], agree) for f in FAMILIES}
    stable: list[RequestRecord] = []
    candidate: list[RequestRecord] = []
    s_scores: dict[str, float] = {}
    c_scores: dict[str, float] = {}
    arms: tuple[tuple[Arm, float, list[RequestRecord]], ...] = (
        ("stable", 1.0, stable),
        ("candidate", slowdown, candidate),
    )
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        rid, arrival = f"req-{i}", i * 0.05
        own = 0.05 * float(rng.lognormal(0.0, 1.0))  # the request's own cost, shared by both revisions
        for arm, factor, records in arms:
            ttft = own * factor * float(rng.lognormal(0.0, pair_noise))
            records.append(
                RequestRecord(
                    rid,
                    f"rev-{arm}",
                    arm,
                    arrival,
                    "ok",
                    slices={"family": family},
                    first_token_s=arrival + ttft,
                    last_token_s=arrival + 3 * ttft,
                    output_tokens=8,
                )
            )
        s_scores[rid], c_scores[rid] = graded[family][i]
    return Evidence(tuple(stable), tuple(candidate), s_scores, c_scores)


def policy(slice_keys: tuple[str, ...] = ("family",), **paired_fields: object) -> GatePolicy:
    fields: dict[str, object] = {"max_pairs_per_stage": 600, "look_every": 50} | paired_fields
    return GatePolicy.build(
        slice_keys=slice_keys, min_samples_per_slice=50, max_samples_per_stage=600, look_every=50, paired=fields
    )


def settings(p: GatePolicy) -> PairedPolicy:
    assert p.paired is not None
    return p.paired


def test_the_worse_statistic_is_mcnemars_on_the_discordant_pairs() -> None:
    lost, won, n = np.array([24.0, 3.0, 0.0]), np.array([6.0, 3.0, 0.0]), np.array([600.0, 50.0, 50.0])
    z_worse, _ = paired.quality_z(lost, won, n, 0.02)
    assert z_worse == pytest.approx([18 / math.sqrt(30), 0.0, 0.0])


@pytest.mark.parametrize(("lost", "won", "n", "delta"), [(24, 6, 600, 0.02), (3, 9, 100, 0.05), (0, 0, 50, 0.02)])
def test_the_within_statistic_uses_the_restricted_maximum_likelihood_under_the_margin(
    lost: int, won: int, n: int, delta: float
) -> None:
    def negative_log_likelihood(x: float) -> float:
        rest = n - lost - won
        return -(lost * math.log(x + delta) + (won * math.log(x) if won else 0.0) + rest * math.log(1 - 2 * x - delta))

    best = optimize.minimize_scalar(negative_log_likelihood, bounds=(1e-12, (1 - delta) / 2 - 1e-9), method="bounded")
    found = paired.restricted_won(np.array([float(lost)]), np.array([float(won)]), np.array([float(n)]), delta)[0]
    assert found == pytest.approx(best.x, abs=1e-5)
    _, z_within = paired.quality_z(np.array([float(lost)]), np.array([float(won)]), np.array([float(n)]), delta)
    variance = 2 * found + delta - delta**2
    assert z_within[0] == pytest.approx((delta - (lost - won) / n) / math.sqrt(variance / n))


def test_a_three_point_drop_is_caught_paired_far_more_often_than_two_sample_on_the_same_answers() -> None:
    single = policy(slice_keys=())
    caught = {"paired": 0, "two-sample": 0}
    for seed in range(20):
        drop = shadow(600, {f: (0.90, 0.87) for f in FAMILIES}, seed=seed)  # 95 % of prompts: same outcome
        paired_result = PairedQualityGate(single, settings(single)).evaluate(drop)
        assert paired_result.slices[0].slice == "reference/all"
        caught["paired"] += paired_result.outcome == "fail"
        caught["two-sample"] += QualityGate(single).evaluate(drop).outcome == "fail"
    assert caught["paired"] >= 18 and caught["paired"] - caught["two-sample"] >= 5, caught


def test_equal_quality_passes_and_a_regressed_slice_is_named() -> None:
    p = policy(max_pairs_per_stage=2000, look_every=100)
    even = {f: (0.9, 0.9) for f in FAMILIES}
    assert PairedQualityGate(p, settings(p)).evaluate(shadow(6000, even)).outcome == "pass"
    regressed = even | {"rev": (0.9, 0.84)}
    result = PairedQualityGate(p, settings(p)).evaluate(shadow(6000, regressed, agree=0.9))
    assert result.outcome == "fail" and "reference/family=rev" in result.reason
    assert [s.outcome for s in result.slices if s.slice != "reference/family=rev"] == ["pass", "pass"]
    assert result.numbers["cells"] == "3" and result.numbers["alpha_per_cell"] == "0.016667"


def test_too_few_pairs_are_inconclusive_and_a_missing_critical_slice_fails_at_the_end() -> None:
    p = GatePolicy.build(
        slice_keys=["family"],
        min_samples_per_slice=50,
        critical_slices=["family=mul"],
        paired={"max_pairs_per_stage": 600, "look_every": 50},
    )
    small = shadow(60, {f: (0.9, 0.9) for f in FAMILIES})
    assert PairedQualityGate(p, settings(p)).evaluate(small).outcome == "inconclusive"
    ended = Evidence(small.stable, small.candidate, small.stable_scores, small.candidate_scores, final=True)
    result = PairedQualityGate(p, settings(p)).evaluate(ended)
    assert result.outcome == "fail" and "reference/family=mul" in result.reason


def test_each_grader_feeds_only_the_slices_the_policy_gives_it() -> None:
    p = policy(
        graders=[
            {"name": "json", "kind": "json-schema", "json_schema": {"type": "object"}, "slices": ["family=add"]},
            {"name": "judge", "kind": "judge-pairwise", "rubric": "better?"},
        ]
    )
    base = shadow(900, {f: (0.9, 0.9) for f in FAMILIES})
    ids = [r.request_id for r in base.stable]
    worse_json = {rid: (1.0, 0.0 if i % 2 else 1.0) for i, rid in enumerate(ids)}  # candidate invalid half the time
    ties = {rid: (0.5, 0.5) for rid in ids}
    evidence = Evidence(base.stable, base.candidate, pair_scores={"json": worse_json, "judge": ties})
    result = PairedQualityGate(p, settings(p)).evaluate(evidence)
    names = [s.slice for s in result.slices]
    assert names == ["json/family=add", "judge/family=add", "judge/family=rev", "judge/family=sort"]
    assert result.outcome == "fail" and "json/family=add" in result.reason
    assert evidence.digest() != Evidence(base.stable, base.candidate).digest()  # pair scores are evidence


def test_a_slowdown_beyond_the_margin_fails_and_scheduling_noise_within_it_passes() -> None:
    p = policy(latency_margin="0.6", latency_metrics=["ttft", "e2e"])
    even = {f: (0.9, 0.9) for f in FAMILIES}
    slow = shadow(600, even, slowdown=3.5, pair_noise=0.4)
    result = PairedLatencyGate(p, settings(p), "ttft", 0.025).evaluate(slow)
    assert result.outcome == "fail" and "more than 0.6" in result.slices[0].reason
    assert float(result.slices[0].numbers["ratio"]) == pytest.approx(3.5, rel=0.15)
    noisy = shadow(600, even, slowdown=1.2, pair_noise=0.4)
    assert PairedLatencyGate(p, settings(p), "ttft", 0.025).evaluate(noisy).outcome == "pass"


def test_latency_looks_up_to_its_own_horizon_while_quality_stops_at_the_slices_one() -> None:
    # A moderate slowdown with noisy pairs: undecided within the slices' horizon, shown beyond the margin later.
    even = {f: (0.9, 0.9) for f in FAMILIES}
    slow = shadow(480, even, slowdown=2.3, pair_noise=2.0, seed=0)
    short = policy(latency_margin="0.5", max_pairs_per_stage=80, look_every=40)
    result = PairedLatencyGate(short, settings(short), "ttft", 0.025).evaluate(slow)
    assert result.outcome == "inconclusive" and result.slices[0].numbers["look_pairs"] == "80"
    longer = policy(latency_margin="0.5", max_pairs_per_stage=80, look_every=40, latency_max_pairs_per_stage=480)
    result = PairedLatencyGate(longer, settings(longer), "ttft", 0.025).evaluate(slow)
    assert result.outcome == "fail" and int(result.slices[0].numbers["look_pairs"]) > 80
    quality = PairedQualityGate(longer, settings(longer)).evaluate(slow)
    assert {s.numbers.get("look_pairs") for s in quality.slices} <= {"80", None}


def test_failed_answers_are_not_latency_pairs() -> None:
    p = policy()
    evidence = shadow(100, {f: (0.9, 0.9) for f in FAMILIES})
    failed = tuple(RequestRecord(r.request_id, r.revision, r.arm, r.arrival_s, "error") for r in evidence.candidate)
    result = PairedLatencyGate(p, settings(p), "ttft", 0.025).evaluate(Evidence(evidence.stable, failed))
    assert result.outcome == "inconclusive" and result.numbers["slices"] == "0"


def test_the_policy_selects_paired_gates_only_for_paired_evidence() -> None:
    p = policy(latency_metrics=["ttft", "tpot"])
    names = [g.name for g in gates_from_policy(p, paired_evidence=True).gates]  # type: ignore[attr-defined]
    rates = ["errors", "caller-outcomes", "rejections"]
    assert names == ["quality-paired", *rates, "latency-paired-ttft", "latency-paired-tpot"]
    canary = [g.name for g in gates_from_policy(p).gates]  # type: ignore[attr-defined]
    assert canary == ["quality", *rates, "latency-ttft", "latency-e2e"]
    plain = GatePolicy.build(slice_keys=["family"])
    assert [g.name for g in gates_from_policy(plain, paired_evidence=True).gates] == [  # type: ignore[attr-defined]
        "quality",
        *rates,
        "latency-ttft",
        "latency-e2e",
    ]


def test_requests_outside_every_slicing_rule_are_tested_and_reported() -> None:
    p = GatePolicy.build(
        min_samples_per_slice=50,
        paired={"max_pairs_per_stage": 600, "look_every": 50},
        slicing={"rules": [{"slice": "adding", "task": "add"}]},
    )
    base = shadow(300, {f: (0.9, 0.9) for f in FAMILIES})

    def labelled(r: RequestRecord) -> RequestRecord:
        return RequestRecord(
            r.request_id,
            r.revision,
            r.arm,
            r.arrival_s,
            r.outcome,
            tenant="acme",
            slices={"task": r.slices["family"]},
            prompt_tokens=20,
        )

    evidence = Evidence(
        tuple(map(labelled, base.stable)),
        tuple(map(labelled, base.candidate)),
        base.stable_scores,
        base.candidate_scores,
    )
    result = PairedQualityGate(p, settings(p)).evaluate(evidence)
    assert [s.slice for s in result.slices] == ["reference/adding", "reference/unmatched"]
    assert result.slices[1].numbers["pairs"] == "200"
    assert result.numbers["unmatched_requests"] == "200"
    assert "task=rev" in result.numbers["unmatched_features"] and "tenant=acme" in result.numbers["unmatched_features"]
