"""Paired sequential comparisons: both revisions' outcomes on the same request.

In the shadow stage each mirrored request is answered by stable and by the candidate, so the
comparison is within pairs. For quality, d = stable score - candidate score: requests both
revisions get right (or both get wrong) give d = 0, and only discordant pairs carry evidence.
With b pairs the candidate lost and c it won among n, the difference of means is (b - c) / n.

- Worse (the gate fails): McNemar's statistic z = (b - c) / sqrt(b + c). Under equal quality
  b is Binomial(b + c, 1/2) given the discordant count, so z is a score test of "no difference".
- Within the margin (the slice passes): Tango's score test of "worse by exactly the margin",
  z = (margin - (b - c) / n) / sqrt(v / n), where v is the variance of d at the restricted
  maximum-likelihood estimate under that null. A Wald interval, whose variance moves with the
  estimate, passes a candidate that is exactly at the margin too often when discordant pairs are
  few (measured in bench/gates.py); the restricted variance does not.

Graded scores in [0, 1] and a pairwise judge's preference (d = +1, -1, or 0 for a tie) use the
same counts with b and c summed from the positive and negative parts of d; for fractional d
this overstates the variance, which only makes both tests more cautious.

For latency, d = log(candidate) - log(stable) on the same request: the request's own length and
the load it met cancel, which is what lets a small margin hold. The mean and its standard error
are tested against the tolerance log(1 + margin).

Looks are planned by pair count per slice and use the alpha-spending boundary of
:mod:`evaluation.sequential`. Pure functions over numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from revgate.evaluation import sequential

FloatArray = NDArray[np.float64]


def restricted_won(lost: FloatArray, won: FloatArray, n: FloatArray, delta: float) -> FloatArray:
    """MLE of P(candidate won) under P(lost) - P(won) = ``delta`` (Tango 1998), vectorised.

    The positive root of 2n x^2 - [b(1 - delta) + c(1 - 3 delta) - 2 m delta] x - c delta (1 - delta) = 0,
    m = n - b - c: the stationary point of the trinomial likelihood on the null line.
    """
    rest = n - lost - won
    linear = lost * (1.0 - delta) + won * (1.0 - 3.0 * delta) - 2.0 * rest * delta
    root: FloatArray = (linear + np.sqrt(linear**2 + 8.0 * n * won * delta * (1.0 - delta))) / (4.0 * n)
    return root


def score_z(lost: FloatArray, won: FloatArray, n: FloatArray, delta: float) -> FloatArray:
    """((b - c) / n - delta) / sqrt(v0 / n) with the restricted variance v0 (0 where v0 is 0)."""
    variance = 2.0 * restricted_won(lost, won, n, delta) + delta - delta**2
    estimate = (lost - won) / n
    safe = np.where(variance > 0, variance, 1.0)
    z: FloatArray = np.where(variance > 0, (estimate - delta) / np.sqrt(safe / n), 0.0)
    return z


def quality_z(lost: FloatArray, won: FloatArray, n: FloatArray, margin: float) -> tuple[FloatArray, FloatArray]:
    """(z for "worse", z for "within the margin"): large values are evidence for each, vectorised."""
    return score_z(lost, won, n, 0.0), -score_z(lost, won, n, margin)


def score_verdicts(
    z_worse: FloatArray, z_within: FloatArray, bounds: FloatArray
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The stopping rule over looks on the last axis: (verdict code, index of the deciding look or -1).

    The first look where ``z_worse`` reaches its boundary decides WORSE; the first where
    ``z_within`` does decides WITHIN; a look that shows both counts as WORSE.
    """
    usable = np.isfinite(bounds)
    worse = usable & (z_worse >= bounds)
    within = usable & (z_within >= bounds) & ~worse
    decided = worse | within
    first = np.where(decided.any(axis=-1), decided.argmax(axis=-1), -1)
    at_first = np.take_along_axis(worse, np.maximum(first, 0)[..., None], axis=-1)[..., 0]
    code = np.where(first < 0, sequential.OPEN, np.where(at_first, sequential.WORSE, sequential.WITHIN))
    return code.astype(np.int64), first.astype(np.int64)


