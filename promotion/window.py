"""The rollback window's verdict: the promoted revision's live traffic against the plan's checks.

After promotion the old stable stays ready and routable; the promoted revision is watched through
the router's request records. Enough traffic with too many errors, or too few requests inside the
latency targets, rolls the route back. Pure: the flow reads the records and acts on the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from evaluation.records import RequestRecord
from manifests.rollout import PostPromotionCheck

WindowOutcome = Literal["watching", "healthy", "fail"]


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """What the window saw of the promoted revision so far, and whether it fails."""

    outcome: WindowOutcome
    requests: int
    errors: int
    within_slo: int
    reason: str

    def evidence(self) -> dict[str, object]:
        """Plain JSON for the evidence run."""
        return {"outcome": self.outcome, "requests": self.requests, "errors": self.errors,
                "within_slo": self.within_slo, "reason": self.reason}


def _within(record: RequestRecord, check: PostPromotionCheck) -> bool:
    if record.outcome != "ok":
        return False
    ttft, e2e = record.ttft_s, record.e2e_s
    if check.ttft_ms is not None and (ttft is None or ttft * 1000 > check.ttft_ms):
        return False
    return not (check.e2e_ms is not None and (e2e is None or e2e * 1000 > check.e2e_ms))


def window_verdict(check: PostPromotionCheck, records: Iterable[RequestRecord], revision: str,
                   since_s: float) -> WindowVerdict:
    """The verdict over ``revision``'s records that arrived at or after ``since_s`` (the promotion)."""
    mine = [r for r in records if r.revision == revision and r.arrival_s >= since_s]
    errors = sum(1 for r in mine if r.outcome in ("error", "timeout"))
    within = sum(1 for r in mine if _within(r, check))
    n = len(mine)
    if n < check.min_requests:
        return WindowVerdict("watching", n, errors, within, f"{n} of {check.min_requests} requests seen")
    if errors > n * float(check.max_error_rate):
        return WindowVerdict("fail", n, errors, within,
                             f"error rate {errors}/{n} above {check.max_error_rate} after promotion")
    if within < n * float(check.attainment):
        return WindowVerdict("fail", n, errors, within,
                             f"only {within}/{n} requests within the latency targets (needs {check.attainment})")
    return WindowVerdict("healthy", n, errors, within, f"{n} requests, {errors} errors, {within} within targets")
