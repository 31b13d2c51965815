"""The power check and the futility rule: their figures against stages simulated through the gates' own code.

The power check predicts, from a normal approximation, how often a gate passes an equal revision.
These tests run many stages through ``evaluation.gates.sequential_compare`` (the function every
two-sample gate decides with) on simulated samples and compare: the prediction must hold within a
point or two (each figure's own simulation error is about 0.4 points at these sizes).
"""

from __future__ import annotations

import math

import numpy as np

from revgate.evaluation import power
from revgate.evaluation.gates import ArmSeries, mean_gap, proportion_gap, sequential_compare
from revgate.flows.demo import demo_policy
from revgate.manifests.gates import GatePolicy

STAGES = 4000


def policy(**changes: object) -> GatePolicy:
    base: dict[str, object] = {"slice_keys": ["family"], "min_samples_per_slice": 10}
    return GatePolicy.build(**(base | changes))


def through_the_gate(rng: np.random.Generator, draw: object, n: int, estimator: object, *, policy_: GatePolicy,
                     margin: float, alpha: float, harm: float = 0.0) -> dict[str, float]:
    """Outcome rates of ``STAGES`` stages of ``n`` samples per arm judged by ``sequential_compare``."""
    counts = {"within": 0, "worse": 0, "futile": 0, "open": 0}
    arrivals = np.arange(n, dtype=float)
    for _ in range(STAGES):
        candidate = ArmSeries(arrivals, draw(rng, n))  # type: ignore[operator]
        stable = ArmSeries(arrivals, draw(rng, n))  # type: ignore[operator]
        decision = sequential_compare(candidate, stable, estimator, alpha=alpha, policy=policy_,  # type: ignore[arg-type]
                                      margin=margin, harm=harm)
        counts[decision.verdict] += 1
    return {k: v / STAGES for k, v in counts.items()}


def test_predicted_latency_pass_rate_matches_stages_judged_by_the_gate() -> None:
    # log latency with sd 0.5 in both arms, equal means: the latency gate's plan at 240 per arm
    gate_policy = policy(max_samples_per_stage=240, look_every=60)
    margin, sd = math.log(1.1), 0.5
    comparison = power.Comparison(math.sqrt(2) * sd, 240, 60, 0.05, margin)
    predicted = power.characteristics(comparison, 240)
    rng = np.random.default_rng(3)
    seen = through_the_gate(rng, lambda r, n: r.normal(0.0, sd, n), 240, mean_gap, policy_=gate_policy,
                            margin=margin, alpha=0.05)
    assert 0.3 < predicted.passed < 0.9  # a plan where the figure is informative
    assert abs(predicted.passed - seen["within"]) < 0.015, (predicted, seen)
    assert abs(predicted.failed - seen["worse"]) < 0.01, (predicted, seen)


def test_predicted_quality_pass_rate_matches_bernoulli_stages_for_a_hard_slice() -> None:
    # the demo's hardest slice: stable right 23% of the time, an 8-point margin, 6 slices sharing alpha
    rate, alpha, margin = 0.233, 0.05 / 6, 0.08
    gate_policy = policy(max_samples_per_stage=800, look_every=200)
    comparison = power.Comparison(math.sqrt(2 * rate * (1 - rate)), 800, 200, alpha, margin)
    predicted = power.characteristics(comparison, 800)
    rng = np.random.default_rng(5)
    seen = through_the_gate(rng, lambda r, n: (r.random(n) < rate).astype(float), 800,
                            lambda w, b: proportion_gap(b, w), policy_=gate_policy, margin=margin, alpha=alpha)
    assert abs(predicted.passed - seen["within"]) < 0.02, (predicted, seen)


def test_the_sufficient_horizon_passes_an_equal_revision_at_the_target() -> None:
    rate, alpha, margin = 0.233, 0.05 / 6, 0.08
    comparison = power.Comparison(math.sqrt(2 * rate * (1 - rate)), 160, 40, alpha, margin)
    needed = power.sufficient_horizon(comparison, 0.9)
    assert needed is not None and 600 < needed < 1000  # far beyond the 160 the old demo planned
    at_needed = power.characteristics(comparison.at_horizon(needed), needed).passed
    assert 0.89 <= at_needed < 0.93
    assert power.characteristics(comparison, 160).passed < 0.3  # why the old demo's canary was inconclusive


