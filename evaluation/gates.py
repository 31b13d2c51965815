"""Joint, per-slice, sequential gates over a candidate and the concurrent stable baseline.

Each gate is a small object with one method, ``evaluate(evidence) -> GateResult`` (the shape of
sigstore's verification policies), and :class:`AllOf` combines them: every gate must pass, there is
no blended score. :func:`gates_from_policy` builds the standard set from a :class:`GatePolicy`, and
:func:`judge` turns the results into a :class:`GateReport` bound to the evidence digest.

Comparisons (quality, errors, latency) are group-sequential: the statistic is evaluated at the
planned looks (every ``look_every`` samples per arm, up to ``max_samples_per_stage``) against an
alpha-spending boundary, so the controller may call a gate as often as it likes; extra calls see
the same planned looks and cannot inflate the error rate. At the first look whose repeated
confidence interval shows the candidate worse than stable, the gate fails; at the first look that
shows it within the margin, it passes. Slices share the family-wise alpha by Bonferroni.
SLO attainment and the traffic split use confidence sequences, valid at every sample size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from revgate.evaluation import metrics, paired, sequential, slicing
from revgate.evaluation.records import RequestRecord, callers_outcome, counted, own_failure
from revgate.manifests.canonical import sha256_digest
from revgate.manifests.gates import (
    GatePolicy,
    GateReport,
    GateResult,
    LatencyMetric,
    Outcome,
    PairedGrader,
    PairedPolicy,
    SliceResult,
    SloTarget,
)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the gates read: both arms' records from the same window, and graded scores by request id."""

    stable: tuple[RequestRecord, ...]
    candidate: tuple[RequestRecord, ...]
    stable_scores: Mapping[str, float] = field(default_factory=dict)
    candidate_scores: Mapping[str, float] = field(default_factory=dict)
    expected_candidate_share: float | None = None  # the route's weight, for the sample-ratio check
    final: bool = False  # the stage has ended: missing evidence on critical slices is now a failure
    # Shadow pairs graded by named graders: grader -> request id -> (stable score, candidate score).
    pair_scores: Mapping[str, Mapping[str, tuple[float, float]]] = field(default_factory=dict)

    def digest(self) -> str:
        """A digest over every record and score, so an approval binds to exactly this evidence."""
        lines = sorted(r.to_json() for r in (*self.stable, *self.candidate))
        scores = sorted(
            f"{arm}:{rid}:{score!r}"
            for arm, table in (("s", self.stable_scores), ("c", self.candidate_scores))
            for rid, score in table.items()
        )
        pairs = sorted(
            f"p:{grader}:{rid}:{pair[0]!r}:{pair[1]!r}"
            for grader, table in self.pair_scores.items()
            for rid, pair in table.items()
        )
        return sha256_digest("\n".join([*lines, *scores, *pairs]).encode())


class Gate(Protocol):
    """A gate decides pass, fail or inconclusive from the evidence."""

    def evaluate(self, evidence: Evidence) -> GateResult: ...


def fmt(value: float | None, places: int = 4) -> str:
    """A number as a decimal string for a report ("none" when unknown)."""
    if value is None or not math.isfinite(value):
        return "none" if value is None else ("inf" if value > 0 else "-inf")
    return f"{value:.{places}f}"


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """Any fail fails; all pass passes; anything else (including nothing) is inconclusive."""
    if "fail" in outcomes:
        return "fail"
    if outcomes and all(o == "pass" for o in outcomes):
        return "pass"
    return "inconclusive"


def is_futile(result: GateResult) -> bool:
    """An inconclusive gate whose every undecided part stopped as futile: more samples will not pass it."""
    if result.outcome != "inconclusive":
        return False
    reasons = [s.reason for s in result.slices if s.outcome == "inconclusive"] or [result.reason]
    return all(reason.startswith(FUTILE) for reason in reasons)


def settled(report: GateReport) -> bool:
    """The stage can stop: decided, or inconclusive only on gates that can no longer pass (futility)."""
    if report.outcome != "inconclusive":
        return True
    return all(is_futile(r) for r in report.gates if r.outcome == "inconclusive")


@dataclass(frozen=True, slots=True)
class AllOf:
    """Every member gate must pass."""

    gates: tuple[Gate, ...]
    name: str = "all-of"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """The members' combined outcome, each member's outcome among the numbers."""
        results = [gate.evaluate(evidence) for gate in self.gates]
        outcome = combine([r.outcome for r in results])
        failing = [r.gate for r in results if r.outcome != "pass"]
        reason = "all gates pass" if outcome == "pass" else f"not passing: {', '.join(failing)}"
        return GateResult(gate=self.name, outcome=outcome, reason=reason, numbers={r.gate: r.outcome for r in results})


