"""The sequential statistics: boundaries, stopping rule, confidence sequences, calibration by simulation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from revgate.evaluation import sequential


def test_boundary_matches_published_obrien_fleming_spending_values() -> None:
    # Lan-DeMets O'Brien-Fleming type, 5 equally spaced looks, one-sided 0.025 (Jennison & Turnbull).
    bounds = sequential.spending_boundary(0.025, sequential.look_fractions(5, 1))
    assert bounds == pytest.approx((4.877, 3.357, 2.680, 2.290, 2.031), abs=2e-3)


def test_one_look_is_the_fixed_horizon_test() -> None:
    assert sequential.spending_boundary(0.05, (1.0,)) == pytest.approx((1.6449,), abs=1e-3)


def test_boundaries_fall_towards_the_horizon_and_early_looks_spend_almost_nothing() -> None:
    bounds = sequential.spending_boundary(0.05 / 12, sequential.look_fractions(2000, 100))
    finite = [b for b in bounds if math.isfinite(b)]
    assert all(a > b for a, b in itertools.pairwise(finite))
    assert bounds[0] > 8 and bounds[-1] < 2.9


def test_look_schedule_ends_at_the_maximum() -> None:
    assert sequential.look_sizes(250, 100) == (100, 200, 250)
    assert sequential.look_fractions(250, 100)[-1] == 1.0


def test_stopping_rule_takes_the_first_decided_look_and_prefers_worse() -> None:
    bounds = np.array([3.0, 2.0, 2.0])
    se = np.array([0.1, 0.01, 0.01])
    code, first = sequential.verdicts(np.array([0.05, 0.03, -0.5]), se, bounds, margin=0.05)
    assert (int(code), int(first)) == (sequential.WORSE, 1)
    code, first = sequential.verdicts(np.array([0.0, 0.0, 0.5]), se, bounds, margin=0.05)
    assert (int(code), int(first)) == (sequential.WITHIN, 1)
    code, first = sequential.verdicts(np.array([0.0]), np.array([0.1]), np.array([3.0]), margin=0.05)
    assert (int(code), int(first)) == (sequential.OPEN, -1)


def test_infinite_boundary_never_decides() -> None:
    code, _ = sequential.verdicts(np.array([9.0]), np.array([0.01]), np.array([math.inf]), margin=0.0)
    assert int(code) == sequential.OPEN


def test_confidence_sequence_bounds_agree_with_the_mixture_test() -> None:
    lower, upper = sequential.bernoulli_confidence_sequence(80, 100, 0.05)
    assert sequential.mixture_rejects(80, 100, lower - 0.01, 0.05)
    assert not sequential.mixture_rejects(80, 100, lower + 0.01, 0.05)
    assert sequential.mixture_rejects(80, 100, upper + 0.01, 0.05)


def test_confidence_sequence_covers_the_estimate_and_narrows() -> None:
    small = sequential.bernoulli_confidence_sequence(90, 100, 0.05)
    large = sequential.bernoulli_confidence_sequence(9000, 10000, 0.05)
    assert small[0] < 0.9 < small[1] and large[0] < 0.9 < large[1]
    assert large[1] - large[0] < (small[1] - small[0]) / 5
    assert sequential.bernoulli_confidence_sequence(0, 0, 0.05) == (0.0, 1.0)


def test_confidence_sequence_is_anytime_valid_in_simulation() -> None:
    # Checked after every sample up to 500: the truth leaves the sequence in at most ~alpha of runs.
    rng = np.random.default_rng(7)
    p, alpha, runs, horizon = 0.8, 0.1, 200, 500
    missed = 0
    for _ in range(runs):
        hits = np.cumsum(rng.random(horizon) < p)
        # p lies outside the sequence exactly when the mixture martingale at p exceeds 1/alpha.
        if any(sequential.mixture_rejects(int(hits[n - 1]), n, p, alpha) for n in range(5, horizon + 1, 5)):
            missed += 1
    assert missed / runs <= alpha


def _simulate(p_stable: float, p_candidate: float, runs: int, alpha: float, seed: int) -> float:
    """Share of runs in which the stopping rule declared the candidate worse (looks every 100 up to 1000)."""
    rng = np.random.default_rng(seed)
    n = np.arange(100, 1001, 100, dtype=float)
    s = np.cumsum(rng.binomial(100, p_stable, size=(runs, 10)), axis=1)
    c = np.cumsum(rng.binomial(100, p_candidate, size=(runs, 10)), axis=1)
    m_s, m_c = (s + 1) / (n + 2), (c + 1) / (n + 2)
    se = np.sqrt(m_s * (1 - m_s) / (n + 2) + m_c * (1 - m_c) / (n + 2))
    bounds = np.array(sequential.spending_boundary(alpha, sequential.look_fractions(1000, 100)))
    code, _ = sequential.verdicts(m_s - m_c, se, bounds, margin=0.02)
    return float((code == sequential.WORSE).mean())


def test_type_one_error_is_controlled_under_looks_after_every_batch() -> None:
    assert _simulate(0.9, 0.9, runs=4000, alpha=0.05, seed=1) <= 0.06


def test_power_is_present_for_a_real_drop() -> None:
    # 0.90 -> 0.84 with 1,000 per arm: a fixed test has ~95 % power; the sequential one must stay close.
    assert _simulate(0.9, 0.84, runs=2000, alpha=0.05, seed=2) >= 0.85


def test_mixture_test_rejects_a_skewed_split_but_not_a_fair_one() -> None:
    assert not sequential.mixture_rejects(5000, 10000, 0.5, 0.001)
    assert sequential.mixture_rejects(5300, 10000, 0.5, 0.001)


def test_quantile_from_merged_samples_ignores_missing() -> None:
    assert sequential.quantile([1.0, 2.0, 3.0, math.nan], 0.5) == 2.0
    assert sequential.quantile([], 0.5) is None
