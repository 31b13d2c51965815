"""SLO metrics from request records: latencies, quantiles over merged samples, outcome rates.

Definitions come from :class:`evaluation.records.RequestRecord` (TTFT from arrival to first
visible token; TPOT = (last - first) / (N - 1), undefined for one token; E2E to the last token).
Quantiles are computed from the merged samples of every replica, never averaged. Error, timeout,
cancellation and rejection rates are reported beside latency, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from revgate.evaluation.records import OUTCOMES, RequestRecord
from revgate.manifests.gates import ArmVolume, LatencyMetric

QUANTILES = (0.5, 0.9, 0.99)


def latency_s(record: RequestRecord, metric: LatencyMetric) -> float | None:
    """One record's TTFT, TPOT or E2E in seconds (None when undefined)."""
    if metric == "ttft":
        return record.ttft_s
    if metric == "tpot":
        return record.tpot_s
    return record.e2e_s


def latencies_ms(records: Iterable[RequestRecord], metric: LatencyMetric) -> NDArray[np.float64]:
    """The defined values of ``metric`` over successful records, in milliseconds, in record order."""
    values = [latency_s(r, metric) for r in records if r.outcome == "ok"]
    return np.array([v * 1000.0 for v in values if v is not None], dtype=float)


def admitted(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """Records the service admitted (everything but rejections)."""
    return [r for r in records if r.outcome != "rejected"]


def outcome_rates(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Share of each outcome among all attempts (None when there are no records)."""
    total = len(records)
    return {f"{name}_rate": (sum(r.outcome == name for r in records) / total if total else None) for name in OUTCOMES}


def summarize(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Counts, outcome rates and latency quantiles (ms) of one arm, from merged samples."""
    summary: dict[str, float | None] = {
        "requests": float(len(records)),
        "admitted": float(len(admitted(records))),
        **outcome_rates(records),
    }
    for metric in ("ttft", "tpot", "e2e"):
        values = latencies_ms(records, metric)
        for q in QUANTILES:
            key = f"{metric}_p{round(q * 100)}_ms"
            summary[key] = float(np.quantile(values, q)) if values.size else None
    return summary


def slice_name(record: RequestRecord, keys: Sequence[str]) -> str:
    """The slice a record belongs to under ``keys`` (``"all"`` when no keys are given)."""
    if not keys:
        return "all"
    return ",".join(f"{key}={record.slices.get(key, '?')}" for key in keys)


def in_class(record: RequestRecord, request_class: str) -> bool:
    """Whether a record belongs to an SLO request class (``"*"`` or ``"key=value"``)."""
    if request_class == "*":
        return True
    key, _, value = request_class.partition("=")
    return record.slices.get(key) == value


def volume(records: Sequence[RequestRecord]) -> ArmVolume:
    """Requests and tokens of one arm."""
    return ArmVolume(
        requests=len(records),
        admitted=len(admitted(records)),
        rejected=sum(r.outcome == "rejected" for r in records),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in records),
        output_tokens=sum(r.output_tokens or 0 for r in records),
    )
