"""The rollback window's verdict: the promoted revision's live traffic against the old stable's.

After promotion the old stable stays ready and routable; the promoted revision is watched through
the router's request records. Only the revision's own failures count (``own_failure``). Its rates
are compared with the old stable's while both served (the last canary) by confidence sequences,
valid at every look however often the window looks, so a handful of unlucky requests never
reverts a good revision. Pure: the flow reads the records, folds them into a tally and acts on
the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from revgate.evaluation.confidence import bernoulli_confidence_sequence
from revgate.evaluation.records import RequestRecord, counted, own_failure
from revgate.manifests.rollout import PostPromotionCheck

WindowOutcome = Literal["watching", "healthy", "fail"]
WINDOW_TAG = "revgate.rollback_window"  # on the evidence run: "open until T", then how the window ended
OPEN_UNTIL = "open until "


@dataclass(frozen=True, slots=True)
class ArmTally:
    """One revision's counted requests: answered, or failed by its own doing."""

    requests: int = 0
    failures: int = 0
    within_slo: int = 0

    def add(self, failed: bool, within: bool) -> ArmTally:
        """The tally with one more counted request."""
        return ArmTally(self.requests + 1, self.failures + failed, self.within_slo + within)


@dataclass(frozen=True, slots=True)
class WindowTally:
    """The promoted revision since promotion, and the old stable while both served before it."""

    promoted: ArmTally = ArmTally()
    baseline: ArmTally = ArmTally()


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """What the window saw of the promoted revision so far, and whether it fails."""

    outcome: WindowOutcome
    requests: int
    errors: int
    within_slo: int
    reason: str
    baseline_requests: int = 0
    baseline_errors: int = 0

    def evidence(self) -> dict[str, object]:
        """Plain JSON for the evidence run."""
        return {"outcome": self.outcome, "requests": self.requests, "errors": self.errors,
                "within_slo": self.within_slo, "baseline_requests": self.baseline_requests,
                "baseline_errors": self.baseline_errors, "reason": self.reason}


def _within(record: RequestRecord, check: PostPromotionCheck) -> bool:
    if record.outcome != "ok":
        return False
    ttft, e2e = record.ttft_s, record.e2e_s
    if check.ttft_ms is not None and (ttft is None or ttft * 1000 > check.ttft_ms):
        return False
    return not (check.e2e_ms is not None and (e2e is None or e2e * 1000 > check.e2e_ms))


def tally(
    before: WindowTally, records: Iterable[RequestRecord], check: PostPromotionCheck, *,
    promoted: str, old_stable: str, promoted_at_s: float,
) -> WindowTally:
    """``before`` with ``records`` folded in: the promoted revision's since ``promoted_at_s``, the old stable's
    before it (the reader starts where the rollout began)."""
    now, base = before.promoted, before.baseline
    for record in records:
        if not counted(record):
            continue
        if record.revision == promoted and record.arrival_s >= promoted_at_s:
            now = now.add(own_failure(record), _within(record, check))
        elif record.revision == old_stable and record.arrival_s < promoted_at_s:
            base = base.add(own_failure(record), _within(record, check))
    return replace(before, promoted=now, baseline=base)


def window_verdict(check: PostPromotionCheck, seen: WindowTally) -> WindowVerdict:
    """Whether the promoted revision's own failures, or its misses of the latency targets, are shown worse
    than the old stable's by more than the plan tolerates."""
    mine, base, alpha = seen.promoted, seen.baseline, float(check.alpha)
    facts = (mine.requests, mine.failures, mine.within_slo)
    extra = {"baseline_requests": base.requests, "baseline_errors": base.failures}
    if mine.requests < check.min_requests:
        return WindowVerdict("watching", *facts, f"{mine.requests} of {check.min_requests} requests counted", **extra)
    failed_low, _ = bernoulli_confidence_sequence(mine.failures, mine.requests, alpha)
    stable_high = bernoulli_confidence_sequence(base.failures, base.requests, alpha)[1] if base.requests else 0.0
    limit = stable_high + float(check.max_error_rate)
    if failed_low > limit:
        return WindowVerdict("fail", *facts, (
            f"own failures {mine.failures}/{mine.requests} (at least {failed_low:.1%}) above the old stable's "
            f"{base.failures}/{base.requests} while both served (at most {stable_high:.1%}) plus the tolerated "
            f"{float(check.max_error_rate):.1%}"), **extra)
    if check.ttft_ms is not None or check.e2e_ms is not None:
        missed_low, _ = bernoulli_confidence_sequence(mine.requests - mine.within_slo, mine.requests, alpha)
        stable_missed = (bernoulli_confidence_sequence(base.requests - base.within_slo, base.requests, alpha)[1]
                         if base.requests else 0.0)
        allowed = max(1.0 - float(check.attainment), stable_missed)
        if missed_low > allowed:
            return WindowVerdict("fail", *facts, (
                f"only {mine.within_slo}/{mine.requests} requests within the latency targets (misses at least "
                f"{missed_low:.1%}; allowed {allowed:.1%}, the old stable's at most {stable_missed:.1%})"), **extra)
    return WindowVerdict("healthy", *facts, (
        f"{mine.requests} requests, {mine.failures} own failures, {mine.within_slo} within targets; "
        f"the old stable {base.failures}/{base.requests} while both served"), **extra)
