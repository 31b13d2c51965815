"""Paired sequential comparisons: both revisions' outcomes on the same request.

In the shadow stage each mirrored request is answered by stable and by the candidate, so the
comparison is within pairs. For quality, d = stable score - candidate score: requests both
revisions get right (or both get wrong) give d = 0 and only discordant pairs move the estimate.
For 0/1 scores this is McNemar's comparison: among the n_disc discordant pairs the number the
candidate lost, b, is Binomial(n_disc, q), and equal quality means q = 1/2; the estimate is
(b - c) / n with standard error sqrt(b + c - (b - c)^2 / n) / n, adjusted as Agresti and Min do
(half a pseudo-count in each cell of the 2x2 table) so that it stays positive with few
discordant pairs. The same formula holds for graded scores in [0, 1] and for a pairwise judge's
preference (d = +1, -1 or 0). For latency, d = log(candidate) - log(stable) on the same request:
the request's own length and the load it met cancel, which is what lets a small margin hold.

Looks are planned by pair count per slice and use the same alpha-spending boundary and stopping
rule as the two-sample gates (:mod:`evaluation.sequential`). Pure functions over numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluation import sequential

FloatArray = NDArray[np.float64]


def quality_gap(total: FloatArray, total_sq: FloatArray, n: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Adjusted mean of d = stable - candidate and its standard error, from running sums (vectorised).

    Half a pseudo-pair in each cell of the 2x2 table adds, per slice, one pair with d = 0 and one
    half-pair each with d = +1 and d = -1: n + 2 pairs, the sum unchanged, the sum of squares + 1.
    """
    pairs = n + 2.0
    estimate = total / pairs
    variance = np.maximum((total_sq + 1.0) / pairs - estimate**2, 0.0)
    return estimate, np.sqrt(variance / pairs)


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


def paired_looks(
    differences: FloatArray, plan: LookPlan, *, latency: bool = False
) -> tuple[sequential.SequentialLook, ...]:
    """The looks made so far over ``differences`` in arrival order (pairs past the horizon are ignored)."""
    sizes = np.array([s for s in plan.sizes() if s <= differences.size], dtype=int)
    if sizes.size == 0:
        return ()
    total, total_sq = np.cumsum(differences), np.cumsum(differences * differences)
    gap = latency_gap if latency else quality_gap
    estimate, se = gap(total[sizes - 1], total_sq[sizes - 1], sizes.astype(float))
    bounds = plan.bounds()
    return tuple(
        sequential.SequentialLook(int(size), float(e), float(s), bounds[index])
        for index, (size, e, s) in enumerate(zip(sizes, estimate, se, strict=True))
    )


def decide_quality(looks: tuple[sequential.SequentialLook, ...], margin: float) -> sequential.SequentialDecision:
    """Worse when a repeated interval excludes 0 from below; within when it lies below ``margin``."""
    return sequential.decide_shift(looks, margin)


def decide_tolerance(looks: tuple[sequential.SequentialLook, ...], tolerance: float) -> sequential.SequentialDecision:
    """Worse when a repeated interval lies above ``tolerance``; within when it lies below it.

    A latency shift inside the tolerance is noise the policy accepts, so only a shift shown beyond
    it fails (a shift of exactly the tolerance decides neither way, by design of both tests).
    """
    shifted = tuple(
        sequential.SequentialLook(lk.samples, lk.estimate - tolerance, lk.standard_error, lk.boundary) for lk in looks
    )
    decision = sequential.decide_shift(shifted, 0.0)
    return sequential.SequentialDecision(decision.verdict, decision.decided_at, looks)


def log_ratio(stable_s: float | None, candidate_s: float | None) -> float | None:
    """log(candidate / stable) of one request's latency; None unless both are positive."""
    if stable_s is None or candidate_s is None or stable_s <= 0 or candidate_s <= 0:
        return None
    return math.log(candidate_s / stable_s)
