"""Power of a stage's plan: how likely each gate passes an equal revision, checked before the stage starts.

A sequential gate that cannot reach its pass boundary within the samples a stage gives it turns
an equal revision into an inconclusive stage, which the policy's rule may then roll back. So before
a stage the flow asks, per gate and slice: with stable's own measured rate (or latency spread), the
policy's margin, alpha and look plan, and the samples the stage will deliver, what is the chance of
passing a candidate exactly equal to stable? And how many samples per arm would reach the target?

The answer comes from the same stopping rule the gates use (:func:`sequential.verdicts`, futility
included), run over simulated estimate paths with a normal approximation: an estimate's standard
error is ``unit_sd / sqrt(n)``. Pure functions over numbers and records; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from revgate.evaluation import metrics, sequential
from revgate.evaluation.records import RequestRecord
from revgate.manifests.gates import GatePolicy, LatencyMetric

PATHS = 20_000  # simulated stages per figure: a rate's standard error below 0.3 points at 0.9
MOST_SAMPLES = 200_000  # the largest horizon the search for a sufficient one will propose
MOST_LOOKS = 25  # looks planned per horizon tried by that search (the boundaries' cost grows with them)
UNKNOWN_RATE = 0.5  # stable's rate when nothing measured it yet: the widest spread, so never optimistic


@dataclass(frozen=True, slots=True)
class Characteristics:
    """Operating characteristics of one comparison: how often it passes, fails, stops futile or stays open."""

    passed: float
    failed: float
    futile: float
    undecided: float


@dataclass(frozen=True, slots=True)
class Comparison:
    """One sequential comparison as a gate plans it.

    ``unit_sd``: the estimate's standard error times sqrt(samples per arm); estimates are positive
    when the candidate is worse; ``harm`` is the shift tolerated before failing, ``margin`` the
    shift below which it passes; looks every ``every`` samples per arm up to ``horizon``.
    """

    unit_sd: float
    horizon: int
    every: int
    alpha: float
    margin: float
    harm: float = 0.0
    futility_below: float | None = None

    def at_horizon(self, horizon: int) -> Comparison:
        """The same comparison planned to another horizon: looks as often, but at most :data:`MOST_LOOKS`.

        Fewer looks than the policy would make at a far horizon pass a little sooner; the figure is
        the samples a plan needs, and the plan's own check at that horizon is exact.
        """
        every = max(min(self.every, horizon), -(-horizon // MOST_LOOKS))
        return replace(self, horizon=horizon, every=every)


@lru_cache(maxsize=4096)
def characteristics(comparison: Comparison, samples: int, shift: float = 0.0, paths: int = PATHS,
                    seed: int = 0) -> Characteristics:
    """Simulated outcome rates of the gate's stopping rule for a true shift ``shift`` (0: an equal candidate).

    ``samples`` per arm reach the comparison; looks planned beyond them never happen.
    """
    c = comparison
    fractions = sequential.look_fractions(c.horizon, min(c.every, c.horizon))
    all_bounds = sequential.spending_boundary(c.alpha, fractions)
    sizes = np.array(sequential.look_sizes(c.horizon, min(c.every, c.horizon)), dtype=float)
    reached = sizes <= samples
    if not reached.any():
        return Characteristics(0.0, 0.0, 0.0, 1.0)
    if c.unit_sd <= 0:
        return Characteristics(1.0, 0.0, 0.0, 0.0)
    sizes, bounds = sizes[reached], np.array(all_bounds)[reached]
    rng = np.random.default_rng(seed)
    steps = np.diff(np.concatenate([[0.0], sizes]))
    sums = np.cumsum(rng.normal(0.0, 1.0, (paths, sizes.size)) * c.unit_sd * np.sqrt(steps), axis=1)
    estimate = shift + sums / sizes
    error = np.ascontiguousarray(np.broadcast_to(c.unit_sd / np.sqrt(sizes), estimate.shape))
    rule = sequential.Futility.planned(c.futility_below, fractions, all_bounds)
    code, _ = sequential.verdicts(estimate - c.harm, error, np.broadcast_to(bounds, estimate.shape),
                                  c.margin - c.harm, futility=rule)
    counts = np.bincount(code.ravel(), minlength=4) / paths
    return Characteristics(passed=float(counts[sequential.WITHIN]), failed=float(counts[sequential.WORSE]),
                           futile=float(counts[sequential.FUTILE]), undecided=float(counts[sequential.OPEN]))


def sufficient_horizon(comparison: Comparison, target: float) -> int | None:
    """The fewest samples per arm (a horizon, looks as often) that pass an equal candidate at ``target``.

    None when even :data:`MOST_SAMPLES` would not. Passing grows with the horizon (the margin is
    fixed while the interval narrows), so a doubling search then a bisection finds it.
    """

    def enough(n: int) -> bool:
        return characteristics(comparison.at_horizon(n), n).passed >= target

    high = max(comparison.every, 2)
    while not enough(high):
        if high >= MOST_SAMPLES:
            return None
        high = min(high * 2, MOST_SAMPLES)
    low = high // 2
    while high - low > max(1, high // 100):  # 1% is as close as the simulation can tell
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


# --- a stage's check ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StableProfile:
    """What stable's own traffic measured: graded rate per quality slice and the spread of log latency."""

    rates: Mapping[str, tuple[float, int]]  # slice -> (rate, graded samples)
    log_sd: Mapping[str, float]  # latency metric -> standard deviation of log seconds
    source: str  # where it was measured, for the report