# --- sequential two-arm comparison -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArmSeries:
    """One arm's observations in arrival order: arrival times and values."""

    arrivals: NDArray[np.float64]
    values: NDArray[np.float64]

    @classmethod
    def of(cls, pairs: Sequence[tuple[float, float]]) -> ArmSeries:
        """Sort (arrival, value) pairs by arrival."""
        ordered = sorted(pairs)
        return cls(np.array([p[0] for p in ordered], dtype=float), np.array([p[1] for p in ordered], dtype=float))

    def __len__(self) -> int:
        return int(self.values.size)


Estimator = Callable[[NDArray[np.float64], NDArray[np.float64]], tuple[float, float]]


def proportion_gap(worse: NDArray[np.float64], better: NDArray[np.float64]) -> tuple[float, float]:
    """mean(worse) - mean(better) with Agresti-Caffo pseudo-counts, and its standard error.

    The pseudo-counts keep the standard error positive when a slice is all right or all wrong.
    For scores in [0, 1], m(1 - m) bounds the variance, so the interval stays conservative.
    """
    m_w = (worse.sum() + 1.0) / (worse.size + 2.0)
    m_b = (better.sum() + 1.0) / (better.size + 2.0)
    se = math.sqrt(m_w * (1 - m_w) / (worse.size + 2.0) + m_b * (1 - m_b) / (better.size + 2.0))
    return float(m_w - m_b), se


def mean_gap(worse: NDArray[np.float64], better: NDArray[np.float64]) -> tuple[float, float]:
    """mean(worse) - mean(better) and its Welch standard error."""
    if worse.size < 2 or better.size < 2:
        return 0.0, math.inf
    se = math.sqrt(worse.var(ddof=1) / worse.size + better.var(ddof=1) / better.size)
    return float(worse.mean() - better.mean()), se


def sequential_compare(
    worse: ArmSeries, better: ArmSeries, estimator: Estimator, *, alpha: float, policy: GatePolicy, margin: float,
    horizon: int | None = None, look_every: int | None = None, harm: float = 0.0, futility: bool = True,
) -> sequential.SequentialDecision:
    """Evaluate the planned looks made so far (``worse`` is the arm whose excess counts as harm).

    A look of size n happens once both arms have n observations; it uses every observation that
    arrived by then. Observations after the stage's maximum are outside the plan and are ignored.
    ``horizon`` and ``look_every`` replace the policy's for one gate (the latency gates' own plan);
    ``harm`` is the shift a look must show the candidate beyond to call it worse (0: any shift).
    With the policy's ``futility_below`` (and ``futility``), a look may also decide "futile".
    """
    horizon = horizon or policy.max_samples_per_stage
    every = look_every or policy.look_every
    sizes = sequential.look_sizes(horizon, every)
    fractions = sequential.look_fractions(horizon, every)
    bounds = sequential.spending_boundary(alpha, fractions)
    below = float(policy.futility_below) if futility and policy.futility_below is not None else None
    rule = sequential.Futility.planned(below, fractions, bounds)
    looks = []
    for size, bound in zip(sizes, bounds, strict=True):
        if min(len(worse), len(better)) < size:
            break
        at = max(worse.arrivals[size - 1], better.arrivals[size - 1])
        n_w = int(np.searchsorted(worse.arrivals, at, side="right"))
        n_b = int(np.searchsorted(better.arrivals, at, side="right"))
        estimate, se = estimator(worse.values[:n_w], better.values[:n_b])
        looks.append(sequential.SequentialLook(size, estimate, se, bound))
    return sequential.decide_between(tuple(looks), harm, margin, futility=rule)


def decision_numbers(
    decision: sequential.SequentialDecision, candidate: ArmSeries, stable: ArmSeries
) -> dict[str, str]:
    """The numbers a release manager reads: samples, the deciding (or last) look's estimate, interval, boundary.

    ``estimate`` is how much worse the candidate is (positive = worse); ``lower``/``upper`` bound it.
    """
    numbers = {
        "candidate_samples": str(len(candidate)),
        "stable_samples": str(len(stable)),
        "looks": str(len(decision.looks)),
    }
    if decision.looks:
        last = next((lk for lk in decision.looks if lk.samples == decision.decided_at), decision.looks[-1])
        numbers |= {
            "look_samples": str(last.samples),
            "estimate": fmt(last.estimate),
            "lower": fmt(last.lower()),
            "upper": fmt(last.upper()),
            "boundary_z": fmt(last.boundary, 3),
        }
    return numbers


# --- quality per slice ---------------------------------------------------------------------------