def latency_gap(total: FloatArray, total_sq: FloatArray, n: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Mean of d = log(candidate / stable) and its standard error (infinite below two pairs)."""
    safe = np.maximum(n, 2.0)
    estimate = total / np.maximum(n, 1.0)
    variance = np.maximum((total_sq - safe * estimate**2) / (safe - 1.0), 0.0)
    se = np.where(n >= 2, np.sqrt(variance / safe), np.inf)
    return estimate, se


@dataclass(frozen=True, slots=True)
class LookPlan:
    """The planned looks of one slice: after every ``look_every`` pairs up to ``horizon``, at ``alpha``."""

    alpha: float
    horizon: int
    look_every: int

    def sizes(self) -> tuple[int, ...]:
        """Pair counts at which the looks happen."""
        return sequential.look_sizes(self.horizon, self.look_every)

    def bounds(self) -> tuple[float, ...]:
        """One-sided z boundaries of the looks (Lan-DeMets, O'Brien-Fleming type)."""
        return sequential.spending_boundary(self.alpha, sequential.look_fractions(self.horizon, self.look_every))


@dataclass(frozen=True, slots=True)
class QualityLook:
    """One planned look at a quality cell: pairs, the estimate (b - c) / n, both z statistics, the boundary."""

    pairs: int
    lost: float
    won: float
    z_worse: float
    z_within: float
    boundary: float

    @property
    def estimate(self) -> float:
        """How much worse the candidate is on these pairs (positive = worse)."""
        return (self.lost - self.won) / self.pairs


@dataclass(frozen=True, slots=True)
class QualityDecision:
    """Where a paired quality cell stands: 'worse', 'within' or 'open', with the looks made."""

    verdict: str
    decided_at: int | None
    looks: tuple[QualityLook, ...]

    def deciding(self) -> QualityLook | None:
        """The look that decided, else the last one (None before the first look)."""
        return next((lk for lk in self.looks if lk.pairs == self.decided_at), self.looks[-1] if self.looks else None)


def _planned(count: int, plan: LookPlan) -> NDArray[np.int64]:
    return np.array([s for s in plan.sizes() if s <= count], dtype=np.int64)


def quality_decision(differences: FloatArray, plan: LookPlan, margin: float) -> QualityDecision:
    """The paired quality test over ``differences`` (stable - candidate) in arrival order."""
    sizes = _planned(differences.size, plan)
    if sizes.size == 0:
        return QualityDecision("open", None, ())
    lost = np.cumsum(np.maximum(differences, 0.0))[sizes - 1]
    won = np.cumsum(np.maximum(-differences, 0.0))[sizes - 1]
    z_worse, z_within = quality_z(lost, won, sizes.astype(float), margin)
    bounds = np.array(plan.bounds()[: sizes.size])
    code, first = score_verdicts(z_worse, z_within, bounds)
    looks = tuple(
        QualityLook(int(n), float(b), float(c), float(zw), float(zi), float(bd))
        for n, b, c, zw, zi, bd in zip(sizes, lost, won, z_worse, z_within, bounds, strict=True)
    )
    verdict = sequential.VERDICTS[int(code)]
    return QualityDecision(verdict, None if verdict == "open" else looks[int(first)].pairs, looks)


def latency_looks(differences: FloatArray, plan: LookPlan) -> tuple[sequential.SequentialLook, ...]:
    """The looks made so far over log latency ratios in arrival order (pairs past the horizon are ignored)."""
    sizes = _planned(differences.size, plan)
    if sizes.size == 0:
        return ()
    total, total_sq = np.cumsum(differences), np.cumsum(differences * differences)
    estimate, se = latency_gap(total[sizes - 1], total_sq[sizes - 1], sizes.astype(float))
    bounds = plan.bounds()
    return tuple(
        sequential.SequentialLook(int(n), float(e), float(s), bounds[index])
        for index, (n, e, s) in enumerate(zip(sizes, estimate, se, strict=True))
    )


def decide_tolerance(looks: tuple[sequential.SequentialLook, ...], tolerance: float) -> sequential.SequentialDecision:
    """Worse when a repeated interval lies above ``tolerance``; within when it lies below it.

    A latency shift inside the tolerance is noise the policy accepts, so only a shift shown beyond
    it fails (a shift of exactly the tolerance decides neither way, by design of both tests).
    """
    return sequential.decide_between(looks, tolerance, tolerance)


def log_ratio(stable_s: float | None, candidate_s: float | None) -> float | None:
    """log(candidate / stable) of one request's latency; None unless both are positive."""
    if stable_s is None or candidate_s is None or stable_s <= 0 or candidate_s <= 0:
        return None
    return math.log(candidate_s / stable_s)