def profile_of(records: Sequence[RequestRecord], rates: Mapping[str, list[float]], metrics_of: Sequence[LatencyMetric],
               source: str) -> StableProfile:
    """A profile from stable's records (latency) and its graded scores by slice (quality)."""
    spread: dict[str, float] = {}
    for metric in metrics_of:
        values = [math.log(s) for r in records if r.outcome == "ok" and (s := metrics.latency_s(r, metric))]
        if len(values) >= 10:
            spread[metric] = float(np.std(values, ddof=1))
    return StableProfile({k: (float(np.mean(v)), len(v)) for k, v in rates.items() if v}, spread, source)


@dataclass(frozen=True, slots=True)
class CellPower:
    """One gate cell (a quality slice, a latency metric): its chance of passing an equal candidate."""

    gate: str
    cell: str
    samples: int  # per arm, what the stage will give this cell
    horizon: int  # per arm, the plan's last look
    passed: float  # P(pass | equal) with those samples
    needed: int | None  # samples per arm for the target (None: out of reach)
    basis: str  # what the spread was taken from

    def describe(self) -> str:
        """e.g. ``quality family=add,length=long: 0.41 at 200 per arm (needs 850; stable 0.233 over 212)``."""
        need = f"needs {self.needed}" if self.needed is not None else f"not within {MOST_SAMPLES}"
        return f"{self.gate} {self.cell}: {self.passed:.2f} at {self.samples} per arm ({need}; {self.basis})"


@dataclass(frozen=True, slots=True)
class StagePower:
    """The power check of one stage: every cell, the target, and how long the stage will take."""

    cells: tuple[CellPower, ...]
    target: float
    expected_seconds: float | None
    notes: tuple[str, ...] = ()

    @property
    def weakest(self) -> CellPower | None:
        """The cell least likely to pass an equal candidate."""
        return min(self.cells, key=lambda c: c.passed, default=None)

    @property
    def ok(self) -> bool:
        """Every cell passes an equal candidate at least at the target rate."""
        return all(c.passed >= self.target for c in self.cells)

    def line(self) -> str:
        """The report's power line."""
        took = f"; the stage takes about {self.expected_seconds:.0f} s" if self.expected_seconds else ""
        weakest = self.weakest
        if weakest is None:
            return f"power: no two-sample gate in this stage to size ({self.notes[-1]}){took}"
        verdict = "at least {:.2f} on every gate cell" if self.ok else "below {:.2f} on some gate cell"
        return (f"power: P(pass | equal) {verdict.format(self.target)}; weakest "
                f"{weakest.describe()}{took}")