def test_futility_stops_a_revision_that_cannot_pass_early_and_keeps_equal_ones_passing() -> None:
    # latency with a tolerated slowdown (fail above 1.15x, pass within 1.3x), noisy (sd 1.0 in log seconds)
    gate_policy = policy(max_samples_per_stage=400, look_every=50, futility_below="0.05")
    margin, harm, sd = math.log(1.3), math.log(1.15), 1.0
    comparison = power.Comparison(math.sqrt(2) * sd, 400, 50, 0.05, margin, harm, futility_below=0.05)
    rng = np.random.default_rng(9)
    seen = through_the_gate(rng, lambda r, n: r.normal(0.0, sd, n), 400, mean_gap, policy_=gate_policy,
                            margin=margin, alpha=0.05, harm=harm)
    equal = power.characteristics(comparison, 400)
    assert abs(equal.futile - seen["futile"]) < 0.01, (equal, seen)
    assert abs(equal.passed - seen["within"]) < 0.015, (equal, seen)
    assert seen["worse"] < 0.01  # an equal revision is not failed
    # 1.3x slower, exactly at the margin: it cannot pass; without futility half of such stages run to the horizon
    at_margin = power.characteristics(comparison, 400, shift=margin)
    assert at_margin.futile > 0.5 and at_margin.passed < 0.06 and at_margin.undecided < 0.15, at_margin
    without = power.Comparison(math.sqrt(2) * sd, 400, 50, 0.05, margin, harm)
    assert power.characteristics(without, 400, shift=margin).undecided > 0.3
    assert equal.passed >= power.characteristics(without, 400).passed - 0.01  # the price for an equal revision


def test_a_short_stage_is_reported_below_target_with_the_samples_it_needs() -> None:
    # the old demo's canary: per-slice two-sample quality, 2,400 probes at 50% over 6 slices
    old = GatePolicy.build(slice_keys=["family", "length"], quality_margin="0.08", max_samples_per_stage=160,
                           look_every=40, latency_metrics=[])
    shares = {f"family={f},length={n}": 1 / 6 for f in ("add", "rev", "sort") for n in ("short", "long")}
    zoo = {"add,length=long": 0.233, "add,length=short": 1.0, "rev,length=long": 0.9, "rev,length=short": 1.0,
           "sort,length=long": 0.943, "sort,length=short": 0.997}
    profile = power.StableProfile({f"family={k}": (v, 200) for k, v in zoo.items()}, {}, "measured in step01")
    check = power.stage_power(old, power.StageShape(1200, shares, 30.0), profile, 0.9)
    assert not check.ok
    weakest = check.weakest
    assert weakest is not None and weakest.cell == "family=add,length=long"
    assert weakest.needed is not None and weakest.needed > weakest.horizon
    assert power.samples_to_reach(check, power.StageShape(1200, shares, 30.0), 10_000) is None  # horizon too short
    assert "family=add,length=long" in check.line() and "about 80 s" in check.line()


def test_the_demo_canary_is_powered_for_an_equal_revision() -> None:
    profile = power.StableProfile({}, {"ttft": 0.6, "e2e": 0.5}, "measured in step01")
    check = power.stage_power(demo_policy(), power.StageShape(1200, {}, 30.0), profile, 0.9)
    assert check.ok, check.line()
    assert {c.gate for c in check.cells} == {"latency-ttft", "latency-e2e"}


def test_a_stage_too_short_for_its_horizon_is_extended_to_reach_it_and_no_further() -> None:
    # latency looks up to 480 per arm; a stage that gives 150 per arm ends before the gate can pass
    gate = GatePolicy.build(latency_metrics=["e2e"], latency_margin="0.2", latency_max_samples_per_stage=480,
                            latency_look_every=120, two_sample_quality=False)
    profile = power.StableProfile({}, {"e2e": 0.5}, "measured in step01")
    short = power.StageShape(150, {}, 20.0)
    check = power.stage_power(gate, short, profile, 0.9)
    assert not check.ok and check.cells[0].samples == 150
    assert power.samples_to_reach(check, short, 1000) == 480
    assert power.samples_to_reach(check, short, 400) is None  # beyond the step's extend_to: refused
    assert power.stage_power(gate, power.StageShape(480, {}, 20.0), profile, 0.9).ok
