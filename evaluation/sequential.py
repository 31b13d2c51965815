"""Sequential statistics: group-sequential boundaries by alpha spending, and confidence sequences.

Two tools, both valid when the controller looks after every batch:

- :func:`spending_boundary` gives one-sided z boundaries for a planned schedule of looks up to the
  stage's known maximum sample (Lan-DeMets alpha spending with an O'Brien-Fleming-type function).
  Knowing the horizon lets the test spend almost all of its alpha near the end, so it keeps close
  to the power of a single fixed-horizon test while allowing a look after every batch.
- :func:`bernoulli_confidence_sequence` is a beta-binomial mixture confidence sequence: valid at
  every sample size with no horizon at all, used for SLO attainment, the traffic split and the
  rollback window (it lives in :mod:`evaluation.confidence`, free of scipy, and is re-exported here).

Pure functions over numbers; numpy and scipy only. The router must never import this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats

from revgate.evaluation.confidence import bernoulli_confidence_sequence, mixture_rejects

__all__ = ["bernoulli_confidence_sequence", "mixture_rejects"]  # re-exported: the gates read them from here

# A boundary this high is never crossed: the spending function gave this look (almost) no alpha.
NEVER = math.inf
_GRID_POINTS = 401
_GRID_WIDTH = 9.0  # standard deviations of the Brownian path kept below the boundary


def obrien_fleming_spent(alpha: float, fraction: float) -> float:
    """Cumulative one-sided alpha spent by information ``fraction`` (Lan-DeMets O'Brien-Fleming type)."""
    if fraction <= 0.0:
        return 0.0
    fraction = min(fraction, 1.0)
    z = stats.norm.isf(alpha / 2.0)
    return float(2.0 * stats.norm.sf(z / math.sqrt(fraction)))


def look_fractions(max_samples: int, look_every: int) -> tuple[float, ...]:
    """Information fractions of the planned looks: after every ``look_every`` samples, up to the maximum."""
    sizes = [*range(look_every, max_samples, look_every), max_samples]
    return tuple(size / max_samples for size in sizes)


def look_sizes(max_samples: int, look_every: int) -> tuple[int, ...]:
    """Sample sizes (per arm) at which the planned looks happen."""
    return tuple(round(f * max_samples) for f in look_fractions(max_samples, look_every))


def _crossing_probability(
    density: NDArray[np.float64], grid: NDArray[np.float64], weights: NDArray[np.float64], bound: float, step_sd: float
) -> float:
    """P(path continued until now and crosses ``bound`` at this look), on the Brownian (W) scale."""
    tail = stats.norm.sf((bound - grid) / step_sd)
    return float(np.sum(weights * density * tail))


def _propagate(
    density: NDArray[np.float64],
    grid: NDArray[np.float64],
    weights: NDArray[np.float64],
    new_grid: NDArray[np.float64],
    step_sd: float,
) -> NDArray[np.float64]:
    """Sub-density of W at the next look, for paths that have not crossed yet."""
    kernel = stats.norm.pdf((new_grid[:, None] - grid[None, :]) / step_sd) / step_sd
    result: NDArray[np.float64] = kernel @ (weights * density)
    return result


def _trapezoid_grid(low: float, high: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    grid = np.linspace(low, high, _GRID_POINTS)
    weights = np.full(_GRID_POINTS, (high - low) / (_GRID_POINTS - 1))
    weights[0] /= 2.0
    weights[-1] /= 2.0
    return grid, weights


@lru_cache(maxsize=256)
def spending_boundary(alpha: float, fractions: tuple[float, ...]) -> tuple[float, ...]:
    """One-sided z boundaries c_k such that P(any Z_k >= c_k | no effect) equals ``alpha``.

    ``fractions`` are the information fractions of the looks (increasing, last 1.0). Each look
    spends the increment of the O'Brien-Fleming-type function; the boundary is found by numerical
    integration of the Brownian path that has stayed below every earlier boundary.
    """
    bounds: list[float] = []
    density = grid = weights = np.zeros(0)
    previous_t, previous_spent = 0.0, 0.0
    for t in fractions:
        spent = obrien_fleming_spent(alpha, t)
        increment = spent - previous_spent
        step_sd = math.sqrt(t - previous_t)
        if not bounds:
            z = float(stats.norm.isf(increment)) if increment > 1e-300 else NEVER
            bound_w = z * math.sqrt(t)
        else:
            bound_w = _solve_bound(density, grid, weights, increment=increment, step_sd=step_sd, scale=math.sqrt(t))
            z = bound_w / math.sqrt(t) if math.isfinite(bound_w) else NEVER
        bounds.append(z)
        top = bound_w if math.isfinite(bound_w) else _GRID_WIDTH * math.sqrt(t)
        new_grid, new_weights = _trapezoid_grid(-_GRID_WIDTH * math.sqrt(t), top)
        if density.size == 0:
            density = stats.norm.pdf(new_grid / math.sqrt(t)) / math.sqrt(t)
        else:
            density = _propagate(density, grid, weights, new_grid, step_sd)
        grid, weights = new_grid, new_weights
        previous_t, previous_spent = t, spent
    return tuple(bounds)


def _solve_bound(
    density: NDArray[np.float64],
    grid: NDArray[np.float64],
    weights: NDArray[np.float64],
    *,
    increment: float,
    step_sd: float,
    scale: float,
) -> float:
    """The W-scale bound whose crossing probability at this look equals ``increment``."""

    def excess(bound: float) -> float:
        return _crossing_probability(density, grid, weights, bound, step_sd) - increment

    high = _GRID_WIDTH * scale + 10.0 * step_sd
    if increment <= 1e-250 or excess(high) > 0:
        return NEVER
    low = float(grid[0])
    if excess(low) < 0:  # more alpha than the surviving paths can use: cross at the grid's bottom
        return low
    return float(optimize.brentq(excess, low, high, xtol=1e-9))


@dataclass(frozen=True, slots=True)
class SequentialLook:
    """One planned look: sample size per arm, estimate, standard error and the z boundary."""

    samples: int
    estimate: float
    standard_error: float
    boundary: float

    def lower(self) -> float:
        """Lower end of the repeated confidence interval at this look."""
        return self.estimate - self.boundary * self.standard_error

    def upper(self) -> float:
        """Upper end of the repeated confidence interval at this look."""
        return self.estimate + self.boundary * self.standard_error


@dataclass(frozen=True, slots=True)
class SequentialDecision:
    """Where a sequential comparison stands: 'worse', 'within', or 'open', with every look made."""

    verdict: str
    decided_at: int | None
    looks: tuple[SequentialLook, ...]


OPEN, WORSE, WITHIN, FUTILE = 0, 1, 2, 3
VERDICTS = ("open", "worse", "within", "futile")


def conditional_pass(
    estimate: NDArray[np.float64], standard_error: NDArray[np.float64], fraction: NDArray[np.float64],
    final_bound: float, margin: float,
) -> NDArray[np.float64]:
    """P(the last planned look passes | this look), were the candidate exactly equal to stable from now on.

    At information ``fraction`` t of the horizon the final estimate is ``t * estimate`` plus the mean
    of the samples still to come, which for an equal candidate is centred on 0 with standard deviation
    ``se * sqrt(t (1 - t))`` (se: this look's standard error, scaling as 1/sqrt(n)). The final look
    passes when its estimate plus ``final_bound`` final standard errors (``se * sqrt(t)``) lies below
    ``margin``. Only the last look is counted, so this slightly understates the chance of passing:
    futility stops on it are a little early, never late.
    """
    t = np.clip(fraction, 0.0, 1.0)
    spread = standard_error * np.sqrt(t * (1.0 - t))
    room = margin - final_bound * standard_error * np.sqrt(t) - t * estimate
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread > 0, room / np.where(spread > 0, spread, 1.0), np.where(room > 0, np.inf, -np.inf))
    result: NDArray[np.float64] = stats.norm.cdf(z)
    return result


def verdicts(
    estimate: NDArray[np.float64], standard_error: NDArray[np.float64], bounds: NDArray[np.float64], margin: float,
    *, futility: Futility | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Vectorised stopping rule over looks on the last axis: (verdict code, index of the deciding look or -1).

    At each look the repeated interval is ``estimate +- bound * standard_error`` (positive estimate
    = the candidate is worse). The first look whose interval excludes 0 decides WORSE; the first
    whose interval lies below ``margin`` decides WITHIN; a look that shows both counts as WORSE.
    With a ``futility`` rule, a look before the last at which the chance of passing by the horizon
    (:func:`conditional_pass`) is below the rule's threshold decides FUTILE: passing is out of
    reach, so the stage need not run on.
    """
    usable = np.isfinite(bounds) & (standard_error > 0)
    width = np.where(usable, bounds * standard_error, np.inf)
    worse = usable & (estimate - width > 0.0)
    within = usable & (estimate + width < margin) & ~worse
    decided = worse | within
    if futility is not None:
        fractions = np.broadcast_to(futility.fractions[: estimate.shape[-1]], estimate.shape)
        chance = conditional_pass(estimate, standard_error, fractions, futility.final_bound, margin)
        futile = usable & (fractions < 1.0) & (chance < futility.below) & ~decided
        decided = decided | futile
    first = np.where(decided.any(axis=-1), decided.argmax(axis=-1), -1)
    index = np.maximum(first, 0)[..., None]
    at_worse = np.take_along_axis(worse, index, axis=-1)[..., 0]
    at_within = np.take_along_axis(within, index, axis=-1)[..., 0]
    code = np.where(first < 0, OPEN, np.where(at_worse, WORSE, np.where(at_within, WITHIN, FUTILE)))
    return code.astype(np.int64), first.astype(np.int64)


@dataclass(frozen=True, slots=True)
class Futility:
    """Stop a comparison once passing by the horizon is less likely than ``below``.

    ``fractions`` are the planned looks' information fractions and ``final_bound`` the last
    planned look's boundary (the look that may not have been reached yet).
    """

    below: float
    fractions: NDArray[np.float64]
    final_bound: float

    @classmethod
    def planned(cls, below: float | None, fractions: tuple[float, ...], bounds: tuple[float, ...]) -> Futility | None:
        """The rule for one look plan; None when the policy sets no futility threshold."""
        if below is None or not bounds:
            return None
        return cls(below, np.array(fractions), bounds[-1])


def decide_shift(
    looks: tuple[SequentialLook, ...], margin: float, *, futility: Futility | None = None
) -> SequentialDecision:
    """Apply :func:`verdicts` to the looks made so far."""
    if not looks:
        return SequentialDecision("open", None, looks)
    code, first = verdicts(
        np.array([lk.estimate for lk in looks]),
        np.array([lk.standard_error for lk in looks]),
        np.array([lk.boundary for lk in looks]),
        margin,
        futility=futility,
    )
    verdict = VERDICTS[int(code)]
    return SequentialDecision(verdict, None if verdict == "open" else looks[int(first)].samples, looks)


def decide_between(
    looks: tuple[SequentialLook, ...], harm: float, margin: float, *, futility: Futility | None = None
) -> SequentialDecision:
    """Worse when a repeated interval lies above ``harm``; within when it lies below ``margin``.

    ``harm`` 0 is :func:`decide_shift`. A positive ``harm`` accepts a shift up to it as noise: only a
    shift shown beyond it is worse. The decision keeps the looks as measured (unshifted).
    """
    shifted = tuple(SequentialLook(lk.samples, lk.estimate - harm, lk.standard_error, lk.boundary) for lk in looks)
    decision = decide_shift(shifted, margin - harm, futility=futility)
    return SequentialDecision(decision.verdict, decision.decided_at, looks)


def quantile(samples: NDArray[np.float64] | list[float], q: float) -> float | None:
    """The ``q`` quantile of merged samples (linear interpolation); None when there are none."""
    values = np.asarray(samples, dtype=float)
    values = values[np.isfinite(values)]
    return None if values.size == 0 else float(np.quantile(values, q))