def scores_by_slice(
    records: Sequence[RequestRecord],
    scores: Mapping[str, float],
    keys: Sequence[str],
    slice_of: Callable[[RequestRecord], str] | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """(arrival, score) pairs of successful, graded records, by slice (``slice_of``, else the ``keys`` labels)."""
    name = slice_of or (lambda record: metrics.slice_name(record, keys))
    by_slice: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        if record.outcome == "ok" and record.request_id in scores:
            by_slice.setdefault(name(record), []).append((record.arrival_s, scores[record.request_id]))
    return by_slice


@dataclass(frozen=True, slots=True)
class QualityGate:
    """Per-slice non-inferiority of the candidate's graded quality against stable."""

    policy: GatePolicy
    name: str = "quality"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Bonferroni across slices; small slices inconclusive; critical slices without evidence fail at the end."""
        keys, slice_of = self.policy.slice_keys, slice_function(self.policy)
        stable = scores_by_slice(evidence.stable, evidence.stable_scores, keys, slice_of)
        candidate = scores_by_slice(evidence.candidate, evidence.candidate_scores, keys, slice_of)
        names = sorted(set(stable) | set(candidate) | {c for c in self.policy.critical_slices})
        alpha = float(self.policy.alpha) / max(len(names), 1)
        slices = tuple(self._slice(n, stable.get(n, []), candidate.get(n, []), alpha, evidence.final) for n in names)
        outcome = combine([s.outcome for s in slices])
        worst = [s.slice for s in slices if s.outcome == outcome and outcome != "pass"]
        reason = (
            "every slice non-inferior" if outcome == "pass" else f"{outcome}: {', '.join(worst) or 'no graded traffic'}"
        )
        return GateResult(
            gate=self.name,
            outcome=outcome,
            reason=reason,
            numbers={"slices": str(len(names)), "alpha_per_slice": fmt(alpha, 6)}
            | _unmatched_numbers((*evidence.stable, *evidence.candidate), self.policy),
            slices=slices,
        )

    def decision(self, stable: ArmSeries, candidate: ArmSeries, alpha: float) -> sequential.SequentialDecision:
        """The sequential comparison for one slice (stable - candidate: positive means the candidate is worse).

        A relative margin follows stable's rate in the slice (``GatePolicy.margin_for``).
        """
        rate = float(stable.values.mean()) if len(stable) else None
        return sequential_compare(
            stable, candidate, proportion_gap, alpha=alpha, policy=self.policy, margin=self.policy.margin_for(rate)
        )

    def _slice(
        self,
        name: str,
        stable_pairs: list[tuple[float, float]],
        candidate_pairs: list[tuple[float, float]],
        alpha: float,
        final: bool,
    ) -> SliceResult:
        stable, candidate = ArmSeries.of(stable_pairs), ArmSeries.of(candidate_pairs)
        decision = self.decision(stable, candidate, alpha)
        stable_mean = float(stable.values.mean()) if len(stable) else None
        numbers = decision_numbers(decision, candidate, stable) | {
            "stable_mean": fmt(stable_mean),
            "candidate_mean": fmt(float(candidate.values.mean()) if len(candidate) else None),
            "margin": fmt(self.policy.margin_for(stable_mean)),
        }
        critical = name in self.policy.critical_slices
        outcome, reason = _slice_outcome(
            decision, min(len(stable), len(candidate)), self.policy.min_samples_per_slice, critical and final
        )
        return SliceResult(slice=name, outcome=outcome, reason=reason, numbers=numbers)


class Verdict(Protocol):
    """A sequential decision as the outcome rules read it."""

    @property
    def verdict(self) -> str: ...

    @property
    def decided_at(self) -> int | None: ...


FUTILE = "futile"  # the reason's first word when a comparison stopped because passing was out of reach


def _slice_outcome(decision: Verdict, samples: int, minimum: int, must_decide: bool) -> tuple[Outcome, str]:
    if decision.verdict in {"worse", FUTILE}:
        return _stopped_outcome(decision, must_decide)
    if samples < minimum:
        if must_decide:
            return "fail", f"critical slice has {samples} < {minimum} samples at the end of the stage"
        return "inconclusive", f"{samples} < {minimum} samples"
    if decision.verdict == "within":
        return "pass", f"within the margin at look n={decision.decided_at}"
    if must_decide:
        return "fail", "critical slice undecided at the end of the stage"
    return "inconclusive", "no boundary crossed yet"


def _stopped_outcome(decision: Verdict, must_decide: bool) -> tuple[Outcome, str]:
    """Worse, or futile: passing out of reach (a critical slice must decide, so that fails it)."""
    if decision.verdict == "worse":
        return "fail", f"worse than stable at look n={decision.decided_at}"
    if must_decide:
        return "fail", f"critical slice cannot pass by the horizon (futile at look n={decision.decided_at})"
    return "inconclusive", f"{FUTILE} at look n={decision.decided_at}: passing by the horizon is out of reach"


# --- error rate and latency ---------------------------------------------------------------------


def _series(records: Sequence[RequestRecord], value: Callable[[RequestRecord], float | None]) -> ArmSeries:
    pairs = [(r.arrival_s, v) for r in records if (v := value(r)) is not None]
    return ArmSeries.of(pairs)


def _rate_result(
    name: str, policy: GatePolicy, evidence: Evidence, value: Callable[[RequestRecord], float | None], *,
    harm_only: bool = False,
) -> GateResult:
    """Sequential two-proportion comparison of ``value`` (1 for the outcome, 0 for not, None: not counted).

    ``harm_only``: fail when the candidate is shown worse, pass otherwise. For outcomes callers can
    send at will (a tenant's share of 4xx or 1 ms deadlines, load both arms shed alike): shown equal
    within the margin would take samples no stage has at a 10% rate, and an undecided gate would let
    that tenant hold every rollout inconclusive.
    """
    candidate, stable = _series(evidence.candidate, value), _series(evidence.stable, value)
    decision = sequential_compare(
        candidate, stable, proportion_gap, alpha=float(policy.alpha), policy=policy, margin=float(policy.error_margin)
    )
    outcome, reason = _slice_outcome(decision, min(len(candidate), len(stable)), policy.min_samples_per_slice, False)
    if harm_only and decision.verdict != "worse":
        outcome, reason = "pass", f"not shown worse than stable ({len(candidate)} and {len(stable)} requests)"
    rates = {f"candidate_{k}": fmt(v) for k, v in metrics.outcome_rates(evidence.candidate).items()}
    rates |= {f"stable_{k}": fmt(v) for k, v in metrics.outcome_rates(evidence.stable).items()}
    return GateResult(gate=name, outcome=outcome, reason=reason,
                      numbers=decision_numbers(decision, candidate, stable) | rates)


def _own_failure(record: RequestRecord) -> float | None:
    return float(own_failure(record)) if counted(record) else None


def _callers_outcome(record: RequestRecord) -> float | None:
    return None if record.outcome in {"rejected", "cancelled"} else float(callers_outcome(record))


def _rejected(record: RequestRecord) -> float | None:
    return None if record.outcome == "cancelled" else float(record.outcome == "rejected")


@dataclass(frozen=True, slots=True)
class ErrorRateGate:
    """The revision's own failures (5xx, upstream errors, the route's deadline) among the requests that say
    anything about it: candidate not worse than stable by more than the margin. A caller's 4xx or its own
    shorter deadline is not one (``CallerOutcomeGate`` compares those)."""

    policy: GatePolicy
    name: str = "errors"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Sequential two-proportion comparison of the revision's own failure rate."""
        return _rate_result(self.name, self.policy, evidence, _own_failure)


@dataclass(frozen=True, slots=True)
class CallerOutcomeGate:
    """Callers' outcomes (4xx answers, callers' own deadlines) compared between the arms, never charged to one.

    A tenant who sends malformed requests or 1 ms deadlines sends them to both arms alike, so the rates
    agree; a candidate that answers 400 where stable serves (a smaller context window) does not.
    """

    policy: GatePolicy
    name: str = "caller-outcomes"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Sequential two-proportion comparison of the callers' outcome rate; fails only when shown worse."""
        return _rate_result(self.name, self.policy, evidence, _callers_outcome, harm_only=True)


@dataclass(frozen=True, slots=True)
class RejectionGate:
    """Requests refused (429, 503): a candidate that sheds load must not pass because shed requests are not
    counted elsewhere. Candidate no worse than stable by more than the margin."""

    policy: GatePolicy
    name: str = "rejections"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Sequential two-proportion comparison of the rejection rate; fails only when shown worse."""
        return _rate_result(self.name, self.policy, evidence, _rejected, harm_only=True)


def log_latency(metric: LatencyMetric) -> Callable[[RequestRecord], float | None]:
    """log(seconds) of ``metric`` for successful records (None when undefined)."""

    def value(record: RequestRecord) -> float | None:
        seconds = metrics.latency_s(record, metric) if record.outcome == "ok" else None
        return math.log(seconds) if seconds is not None and seconds > 0 else None

    return value


@dataclass(frozen=True, slots=True)
class LatencyGate:
    """Shift of mean log latency against stable: a relative slowdown beyond the margin fails."""

    policy: GatePolicy
    metric: LatencyMetric
    alpha: float

    @property
    def name(self) -> str:
        """Gate name, e.g. ``latency-ttft``."""
        return f"latency-{self.metric}"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Sequential Welch comparison of log latency; the estimate is reported as a ratio too."""
        candidate = _series(evidence.candidate, log_latency(self.metric))
        stable = _series(evidence.stable, log_latency(self.metric))
        policy = self.policy
        margin, harm = math.log1p(float(policy.latency_margin)), math.log1p(float(policy.latency_fail_above or 0))
        decision = sequential_compare(candidate, stable, mean_gap, alpha=self.alpha, policy=policy, margin=margin,
                                      horizon=policy.latency_horizon, look_every=policy.latency_look_interval,
                                      harm=harm)
        samples = min(len(candidate), len(stable))
        outcome, reason = _slice_outcome(decision, samples, policy.min_samples_per_slice, False)
        if outcome == "fail" and harm:
            reason = f"slower than stable by more than {policy.latency_fail_above} at look n={decision.decided_at}"
        numbers = decision_numbers(decision, candidate, stable)
        if decision.looks:
            numbers["ratio"] = fmt(math.exp(float(numbers["estimate"])))
        return GateResult(gate=self.name, outcome=outcome, reason=reason, numbers=numbers)


# --- paired shadow gates -------------------------------------------------------------------------

REFERENCE = PairedGrader(name="reference", kind="reference")  # the stage's own graded scores


def slice_function(policy: GatePolicy) -> Callable[[RequestRecord], str]:
    """How a record is put in a slice: the policy's slicing rules, else its ``slice_keys`` labels."""
    rules = policy.slicing
    if rules is None:
        return lambda record: metrics.slice_name(record, policy.slice_keys)
    return lambda record: slicing.record_slice(record, rules)


def pairs_of(evidence: Evidence) -> list[tuple[RequestRecord, RequestRecord]]:
    """(stable, candidate) records of the same request, in the stable arrival order."""
    candidate = {r.request_id: r for r in evidence.candidate}
    joined = [(s, candidate[s.request_id]) for s in evidence.stable if s.request_id in candidate]
    return sorted(joined, key=lambda pair: pair[0].arrival_s)


def grader_scores(evidence: Evidence, grader: PairedGrader) -> Mapping[str, tuple[float, float]]:
    """(stable, candidate) scores by request id: the named grader's, or the stage's own for ``reference``."""
    if grader.kind != "reference":
        return evidence.pair_scores.get(grader.name, {})
    s, c = evidence.stable_scores, evidence.candidate_scores
    return {rid: (s[rid], c[rid]) for rid in s.keys() & c.keys()}


def covers(grader: PairedGrader, slice_name: str) -> bool:
    """Whether the policy sends ``slice_name``'s pairs to this grader."""
    return "*" in grader.slices or slice_name in grader.slices


def quality_cells(
    evidence: Evidence, policy: GatePolicy, graders: Sequence[PairedGrader]
) -> dict[tuple[str, str], list[float]]:
    """d = stable - candidate per (grader, slice), in arrival order; critical slices present even if empty."""
    slice_of = slice_function(policy)
    cells: dict[tuple[str, str], list[float]] = {}
    pairs = pairs_of(evidence)
    for grader in graders:
        scores = grader_scores(evidence, grader)
        for name in policy.critical_slices:
            if covers(grader, name):
                cells.setdefault((grader.name, name), [])
        for stable, _ in pairs:
            if (pair := scores.get(stable.request_id)) is not None and covers(grader, name := slice_of(stable)):
                cells.setdefault((grader.name, name), []).append(pair[0] - pair[1])
    return cells


def paired_numbers(decision: paired.QualityDecision, differences: NDArray[np.float64]) -> dict[str, str]:
    """Pairs, discordant pairs, and the deciding (or last) look's estimate, z statistics and boundary."""
    numbers = {
        "pairs": str(differences.size),
        "candidate_lost": str(int((differences > 0).sum())),
        "candidate_won": str(int((differences < 0).sum())),
        "looks": str(len(decision.looks)),
    }
    if (look := decision.deciding()) is not None:
        numbers |= {
            "look_pairs": str(look.pairs),
            "estimate": fmt(look.estimate),
            "z_worse": fmt(look.z_worse, 3),
            "z_within": fmt(look.z_within, 3),
            "boundary_z": fmt(look.boundary, 3),
        }
    return numbers


def _plan(settings: PairedPolicy, alpha: float, horizon: int | None = None) -> paired.LookPlan:
    return paired.LookPlan(alpha, horizon or settings.max_pairs_per_stage, settings.look_every)


def _unmatched_numbers(records: Sequence[RequestRecord], policy: GatePolicy) -> dict[str, str]:
    """How many requests no slicing rule matched, and their commonest features (nothing without rules)."""
    if policy.slicing is None:
        return {}
    found = slicing.census(records, policy.slicing)
    top = sorted(found.unmatched.items(), key=lambda item: -item[1])[:3]
    return {
        "unmatched_requests": str(found.unmatched_requests),
        "unmatched_features": "; ".join(f"{key} x{count}" for key, count in top) or "none",
    }


def _gate_outcome(name: str, slices: Sequence[SliceResult], passing: str) -> tuple[Outcome, str]:
    outcome = combine([s.outcome for s in slices])
    worst = [s.slice for s in slices if s.outcome == outcome and outcome != "pass"]
    return outcome, passing if outcome == "pass" else f"{outcome}: {', '.join(worst) or f'no {name} pairs'}"


@dataclass(frozen=True, slots=True)
class PairedQualityGate:
    """Per grader and slice, non-inferiority of the candidate on the same requests as stable (shadow).

    Each (grader, slice) cell is a sequential paired test; the cells share the alpha by Bonferroni.
    A cell fails once its repeated interval shows the candidate worse, and passes once it shows it
    within the paired quality margin. Requests without both grades are missing evidence.
    """

    policy: GatePolicy
    settings: PairedPolicy
    name: str = "quality-paired"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Every cell's outcome; any failing cell fails the gate."""
        graders = self.settings.graders or (REFERENCE,)
        cells = quality_cells(evidence, self.policy, graders)
        alpha = float(self.policy.alpha) / max(len(cells), 1)
        slices = tuple(self._cell(g, s, d, alpha, evidence.final) for (g, s), d in sorted(cells.items()))
        outcome, reason = _gate_outcome("graded", slices, "every slice non-inferior on the same requests")
        numbers = {"cells": str(len(cells)), "alpha_per_cell": fmt(alpha, 6), "pairs": str(len(pairs_of(evidence)))}
        return GateResult(
            gate=self.name,
            outcome=outcome,
            reason=reason,
            numbers=numbers | _unmatched_numbers(evidence.stable, self.policy),
            slices=slices,
        )

    def _cell(self, grader: str, name: str, values: list[float], alpha: float, final: bool) -> SliceResult:
        differences = np.array(values, dtype=float)
        decision = paired.quality_decision(
            differences, _plan(self.settings, alpha), float(self.settings.quality_margin)
        )
        must_decide = final and name in self.policy.critical_slices
        outcome, reason = _slice_outcome(decision, differences.size, self.policy.min_samples_per_slice, must_decide)
        return SliceResult(
            slice=f"{grader}/{name}", outcome=outcome, reason=reason, numbers=paired_numbers(decision, differences)
        )


def latency_cells(evidence: Evidence, keys: Sequence[str], metric: LatencyMetric) -> dict[str, list[float]]:
    """log(candidate / stable) of ``metric`` per slice, for requests both revisions answered."""
    cells: dict[str, list[float]] = {}
    for stable, candidate in pairs_of(evidence):
        if stable.outcome != "ok" or candidate.outcome != "ok":
            continue
        ratio = paired.log_ratio(metrics.latency_s(stable, metric), metrics.latency_s(candidate, metric))
        if ratio is not None:
            cells.setdefault(metrics.slice_name(stable, keys), []).append(ratio)
    return cells


@dataclass(frozen=True, slots=True)
class PairedLatencyGate:
    """The candidate's latency on the same requests as stable: a slowdown beyond the margin fails.

    The statistic is the mean log ratio per pair, so the request's own length and the load it met
    cancel. Fails once a repeated interval lies above log(1 + margin), passes once one lies below.
    """

    policy: GatePolicy
    settings: PairedPolicy
    metric: LatencyMetric
    alpha: float

    @property
    def name(self) -> str:
        """Gate name, e.g. ``latency-paired-ttft``."""
        return f"latency-paired-{self.metric}"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Each slice (by ``latency_slice_keys``) tested; Bonferroni across them."""
        cells = latency_cells(evidence, self.settings.latency_slice_keys, self.metric)
        alpha = self.alpha / max(len(cells), 1)
        slices = tuple(self._slice(name, values, alpha) for name, values in sorted(cells.items()))
        outcome, reason = _gate_outcome(self.metric, slices, f"slowdown shown within {self.settings.latency_margin}")
        numbers = {
            "slices": str(len(cells)),
            "alpha_per_slice": fmt(alpha, 6),
            "margin": str(self.settings.latency_margin),
        }
        return GateResult(gate=self.name, outcome=outcome, reason=reason, numbers=numbers, slices=slices)

    def _slice(self, name: str, values: list[float], alpha: float) -> SliceResult:
        differences = np.array(values, dtype=float)
        looks = paired.latency_looks(differences, _plan(self.settings, alpha, self.settings.latency_horizon))
        tolerance = math.log1p(float(self.settings.latency_margin))
        decision = paired.decide_tolerance(looks, tolerance)
        outcome, reason = _slice_outcome(decision, differences.size, self.policy.min_samples_per_slice, False)
        if outcome == "fail":
            reason = f"slower than stable by more than {self.settings.latency_margin} at look n={decision.decided_at}"
        numbers = {"pairs": str(differences.size), "looks": str(len(looks))}
        if looks:
            last = next((lk for lk in looks if lk.samples == decision.decided_at), looks[-1])
            numbers |= {"ratio": fmt(math.exp(last.estimate)), "ratio_lower": fmt(math.exp(last.lower()))}
            numbers |= {"ratio_upper": fmt(math.exp(min(last.upper(), 700.0))), "look_pairs": str(last.samples)}
        return SliceResult(slice=name, outcome=outcome, reason=reason, numbers=numbers)


# --- SLO attainment, traffic split, hard constraints --------------------------------------------


def attained(record: RequestRecord, target: SloTarget) -> bool:
    """An admitted request met every threshold of the target (errors and timeouts never do)."""
    if record.outcome != "ok":
        return False
    checks = (
        ("ttft", target.ttft_ms, record.ttft_s),
        ("tpot", target.tpot_ms, record.tpot_s),
        ("e2e", target.e2e_ms, record.e2e_s),
    )
    for metric, limit_ms, seconds in checks:
        if limit_ms is None:
            continue
        if seconds is None:
            # TPOT is undefined for a one-token answer, so it cannot break a TPOT target;
            # a missing TTFT or E2E on a successful request is missing evidence: not attained.
            if metric == "tpot":
                continue
            return False
        if seconds * 1000.0 > limit_ms:
            return False
    return True


@dataclass(frozen=True, slots=True)
class SloGate:
    """The candidate's SLO attainment per request class, tested on its confidence-sequence bounds."""

    policy: GatePolicy
    target: SloTarget
    alpha: float

    @property
    def name(self) -> str:
        """Gate name, e.g. ``slo-*`` or ``slo-length=long``."""
        return f"slo-{self.target.request_class}"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Pass when the lower bound reaches the target, fail when the upper bound is below it."""
        chosen = [r for r in evidence.candidate if metrics.in_class(r, self.target.request_class)]
        # Only the revision's own outcomes: a caller's 4xx, its own deadline or its leaving is not a miss.
        admitted = [r for r in chosen if counted(r)]
        hits = sum(attained(r, self.target) for r in admitted)
        lower, upper = sequential.bernoulli_confidence_sequence(hits, len(admitted), self.alpha)
        goal = float(self.target.attainment)
        baseline = [r for r in evidence.stable if counted(r) and metrics.in_class(r, self.target.request_class)]
        numbers = {
            "admitted": str(len(admitted)),
            "rejected": str(sum(r.outcome == "rejected" for r in chosen)),
            "not_counted_callers": str(sum(r.outcome != "rejected" and not counted(r) for r in chosen)),
            "attained": str(hits),
            "attainment": fmt(hits / len(admitted) if admitted else None),
            "lower": fmt(lower),
            "upper": fmt(upper),
            "target": str(self.target.attainment),
            "stable_attainment": fmt(
                sum(attained(r, self.target) for r in baseline) / len(baseline) if baseline else None
            ),
        }
        if upper < goal:
            return GateResult(
                gate=self.name, outcome="fail", reason=f"attainment upper bound {upper:.4f} < {goal}", numbers=numbers
            )
        if lower >= goal and len(admitted) >= self.policy.min_samples_per_slice:
            return GateResult(
                gate=self.name, outcome="pass", reason=f"attainment lower bound {lower:.4f} >= {goal}", numbers=numbers
            )
        return GateResult(
            gate=self.name,
            outcome="inconclusive",
            reason=f"bounds [{lower:.4f}, {upper:.4f}] contain {goal}",
            numbers=numbers,
        )


@dataclass(frozen=True, slots=True)
class SampleRatioGate:
    """The observed candidate share of requests matches the route's weight (a mixture sequential test)."""

    policy: GatePolicy
    expected_share: float
    name: str = "sample-ratio"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Fail when the beta-binomial mixture rejects the expected share at the SRM alpha."""
        n_c, n_s = len(evidence.candidate), len(evidence.stable)
        alpha = float(self.policy.srm_alpha)
        rejects = sequential.mixture_rejects(n_c, n_c + n_s, self.expected_share, alpha)
        numbers = {
            "candidate": str(n_c),
            "stable": str(n_s),
            "expected_share": fmt(self.expected_share),
            "observed_share": fmt(n_c / (n_c + n_s) if n_c + n_s else None),
        }
        if rejects:
            return GateResult(
                gate=self.name, outcome="fail", reason="traffic split differs from the route weight", numbers=numbers
            )
        if n_c + n_s < self.policy.min_samples_per_slice:
            return GateResult(gate=self.name, outcome="inconclusive", reason="too few requests", numbers=numbers)
        return GateResult(gate=self.name, outcome="pass", reason="no sample-ratio mismatch", numbers=numbers)


@dataclass(frozen=True, slots=True)
class HardConstraintGate:
    """Bounds on the candidate's own metrics; a metric that cannot be measured fails."""

    policy: GatePolicy
    name: str = "hard-constraints"

    def evaluate(self, evidence: Evidence) -> GateResult:
        """Check each constraint against the candidate's metric summary."""
        summary = metrics.summarize(evidence.candidate)
        broken = []
        numbers: dict[str, str] = {}
        for constraint in self.policy.hard_constraints:
            value = summary.get(constraint.metric)
            numbers[constraint.metric] = fmt(value)
            if value is None:
                broken.append(f"{constraint.metric} unknown")
            elif constraint.maximum is not None and value > float(constraint.maximum):
                broken.append(f"{constraint.metric} {value:.4f} > {constraint.maximum}")
            elif constraint.minimum is not None and value < float(constraint.minimum):
                broken.append(f"{constraint.metric} {value:.4f} < {constraint.minimum}")
        if broken:
            return GateResult(gate=self.name, outcome="fail", reason="; ".join(broken), numbers=numbers)
        return GateResult(gate=self.name, outcome="pass", reason="all constraints hold", numbers=numbers)


# --- assembling and judging ---------------------------------------------------------------------


def gates_from_policy(
    policy: GatePolicy, expected_candidate_share: float | None = None, *, paired_evidence: bool = False
) -> AllOf:
    """The standard joint gate: quality, errors, latency, SLO targets, split, hard constraints.

    With ``paired_evidence`` (the shadow stage: both revisions answered every request) and a
    ``paired`` policy section, quality and latency are the paired gates instead of two-sample ones.
    """
    alpha = float(policy.alpha)
    quality, latency = _comparisons(policy, paired_evidence)
    judged = isinstance(quality, PairedQualityGate) or policy.two_sample_quality is not False
    members: list[Gate] = [*([quality] if judged else []), ErrorRateGate(policy), CallerOutcomeGate(policy),
                           RejectionGate(policy), *latency]
    members += [SloGate(policy, t, alpha / len(policy.slo)) for t in policy.slo]
    if expected_candidate_share is not None:
        members.append(SampleRatioGate(policy, expected_candidate_share))
    if policy.hard_constraints:
        members.append(HardConstraintGate(policy))
    return AllOf(tuple(members))


def _comparisons(policy: GatePolicy, paired_evidence: bool) -> tuple[Gate, list[Gate]]:
    """(quality gate, latency gates): paired on shadow evidence when the policy has a paired section."""
    alpha = float(policy.alpha)
    settings = policy.paired
    if not paired_evidence or settings is None:
        return QualityGate(policy), [
            LatencyGate(policy, m, alpha / len(policy.latency_metrics)) for m in policy.latency_metrics
        ]
    share = alpha / max(len(settings.latency_metrics), 1)
    return PairedQualityGate(policy, settings), [
        PairedLatencyGate(policy, settings, m, share) for m in settings.latency_metrics
    ]


def _notes(evidence: Evidence) -> tuple[str, ...]:
    notes = []
    if evidence.stable and evidence.candidate:
        s0, s1 = min(r.arrival_s for r in evidence.stable), max(r.arrival_s for r in evidence.stable)
        c0, c1 = min(r.arrival_s for r in evidence.candidate), max(r.arrival_s for r in evidence.candidate)
        if c0 > s1 or s0 > c1:
            notes.append("arms were measured in disjoint windows: this is not a concurrent baseline")
    notes.append("stable may serve from a warm prefix cache; the candidate's cache starts cold")
    return tuple(notes)


def judge(gate: AllOf, policy: GatePolicy, evidence: Evidence) -> GateReport:
    """Evaluate every gate and bind the joint outcome to the policy and evidence digests."""
    results = tuple(member.evaluate(evidence) for member in gate.gates)
    outcome = combine([r.outcome for r in results])
    if outcome == "inconclusive" and evidence.final and policy.on_inconclusive == "fail":
        outcome = "fail"
    return GateReport(
        outcome=outcome,
        policy_digest=policy.digest,
        evidence_digest=evidence.digest(),
        stable_revision=_revision(evidence.stable),
        candidate_revision=_revision(evidence.candidate),
        stable=metrics.volume(evidence.stable),
        candidate=metrics.volume(evidence.candidate),
        gates=results,
        notes=_notes(evidence),
    )


def _revision(records: Sequence[RequestRecord]) -> str:
    revisions = sorted({r.revision for r in records})
    return ",".join(revisions) if revisions else "none"
