"""The beta-binomial mixture confidence sequence for a Bernoulli mean, in plain ``math``.

Valid at every sample size with no horizon at all (Ville's inequality), so a caller may look after
every request. Kept free of numpy and scipy: the rollback window (promotion) reads it in a
controller that imports no statistics stack, and :mod:`evaluation.sequential` re-exports it.
"""

from __future__ import annotations

import math

_EDGE = 1e-12  # the open interval (0, 1) the null rate is searched in
_TOLERANCE = 1e-11


def _betaln(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def log_mixture_ratio(successes: int, trials: int, p0: float, prior_a: float = 0.5, prior_b: float = 0.5) -> float:
    """log of the beta-binomial mixture likelihood ratio against the point null ``p0``."""
    failures = trials - successes
    mixture = _betaln(prior_a + successes, prior_b + failures) - _betaln(prior_a, prior_b)
    null = (successes * math.log(p0) if successes else 0.0) + (failures * math.log1p(-p0) if failures else 0.0)
    return mixture - null


def mixture_rejects(
    successes: int, trials: int, p0: float, alpha: float, *, prior_a: float = 0.5, prior_b: float = 0.5
) -> bool:
    """True once the beta-binomial mixture martingale exceeds 1/alpha (Ville: valid at every n)."""
    return log_mixture_ratio(successes, trials, p0, prior_a, prior_b) >= math.log(1.0 / alpha)


def _root(excess: object, low: float, high: float) -> float:
    """The point in [low, high] where ``excess`` changes sign (bisection; it is monotone on each side)."""
    f_low = excess(low)  # type: ignore[operator]
    while high - low > _TOLERANCE:
        middle = (low + high) / 2
        f_middle = excess(middle)  # type: ignore[operator]
        if (f_middle < 0) == (f_low < 0):
            low, f_low = middle, f_middle
        else:
            high = middle
    return (low + high) / 2


def bernoulli_confidence_sequence(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """(lower, upper) of the beta-binomial mixture confidence sequence for a Bernoulli mean."""
    if trials == 0:
        return 0.0, 1.0
    centre = min(max(successes / trials, _EDGE), 1.0 - _EDGE)
    threshold = math.log(1.0 / alpha)

    def excess(p0: float) -> float:
        return log_mixture_ratio(successes, trials, p0) - threshold

    lower = 0.0 if excess(_EDGE) < 0 else _root(excess, _EDGE, centre)
    upper = 1.0 if excess(1.0 - _EDGE) < 0 else _root(excess, centre, 1.0 - _EDGE)
    return lower, upper