@dataclass(frozen=True, slots=True)
class StageShape:
    """What one stage will deliver: samples per arm in all, and each quality slice's share of them."""

    samples_per_arm: int
    slice_shares: Mapping[str, float]
    samples_per_second: float | None  # the stage's expected pace (both arms), for its duration


def stage_power(policy: GatePolicy, shape: StageShape, profile: StableProfile | None, target: float) -> StagePower:
    """The chance each two-sample gate cell passes an equal candidate in this stage, and what it would need."""
    alpha = float(policy.alpha)
    futility = float(policy.futility_below) if policy.futility_below is not None else None
    cells: list[CellPower] = []
    if policy.two_sample_quality is not False and shape.slice_shares:
        per_slice = alpha / len(shape.slice_shares)
        for name, share in sorted(shape.slice_shares.items()):
            rate, basis = _rate(profile, name)
            unit = math.sqrt(2.0 * min(max(rate, 0.01), 0.99) * (1.0 - min(max(rate, 0.01), 0.99)))
            measured = rate if profile is not None and name in profile.rates else None
            comparison = Comparison(unit, policy.max_samples_per_stage, policy.look_every, per_slice,
                                    policy.margin_for(measured), futility_below=futility)
            cells.append(_cell("quality", name, comparison, int(shape.samples_per_arm * share), target=target,
                               basis=basis))
    if policy.latency_metrics:
        per_metric = alpha / len(policy.latency_metrics)
        margin = math.log1p(float(policy.latency_margin))
        harm = math.log1p(float(policy.latency_fail_above or 0))
        for metric in policy.latency_metrics:
            sd, basis = _spread(profile, metric)
            comparison = Comparison(math.sqrt(2.0) * sd, policy.latency_horizon, policy.latency_look_interval,
                                    per_metric, margin, harm, futility)
            cells.append(_cell(f"latency-{metric}", "*", comparison, shape.samples_per_arm, target=target, basis=basis))
    seconds = 2 * shape.samples_per_arm / shape.samples_per_second if shape.samples_per_second else None
    notes = ("SLO, error and split gates are confidence sequences or near-certain for an equal revision",
             "paired gates depend on how often the two revisions' answers differ and are not sized before the stage")
    return StagePower(tuple(cells), target, seconds, notes)


def _cell(gate: str, cell: str, comparison: Comparison, samples: int, *, target: float, basis: str) -> CellPower:
    passed = characteristics(comparison, samples).passed
    return CellPower(gate, cell, samples, comparison.horizon, passed, sufficient_horizon(comparison, target), basis)


def _rate(profile: StableProfile | None, name: str) -> tuple[float, str]:
    if profile is not None and name in profile.rates:
        rate, count = profile.rates[name]
        return rate, f"stable {rate:.3f} over {count}, {profile.source}"
    return UNKNOWN_RATE, f"stable's rate not measured yet: assumed {UNKNOWN_RATE}"


def _spread(profile: StableProfile | None, metric: str) -> tuple[float, str]:
    if profile is not None and metric in profile.log_sd:
        sd = profile.log_sd[metric]
        return sd, f"stable's log {metric} sd {sd:.2f}, {profile.source}"
    return 1.0, f"stable's {metric} spread not measured yet: assumed sd 1.0 in log seconds"


def samples_to_reach(power: StagePower, shape: StageShape, most: int) -> int | None:
    """The stage's samples per arm that bring every cell to the target within its horizon, if ``most`` allows.

    Only a stage too short for its horizon can be extended: a cell whose horizon itself is too
    short needs another policy, and the answer is None.
    """
    wanted = shape.samples_per_arm
    for cell in power.cells:
        if cell.passed >= power.target:
            continue
        if cell.needed is None or cell.needed > cell.horizon:
            return None
        share = shape.slice_shares.get(cell.cell, 1.0) if cell.gate == "quality" else 1.0
        wanted = max(wanted, math.ceil(cell.horizon / share))
    return wanted if wanted <= most else None
